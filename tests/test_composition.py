"""LB-BSP inside Flower's wrappers: LBBSPFedAvg under the differential-privacy fixed-
clipping wrappers (client- and server-side), the legacy LBBSPStrategy under SecAgg+."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.common import ndarrays_to_parameters
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fl_lbbsp.clients import LocalTraining, lbbsp_train
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg, LBBSPStrategy
from fl_lbbsp.strategies.composition import inner_strategy, start_wrapped
from fl_lbbsp.telemetry import read_telemetry

KEYS = RecordKeys()
COST = "0.001,0.002"  # emulated step time of the fastest silo: exact, load-free times
SLOWDOWNS = (1.0, 2.0, 4.0)
STEP = 2.0  # every silo moves every weight by +2: an update of norm 4 on 4 weights
CLIP = 1.0
B_INIT, TAU, ROUNDS = 16, 5, 3
CLIPPING_NORM_KEY = "clipping_norm"  # Flower's key (flwr.supercore.differential_privacy)


def _silo_app(seen: list[tuple[int, dict]], *, mods: tuple = ()) -> ClientApp:  # type: ignore[type-arg]
    """Silos that move every weight by STEP, through the adapter on a cost model."""
    app = ClientApp(mods=list(mods))

    @app.train()
    @lbbsp_train(cost_model=COST, emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        partition = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        seen.append((partition, dict(msg.content["config"])))
        for _ in plan.batch_sampler(64):  # the round's batches (no compute: the cost model)
            pass
        arrays = msg.content["arrays"]
        moved = ArrayRecord({k: Array(a.numpy() + np.float32(STEP)) for k, a in arrays.items()})
        metrics = MetricRecord({KEYS.num_examples: 100 * (partition + 1)})
        return Message(RecordDict({"arrays": moved, "metrics": metrics}), reply_to=msg)

    return app


def _inner(tmp_path: Path, **kwargs) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    # No noise budget: the silos' unequal dataset sizes would keep the heavy, slow one's
    # batch up; these tests check what the wrappers pass through (the split by speed)
    return LBBSPFedAvg(
        noise_budget=None,
        initial_batch_size=B_INIT,
        local_steps=TAU,
        lr=0.1,
        fraction_evaluate=0.0,
        min_train_nodes=3,
        min_available_nodes=3,
        telemetry_path=tmp_path / "telemetry.jsonl",
        **kwargs,
    )


def _grid(app: ClientApp) -> InProcessGrid:
    return InProcessGrid(app, num_nodes=3, node_configs=[{"slowdown": k} for k in SLOWDOWNS])


def _zeros() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})


@pytest.mark.parametrize("side", ["client", "server"])
@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_dp_fixed_clipping_keeps_per_silo_batch_sizes_and_clips(
    tmp_path: Path, side: str, noise: float
) -> None:
    # Prepare: LBBSPFedAvg inside Flower's DP wrapper; silos clip with Flower's mod
    # when the wrapper expects client-side clipping
    seen: list[tuple[int, dict]] = []  # type: ignore[type-arg]
    mods = (fixedclipping_mod,) if side == "client" else ()
    grid = _grid(_silo_app(seen, mods=mods))
    inner = _inner(tmp_path)
    wrapper_class = (
        DifferentialPrivacyClientSideFixedClipping
        if side == "client"
        else DifferentialPrivacyServerSideFixedClipping
    )
    wrapper = wrapper_class(
        inner, noise_multiplier=noise, clipping_norm=CLIP, num_sampled_clients=3
    )
    np.random.seed(0)

    # Execute
    result = start_wrapped(wrapper, grid=grid, initial_arrays=_zeros(), num_rounds=ROUNDS)

    # Assert: each silo got its own batch size (round 1 all B_init, then the faster
    # the bigger, total X kept), tau and eta the same for all, every reply accepted
    sizes = {(p, c[KEYS.server_round]): c[KEYS.batch_size] for p, c in seen}
    assert [sizes[(p, 1)] for p in range(3)] == [B_INIT] * 3
    last = [sizes[(p, ROUNDS)] for p in range(3)]
    assert last[0] > last[1] > last[2] and sum(last) == 3 * B_INIT
    assert {(c[KEYS.local_steps], c[KEYS.lr]) for _, c in seen} == {(TAU, 0.1)}
    if side == "client":
        assert {c[CLIPPING_NORM_KEY] for _, c in seen} == {CLIP}
    events = [e for e in read_telemetry(tmp_path / "telemetry.jsonl") if e["event"] == "train"]
    assert [e["rejected"] for e in events] == [[]] * ROUNDS
    # Clipping: every update (norm 4) is cut to norm 1, so 3 rounds move each of the
    # 4 weights by 3 * 1/2 = 1.5 (not by 3 * STEP); noise only with a multiplier
    final = result.arrays["w"].numpy()
    if noise == 0.0:
        np.testing.assert_allclose(final, np.full(4, 1.5), rtol=1e-5)
    else:
        assert np.isfinite(final).all() and not np.allclose(final, 1.5)
    assert grid.transfers and all(t.error is None for t in grid.transfers)


@pytest.mark.parametrize("how", ["wrapper-start", "start_wrapped"])
@pytest.mark.parametrize("setting", ["checkpoint_dir", "spend_saved_time"])
def test_a_wrapped_strategy_with_checkpoints_or_extra_rounds_is_refused_in_one_line(
    tmp_path: Path, how: str, setting: str
) -> None:
    # Prepare: checkpoints would hold the aggregate before the wrapper's noise; the extra
    # rounds are LBBSPFedAvg.start's, which the wrapper's loop is not
    value = tmp_path / "ckpt" if setting == "checkpoint_dir" else True
    inner = _inner(tmp_path, **{setting: value})
    wrapper = DifferentialPrivacyServerSideFixedClipping(
        inner, noise_multiplier=1.0, clipping_norm=CLIP, num_sampled_clients=3
    )
    grid = _grid(_silo_app([]))
    start = wrapper.start if how == "wrapper-start" else lambda **kw: start_wrapped(wrapper, **kw)

    # Execute / Assert: refused before any message is sent
    with pytest.raises(ValueError, match=setting) as info:
        start(grid=grid, initial_arrays=_zeros(), num_rounds=1)
    assert "\n" not in str(info.value)
    assert grid.transfers == []


@pytest.mark.parametrize("wrapped", [object(), DifferentialPrivacyServerSideFixedClipping])
def test_start_wrapped_needs_an_lbbsp_strategy_inside(tmp_path: Path, wrapped: object) -> None:
    # Prepare: a wrapper around something that is not LBBSPFedAvg
    from flwr.serverapp.strategy import FedAvg

    strategy = (
        DifferentialPrivacyServerSideFixedClipping(
            FedAvg(), noise_multiplier=0.0, clipping_norm=CLIP, num_sampled_clients=3
        )
        if wrapped is DifferentialPrivacyServerSideFixedClipping
        else wrapped
    )

    # Execute / Assert
    with pytest.raises(TypeError, match="wraps no LBBSPFedAvg"):
        inner_strategy(strategy)  # type: ignore[arg-type]


def test_dp_accounting_is_refused_by_flower_for_lbbsp(tmp_path: Path) -> None:
    # Prepare: Flower's privacy accountant supports only FedAvg's own aggregate_train
    from types import SimpleNamespace

    from flwr.supercore.privacy_accounting import (
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )

    config = PrivacyConfig(
        target_delta=1e-5,
        population_size=3,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    )
    accountant = SimpleNamespace(config=config)  # only its config is read before refusing

    # Execute / Assert: one clear exception at construction
    with pytest.raises(ValueError, match="FedAvg.aggregate_train"):
        DifferentialPrivacyServerSideFixedClipping(
            _inner(tmp_path),
            noise_multiplier=1.0,
            clipping_norm=CLIP,
            num_sampled_clients=3,
            accountant=accountant,  # type: ignore[arg-type]
        )


class _CostModelClient(NumPyClient):
    """A legacy client whose compute time is ``B * tau / speed`` and whose update moves
    every weight to ``value``."""

    def __init__(self, silo_id: str, speed: float, num_examples: int, value: float) -> None:
        self.silo_id, self.speed = silo_id, speed
        self.num_examples, self.value = num_examples, value
        self.configs: list[dict] = []  # type: ignore[type-arg]

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        self.configs.append(dict(config))
        b, tau = int(config[KEYS.batch_size]), int(config[KEYS.local_steps])
        metrics = {
            KEYS.train_time: b * tau / self.speed,
            KEYS.batch_size: b,
            KEYS.samples_processed: b * tau,
            KEYS.silo_id: self.silo_id,
        }
        return [np.full(3, self.value, dtype=np.float32)], self.num_examples, metrics


def test_legacy_strategy_under_secagg_plus_balances_and_averages_securely(
    tmp_path: Path,
) -> None:
    # Prepare: 3 legacy clients of 4:2:1 speed behind Flower's secaggplus_mod, the
    # legacy workflow with SecAggPlusWorkflow as its fit stage
    from flwr.client.mod import secaggplus_mod
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    clients = {
        0: _CostModelClient("a", 400.0, 100, 1.0),
        1: _CostModelClient("b", 200.0, 300, 2.0),
        2: _CostModelClient("c", 100.0, 600, 4.0),
    }
    app = ClientApp(
        client_fn=lambda context: clients[int(context.node_config["partition-id"])].to_client(),
        mods=[secaggplus_mod],
    )
    grid = InProcessGrid(app, num_nodes=3)
    strategy = LBBSPStrategy(
        initial_batch_size=32,
        local_steps=10,
        lr=0.05,
        allocator="proportional",
        estimator="last",
        noise_budget=None,  # the split by speed alone (unequal dataset sizes)
        telemetry_path=tmp_path / "legacy.jsonl",
        fraction_evaluate=0.0,
        min_fit_clients=3,
        min_available_clients=3,
        initial_parameters=ndarrays_to_parameters([np.zeros(3, dtype=np.float32)]),
    )
    context = LegacyContext(
        context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=3),
        strategy=strategy,
    )
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2)
    )

    # Execute
    workflow(grid, context)

    # Assert: round 1 at B_init, then 4:2:1 of X = 96 from the clients' own reports (in
    # round 2 the slowest held by the first report's change limit sets the round's time,
    # the middle one gets what that time allows, the fastest the rest); the global model is
    # the dataset-size-weighted mean (100*1 + 300*2 + 600*4) / 1000
    sizes = [[c[KEYS.batch_size] for c in clients[i].configs] for i in range(3)]
    assert sizes == [[32, 48, 55], [32, 32, 27], [32, 16, 14]]
    final = context.state.array_records["parameters"].to_numpy_ndarrays()[0]
    np.testing.assert_allclose(final, np.full(3, 3.1), atol=1e-3)
    events = [e for e in read_telemetry(tmp_path / "legacy.jsonl") if e["event"] == "train"]
    assert len(events) == 3 and all(not e.get("rejected") for e in events)


def test_client_side_dp_sends_no_federated_evaluation_that_the_mod_would_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: federated evaluation asked for (FedAvg's default), silos behind Flower's
    # fixedclipping_mod, which fails every evaluate reply
    seen: list[tuple[int, dict]] = []  # type: ignore[type-arg]
    grid = _grid(_silo_app(seen, mods=(fixedclipping_mod,)))
    inner = LBBSPFedAvg(
        initial_batch_size=B_INIT, local_steps=TAU, lr=0.1, min_train_nodes=3,
        min_evaluate_nodes=3, min_available_nodes=3, fraction_evaluate=1.0,
    )  # fmt: skip
    wrapper = DifferentialPrivacyClientSideFixedClipping(
        inner, noise_multiplier=0.0, clipping_norm=CLIP, num_sampled_clients=3
    )

    # Execute
    start_wrapped(wrapper, grid=grid, initial_arrays=_zeros(), num_rounds=2)

    # Assert: one warning, no evaluate message sent, so no error reply
    assert inner.fraction_evaluate == 0.0
    assert any("fixedclipping_mod" in r.getMessage() for r in caplog.records)
    assert grid.transfers and all(t.error is None for t in grid.transfers)
