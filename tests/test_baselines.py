"""Baseline strategies: tau tuned (LBBSPTau), eta scaled (LBBSPEta), and partial
aggregation of the fastest replies (PartialAggregation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FakeGrid, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core import SiloReport
from fl_lbbsp.runs.fl import SimulationConfig, run
from fl_lbbsp.runs.summary import slowdowns_at
from fl_lbbsp.strategies import LBBSPEta, LBBSPFedAvg, LBBSPTau, PartialAggregation

pytestmark = pytest.mark.usefixtures("flower_task")

NODES = (11, 12, 13, 14)
SETTINGS = {
    "initial_batch_size": 30,
    "local_steps": 10,
    "lr": 0.1,
    "allocator": "proportional",
    "max_change_ratio": None,
    "min_train_nodes": 4,
    "min_available_nodes": 4,
}


def _reply(node: int, *, batch_size: int, steps: int, time: float, examples: int, value: float):  # type: ignore[no-untyped-def]
    metrics = MetricRecord(
        {"num-examples": examples, "train-time": time, "batch-size": batch_size,
         "samples-processed": batch_size * steps}
    )  # fmt: skip
    content = RecordDict(
        {"arrays": ArrayRecord({"w": Array(np.full(2, value, dtype=np.float32))}),
         "metrics": metrics, "silo": ConfigRecord({"silo-id": f"s{node}"})}
    )  # fmt: skip
    return make_reply(content, node_id=node)


def _configs(strategy: LBBSPFedAvg, server_round: int = 1) -> dict[int, ConfigRecord]:
    zeros = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    messages = strategy.configure_train(server_round, zeros, ConfigRecord(), FakeGrid(list(NODES)))
    return {m.metadata.dst_node_id: m.content["config"] for m in messages}


def _with_speeds(strategy: LBBSPFedAvg, speeds: tuple[float, ...]) -> LBBSPFedAvg:
    """Teach the balancer each node's speed (samples/s) as if it had reported once."""
    for node, speed in zip(NODES, speeds, strict=True):
        strategy.balancer.report(f"node-{node}", SiloReport(batch_size=30, train_time=300 / speed))
    return strategy


# ---------------------------------------------------------------------------- LB-BSP-tau
@pytest.mark.parametrize(
    "speeds", [(1.0, 1.0, 1.0, 1.0), (8.0, 4.0, 2.0, 2.0), (5.0, 1.0, 1.0, 1.0)]
)
def test_tau_variant_gives_steps_proportional_to_the_balanced_share(speeds) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    strategy = _with_speeds(LBBSPTau(**SETTINGS), speeds)
    shares = strategy.balancer.allocate((f"node-{n}" for n in NODES), budget=False)

    # Execute
    configs = _configs(strategy)

    # Assert: every silo keeps B_init and eta; tau_i = round(tau * x_i / B_init)
    for node in NODES:
        assert configs[node]["batch-size"] == 30
        assert configs[node]["lr"] == 0.1
        assert configs[node]["local-steps"] == max(1, round(10 * shares[f"node-{node}"] / 30))
    steps = [configs[n]["local-steps"] for n in NODES]
    assert steps[0] / steps[-1] == pytest.approx(speeds[0] / speeds[-1], rel=0.1)


def test_tau_variant_feeds_the_balancer_the_equivalent_batch_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silos ran 20, 10, 5, 5 steps of 30 samples in 1 s each
    strategy = LBBSPTau(telemetry_path=tmp_path / "t.jsonl", **SETTINGS)
    _configs(strategy)
    replies = [
        _reply(node, batch_size=30, steps=steps, time=1.0, examples=100, value=1.0)
        for node, steps in zip(NODES, (20, 10, 5, 5), strict=True)
    ]

    # Execute
    strategy.aggregate_train(1, replies)
    following = _configs(strategy, 2)

    # Assert: shares 60, 30, 15, 15 samples per step-equivalent; speeds in samples/s
    assert strategy.balancer.predicted_speed("s11") == pytest.approx(600.0)
    event = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[-1])
    silo = event["silos"]["s11"]
    assert (silo["batch-size"], silo["step-batch-size"], silo["local-steps"]) == (60, 30, 20)
    assert [following[n]["local-steps"] for n in NODES] == [20, 10, 5, 5]


# ---------------------------------------------------------------------------- LB-BSP-eta
def test_eta_variant_scales_the_learning_rate_with_the_balanced_batch_size() -> None:
    # Prepare
    strategy = _with_speeds(LBBSPEta(**SETTINGS), (8.0, 4.0, 2.0, 2.0))

    # Execute
    configs = _configs(strategy)

    # Assert: B balanced 8:4:2:2 of 120, tau kept, eta_i = eta * B_i / B_init
    assert [configs[n]["batch-size"] for n in NODES] == [60, 30, 15, 15]
    for node in NODES:
        assert configs[node]["local-steps"] == 10
        assert configs[node]["lr"] == pytest.approx(0.1 * configs[node]["batch-size"] / 30)


def test_variants_without_balancing_are_fedavg() -> None:
    # Prepare
    strategies = [LBBSPTau(balance=False, **SETTINGS), LBBSPEta(balance=False, **SETTINGS)]

    # Execute
    configs = [_configs(_with_speeds(s, (8.0, 4.0, 2.0, 2.0))) for s in strategies]

    # Assert
    assert [s.scheme for s in strategies] == ["fedavg", "fedavg"]
    for config in (c for per_node in configs for c in per_node.values()):
        assert (config["batch-size"], config["local-steps"], config["lr"]) == (30, 10, 0.1)


# ------------------------------------------------------------------- partial aggregation
def _partial_round(times, values, examples, tmp_path, **kwargs):  # type: ignore[no-untyped-def]
    # FedAvg's mean: the tests compare the exact weighted mean of the replies kept
    settings = {**SETTINGS, "robust_aggregation": "mean", **kwargs}
    strategy = PartialAggregation(telemetry_path=tmp_path / "t.jsonl", **settings)
    configs = _configs(strategy)
    replies = [
        _reply(node, batch_size=30, steps=10, time=t, examples=n, value=v)
        for node, t, v, n in zip(NODES, times, values, examples, strict=True)
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    event = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[-1])
    return strategy, configs, arrays, event


def test_partial_aggregation_drops_the_slowest_reply_and_its_weight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare / Execute: node 13 is the slowest; its update (100) must not count
    strategy, configs, arrays, event = _partial_round(
        (1.0, 2.0, 9.0, 3.0), (1.0, 2.0, 100.0, 4.0), (100, 100, 500, 200), tmp_path
    )

    # Assert: (100*1 + 100*2 + 200*4) / 400; round time = the 3rd fastest
    assert strategy.scheme == "partial"
    assert {c["batch-size"] for c in configs.values()} == {30}
    assert arrays["w"].numpy() == pytest.approx(np.full(2, 2.75))
    assert event["round_time"] == 3.0
    assert sorted(event["silos"]) == ["s11", "s12", "s14"]
    assert list(event["dropped"]) == ["s13"]


@pytest.mark.parametrize("bad", [0, -1, True])
def test_partial_aggregation_refuses_a_bad_reply_count(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="replies"):
        PartialAggregation(replies=bad, **SETTINGS)


@settings(max_examples=25, deadline=None)
@given(
    times=st.lists(st.floats(0.1, 100.0), min_size=4, max_size=4, unique=True),
    k=st.integers(1, 5),
)
def test_partial_round_time_is_the_kth_fastest(times, k, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    # Prepare / Execute
    _, _, arrays, event = _partial_round(
        times, (0.0, 1.0, 2.0, 3.0), (1, 1, 1, 1), tmp_path_factory.mktemp("p"), replies=k
    )

    # Assert: the k fastest are kept (all when k >= n), and their mean is the model
    kept = sorted(range(4), key=lambda i: times[i])[: min(k, 4)]
    assert event["round_time"] == pytest.approx(sorted(times)[min(k, 4) - 1])
    assert sorted(event["silos"]) == sorted(f"s{NODES[i]}" for i in kept)
    assert arrays["w"].numpy() == pytest.approx(np.full(2, np.mean(kept)))


# ------------------------------------------------------------ through the silo ClientApp
def test_tau_variant_silos_run_the_steps_they_are_sent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 silos emulated 16:4:1 in process; their times come from a cost model,
    # so the steps they are sent do not depend on how busy this machine is
    config = SimulationConfig(
        scheme="lbbsp-tau", silos=3, speeds=(16.0, 4.0, 1.0), rounds=3, local_steps=8,
        batch_size=16, model="mlp", runtime="inprocess", emulate_wait=False, out=tmp_path,
        cost_model="0.001,0.002",
    )  # fmt: skip

    # Execute
    events = run(config)

    # Assert: every silo used B_init; its steps follow its share; work = B_init * tau_i
    last = [e for e in events if e["event"] == "train"][-1]["silos"]
    assert [last[s]["step-batch-size"] for s in "012"] == [16, 16, 16]
    steps = [last[s]["local-steps"] for s in "012"]
    assert steps[0] > steps[1] > steps[2] >= 1
    assert all(last[s]["samples-processed"] == 16 * last[s]["local-steps"] for s in "012")
    assert [last[s]["slowdown"] for s in "012"] == [1.0, 4.0, 16.0]


@pytest.mark.parametrize(
    ("schedules", "expected"),
    [
        (None, {1: [1.0, 2.0, 4.0], 5: [1.0, 2.0, 4.0]}),
        (("1:1,3:2", "1", "4:3"), {1: [1.0, 2.0, 4.0], 3: [2.0, 2.0, 4.0], 4: [2.0, 2.0, 12.0]}),
        (("2", "1", "1"), {1: [2.0, 2.0, 4.0]}),
    ],
)
def test_capacity_schedules_multiply_the_speeds_slowdown(schedules, expected) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    # (in process: no time dilation, see tests/test_wall_clock.py)
    config = SimulationConfig(
        silos=3, speeds=(4.0, 2.0, 1.0), slowdown_schedules=schedules, runtime="inprocess"
    )

    # Execute
    silo_side = config.schedules()
    report_side = config.model_dump(mode="json")

    # Assert: the silos and the report see the same factor in every round
    for server_round, factors in expected.items():
        assert [s.factor(server_round) for s in silo_side] == factors
        assert slowdowns_at(report_side, server_round) == factors
