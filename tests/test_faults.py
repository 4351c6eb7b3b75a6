"""Faults and hostile input on the server side: crashed and failing silos, too few replies,
late and duplicate replies, malformed replies, speed lies, oversized replies, and random
garbage thrown at aggregate_train (plaintext and encrypted)."""

from __future__ import annotations

import io
import json
import math
import time
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from conftest import FakeGrid, make_reply
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import SType
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy

from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.security.reply_screen import default_reply_cap
from fl_lbbsp.strategies import LBBSPCluster, LBBSPFedAvg

pytestmark = pytest.mark.usefixtures("flower_task")

NODES = (11, 12, 13)  # silos a, b, c in the hand-made rounds
SHAPES = {"w": (3,), "b": (2, 2)}  # the global model: two float32 arrays


# ------------------------------------------------------------------------ helpers
def _model(value: float = 0.0) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, dtype=np.float32) for name, shape in SHAPES.items()}


def _record(value: float = 0.0) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in _model(value).items()})


def _reply(
    node: int,
    silo: Any,
    *,
    value: float = 1.0,
    arrays: dict[str, Array] | None = None,
    batch_size: int = 32,
    train_time: Any = 1.0,
    num_examples: Any = 100,
    drop: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
) -> Message:
    """A train reply from ``node`` claiming ``silo``: arrays full of ``value`` (or
    ``arrays``) and the contract's metrics, less ``drop``, plus ``extra``."""
    metrics = {
        "num-examples": num_examples,
        "train-time": train_time,
        "batch-size": batch_size,
        "samples-processed": batch_size * 10,
        "cpu-percent": 50.0,
        "memory-percent": 10.0,
        "train-loss": 0.5,
        **(extra or {}),
    }
    for key in drop:
        del metrics[key]
    record = arrays if arrays is not None else {k: Array(v) for k, v in _model(value).items()}
    content = RecordDict(
        {
            "arrays": ArrayRecord(record),  # type: ignore[arg-type]
            "metrics": MetricRecord(metrics),
            "silo": ConfigRecord({"silo-id": silo}),
        }
    )
    return make_reply(content, node_id=node)


def _error_reply(node: int, reason: str) -> Message:
    metadata = make_reply(RecordDict(), node_id=node).metadata
    return Message(error=Error(code=0, reason=reason), metadata=metadata)


def _strategy(tmp_path, **kwargs: Any) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    settings = {
        "initial_batch_size": 32,
        "local_steps": 10,
        "lr": 0.01,
        "min_train_nodes": 3,
        "min_available_nodes": 3,
        "telemetry_path": None if tmp_path is None else tmp_path / "t.jsonl",
        **kwargs,
    }
    return LBBSPFedAvg(**settings)


def _configured(tmp_path, **kwargs: Any) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    """A strategy that has configured round 1 for nodes 11, 12, 13 (B = 32 each)."""
    strategy = _strategy(tmp_path, **kwargs)
    strategy.configure_train(1, _record(), ConfigRecord(), FakeGrid(list(NODES)))
    return strategy


def _events(tmp_path, kind: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _warnings(fl_log) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in fl_log.records if r.levelname == "WARNING"]


def _assert_average(arrays: ArrayRecord | None, values: list[float], weights: list[int]) -> None:
    """Every array of the aggregate is ``np.average(values, weights=weights)``."""
    assert arrays is not None
    expected = np.average(values, weights=weights)
    assert sorted(arrays.keys()) == sorted(SHAPES)
    for name, shape in SHAPES.items():
        assert arrays[name].numpy().dtype == np.float32
        np.testing.assert_allclose(arrays[name].numpy(), np.full(shape, expected), rtol=1e-6)


# In-process silos that compute nothing: each reports B * tau / speed as its train time
# and returns arrays full of its node_config "value"; from round "fail-from-round" on, its
# ClientApp raises.
def _silo_app() -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = context.node_config
        config = msg.content["config"]
        if 0 < int(node.get("fail-from-round", 0)) <= int(config["server-round"]):  # type: ignore[arg-type]
            raise RuntimeError("silo out of memory")
        batch, steps = int(config["batch-size"]), int(config["local-steps"])  # type: ignore[arg-type]
        value = float(node["value"])  # type: ignore[arg-type]
        arrays = {
            k: Array(np.full_like(a.numpy(), value)) for k, a in msg.content["arrays"].items()
        }
        metrics = {
            "num-examples": int(node["examples"]),  # type: ignore[arg-type]
            "train-time": batch * steps / float(node["speed"]),  # type: ignore[arg-type]
            "batch-size": batch,
            "samples-processed": batch * steps,
        }
        content = RecordDict(
            {
                "arrays": ArrayRecord(arrays),  # type: ignore[arg-type]
                "metrics": MetricRecord(metrics),
                "silo": ConfigRecord({"silo-id": str(node["silo-id"])}),
            }
        )
        return Message(content=content, reply_to=msg)

    return app


SILOS = {
    "a": {"silo-id": "a", "speed": 3000.0, "examples": 100, "value": 1.0},
    "b": {"silo-id": "b", "speed": 1500.0, "examples": 200, "value": 2.0},
    "c": {"silo-id": "c", "speed": 1000.0, "examples": 300, "value": 3.0},
}
NODE_OF = {"a": 100, "b": 101, "c": 102}  # InProcessGrid numbers its nodes from 100


def _grid(grid_class: type[InProcessGrid] = InProcessGrid, *, changes=None, **kwargs: Any):  # type: ignore[no-untyped-def]
    """An in-process grid of silos a, b, c (``changes``: silo -> node_config entries)."""
    configs = [{**config, **(changes or {}).get(silo, {})} for silo, config in SILOS.items()]
    return grid_class(_silo_app(), num_nodes=3, node_configs=configs, **kwargs)


def _run(  # type: ignore[no-untyped-def]
    strategy: LBBSPFedAvg,
    grid: InProcessGrid,
    rounds: int,
    after: Callable[[int], None] | None = None,
):
    """Run ``rounds`` rounds through start(); the model after each round (index 0: the
    initial one). ``after(r)`` runs once round r is over."""
    models: list[dict[str, np.ndarray]] = []

    def after_round(server_round: int, arrays: ArrayRecord) -> None:
        models.append({k: a.numpy() for k, a in arrays.items()})
        if after is not None:
            after(server_round)

    result = strategy.start(
        grid=grid, initial_arrays=_record(), num_rounds=rounds, evaluate_fn=after_round
    )
    return models, result


def _run_strategy(tmp_path, **kwargs: Any) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    """A strategy for in-process runs: tiny deadlines, believed speeds, fine polling."""
    settings = {
        "initial_batch_size": 30,
        "local_steps": 2,
        "estimator": "last",
        "allocator": "proportional",
        "fraction_evaluate": 0.0,
        "min_train_nodes": 2,
        "min_available_nodes": 2,
        "deadline_margin": 2.0,
        "deadline_floor": 0.05,
        "deadline_ceiling": 5.0,
        "poll_interval": 0.01,
        **kwargs,
    }
    return _strategy(tmp_path, **settings)


# -------------------------------------------------- 1. a silo killed mid-round
def test_silo_killed_mid_round_is_left_out_its_share_moves_and_it_resumes(tmp_path) -> None:
    # Prepare: silo c dies in the middle of round 2 (it gets the message, never replies
    # and drops off the grid) and is back before round 4
    grid = _grid()
    strategy = _run_strategy(tmp_path)
    estimates: list[float | None] = []

    def after(server_round: int) -> None:
        estimates.append(strategy.balancer.predicted_speed("c"))
        if server_round == 1:
            grid.crash(NODE_OF["c"])
        if server_round == 3:
            grid.reconnect(NODE_OF["c"])

    # Execute
    models, _ = _run(strategy, grid, rounds=4, after=after)

    # Assert: round 2 completes with a and b (their weighted mean); c is listed as missed
    events = _events(tmp_path, "train")
    assert [e["round"] for e in events] == [1, 2, 3, 4]
    assert events[1]["missed"] == ["c"] and sorted(events[1]["silos"]) == ["a", "b"]
    np.testing.assert_allclose(models[2]["w"], np.full(3, (1 * 100 + 2 * 200) / 300), rtol=1e-6)
    # round 3: c is gone; a and b share the whole X = 3 * 30 by speed (2:1)
    assert events[2]["sent"] == {"a": 60, "b": 30}
    # round 4: c is back with the estimate it had: the same split as in round 2
    assert sum(events[3]["sent"].values()) == 90
    assert events[3]["sent"] == events[1]["sent"]
    assert events[3]["missed"] == [] and sorted(events[3]["silos"]) == ["a", "b", "c"]
    assert estimates[1:4] == [pytest.approx(1000.0)] * 3  # kept while c was away
    lost = [t.error for t in grid.transfers if t.node_id == NODE_OF["c"]]
    assert lost == [None, "lost: crashed", None]


# ------------------------------------------------- 2. a ClientApp that raises
def test_client_app_that_raises_is_logged_and_left_out_of_sum_and_weights(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silo b's ClientApp raises in round 1
    grid = _grid(changes={"b": {"fail-from-round": 1}})
    strategy = _run_strategy(tmp_path, min_train_nodes=3)
    replies = list(
        grid.send_and_receive(strategy.configure_train(1, _record(), ConfigRecord(), grid))
    )

    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)

    # Assert: the mean of a and c weighted by their dataset sizes only
    # (two silos: an undeclared size weighs no more than the other's, so 300 counts as 100)
    _assert_average(arrays, [1.0, 3.0], [100, 100])
    assert metrics is not None
    node = NODE_OF["b"]
    assert any(
        f"round 1: reply of silo node-{node} (node {node}) rejected: error reply" in w
        and "RuntimeError: silo out of memory" in w
        for w in _warnings(fl_log)
    )
    [event] = _events(tmp_path, "rejected")
    assert event["node"] == node and "silo out of memory" in event["reason"]


# --------------------------------------------------- 3. too few valid replies
def test_too_few_valid_replies_skip_the_round_and_keep_the_model(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: all three silos are needed; c fails from round 2 on
    grid = _grid(changes={"c": {"fail-from-round": 2}})
    # (FedAvg's mean: the expected model is the exact weighted mean)
    strategy = _run_strategy(tmp_path, min_train_silos=3, robust_aggregation="mean")

    # Execute
    models, result = _run(strategy, grid, rounds=3)

    # Assert: rounds 2 and 3 leave the model of round 1 unchanged, with the reason logged
    assert float(models[1]["w"][0]) == pytest.approx((100 + 400 + 900) / 600)
    for later in models[2:]:
        for name in SHAPES:
            np.testing.assert_array_equal(later[name], models[1][name])
    assert sorted(result.train_metrics_clientapp) == [1]
    skipped = _events(tmp_path, "skipped")
    assert [e["round"] for e in skipped] == [2, 3]
    assert skipped[0]["reason"] == "2 valid replies, min_train_silos is 3"
    assert "round 2 skipped: 2 valid replies, min_train_silos is 3" in " ".join(_warnings(fl_log))


@pytest.mark.parametrize(
    ("needed", "broken", "reason"),
    [(3, 1, "2 valid replies"), (2, 2, "1 valid reply"), (1, 3, "0 valid replies")],
)
def test_aggregate_train_returns_nothing_below_min_train_silos(
    tmp_path, needed: int, broken: int, reason: str
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 replies, the first ``broken`` with a NaN train time
    strategy = _configured(tmp_path, min_train_silos=needed)
    times = [math.nan] * broken + [1.0] * (3 - broken)
    replies = [_reply(n, s, train_time=t) for n, s, t in zip(NODES, "abc", times, strict=True)]

    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)

    # Assert
    assert arrays is None and metrics is None
    event = _events(tmp_path, "train")[0]
    assert event["skipped"] == f"{reason}, min_train_silos is {needed}"
    assert len(event["rejected"]) == broken


# -------------------------------------------- 4. late, duplicate, stale replies
class _SlowReplyGrid(InProcessGrid):
    """Silo c's reply only comes back from a pull that takes ``delay`` seconds."""

    delay = 0.5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: list[Message] = []

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        got = list(super().pull_messages(message_ids))
        self._held += [m for m in got if m.metadata.src_node_id == NODE_OF["c"]]
        fast = [m for m in got if m.metadata.src_node_id != NODE_OF["c"]]
        if self._held and not fast:
            time.sleep(self.delay)
            fast, self._held = self._held, []
        return fast


def test_reply_after_the_deadline_is_dropped_with_a_reason(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a 0.2 s deadline; silo c's reply arrives after about 0.5 s
    grid = _grid(_SlowReplyGrid)
    strategy = _run_strategy(tmp_path, deadline_floor=0.1, deadline_ceiling=0.2)

    # Execute
    models, _ = _run(strategy, grid, rounds=1)

    # Assert
    [event] = _events(tmp_path, "rejected")
    assert event["silo"] == "c" and "after the round deadline of 0.2 s" in event["reason"]
    assert sorted(_events(tmp_path, "train")[0]["silos"]) == ["a", "b"]
    # (two silos: an undeclared size weighs no more than the other's, so 200 counts as 100)
    np.testing.assert_allclose(models[1]["w"], np.full(3, 1.5), rtol=1e-6)


@pytest.mark.parametrize(
    ("second", "reason"),
    [
        (_reply(11, "a", value=9.0), "a second reply from node 11"),
        (_reply(13, "a", value=9.0), "a second reply for silo a"),
    ],
    ids=["same-node", "same-silo"],
)
def test_second_reply_from_a_node_or_silo_in_one_round_is_rejected(
    tmp_path, fl_log, second: Message, reason: str
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    strategy = _configured(tmp_path)
    first = [_reply(11, "a", value=1.0), _reply(12, "b", value=3.0)]

    # Execute
    arrays, _ = strategy.aggregate_train(1, [*first, second])

    # Assert: the first replies count, the second is rejected
    _assert_average(arrays, [1.0, 3.0], [100, 100])
    [event] = _events(tmp_path, "rejected")
    assert reason in event["reason"]


def test_reply_to_another_rounds_message_is_rejected(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silo c's round-1 reply turns up again in round 2, before its real one
    grid = _grid()
    strategy = _run_strategy(tmp_path, min_train_nodes=3, robust_aggregation="mean")
    old = list(grid.send_and_receive(strategy.configure_train(1, _record(), ConfigRecord(), grid)))
    strategy.aggregate_train(1, old)
    new = list(grid.send_and_receive(strategy.configure_train(2, _record(), ConfigRecord(), grid)))
    stale = next(m for m in old if m.metadata.src_node_id == NODE_OF["c"])

    # Execute
    arrays, _ = strategy.aggregate_train(2, [stale, *new])

    # Assert: the stale one is rejected; the real one of c still counts
    [event] = _events(tmp_path, "rejected")
    assert event["round"] == 2 and "not a reply to a train message of this round" in event["reason"]
    _assert_average(arrays, [1.0, 2.0, 3.0], [100, 200, 300])


# ----------------------------------------------------- 5. reply validation
def _npy(shape: tuple[int, ...], data: bytes) -> bytes:
    """npy bytes whose header says ``shape`` (float32), followed by ``data``."""
    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def _raw(name: str, data: bytes) -> dict[str, Array]:
    """The model's arrays, ``name`` replaced by raw bytes declared as its float32 shape."""
    arrays = {k: Array(v) for k, v in _model(50.0).items()}
    arrays[name] = Array(dtype="float32", shape=SHAPES[name], stype=SType.NUMPY, data=data)
    return arrays


def _arrays(**changes: np.ndarray | None) -> dict[str, Array]:
    values: dict[str, np.ndarray | None] = {**_model(50.0), **changes}
    return {k: Array(v) for k, v in values.items() if v is not None}


def _two_array_records() -> Message:
    reply = _reply(13, "c")
    reply.content["more-arrays"] = ArrayRecord({k: Array(v) for k, v in _model().items()})
    return reply


def _no_metric_record() -> Message:
    reply = _reply(13, "c")
    del reply.content["metrics"]
    return reply


def _c(**kwargs: Any) -> Callable[[], Message]:
    """Builds silo c's reply (node 13) with these changes."""
    return lambda: _reply(13, "c", **kwargs)


EXAMPLES = "num-examples must be an integer in [1, 10000]"
LAYOUT = "the global model has float32[3]"
BAD_REPLIES: list[tuple[str, Callable[[], Message], str]] = [
    ("missing-num-examples", _c(drop=["num-examples"]), "missing metrics 'num-examples'"),
    ("missing-train-time", _c(drop=["train-time"]), "missing metrics 'train-time'"),
    ("missing-batch-size", _c(drop=["batch-size"]), "missing metrics 'batch-size'"),
    ("list-time", _c(train_time=[1.0, 2.0]), "'train-time' must be a number"),
    ("nan-time", _c(train_time=math.nan), "'train-time' must be finite"),
    ("inf-time", _c(train_time=math.inf), "'train-time' must be finite"),
    ("zero-time", _c(train_time=0.0), "train-time must be positive"),
    ("negative-time", _c(train_time=-1.0), "train-time must be positive"),
    ("other-batch-size", _c(batch_size=64), "batch-size 64 differs from the 32 sent"),
    ("zero-examples", _c(num_examples=0), EXAMPLES),
    ("negative-examples", _c(num_examples=-5), EXAMPLES),
    ("too-many-examples", _c(num_examples=10_001), EXAMPLES),
    ("fractional-examples", _c(num_examples=99.5), EXAMPLES),
    ("shape", _c(arrays=_arrays(w=np.zeros(4, np.float32))), LAYOUT),
    ("dtype", _c(arrays=_arrays(w=np.zeros(3))), LAYOUT),
    ("nan-array", _c(arrays=_arrays(b=np.full((2, 2), np.nan, np.float32))), "'b' contains NaN"),
    ("inf-array", _c(arrays=_arrays(w=np.array([0, np.inf, 0], np.float32))), "'w' contains NaN"),
    ("missing-array", _c(arrays=_arrays(b=None)), "missing arrays 'b'"),
    ("extra-array", _c(arrays=_arrays(z=np.zeros(1, np.float32))), "unexpected arrays 'z'"),
    ("huge-header", _c(arrays=_raw("w", _npy((10**12,), bytes(12)))), "has shape (1000000000000,)"),
    ("truncated", _c(arrays=_raw("w", _npy((3,), bytes(8)))), "carries 8 bytes of values"),
    ("not-npy", _c(arrays=_raw("w", b"not an array")), "is not a numpy array"),
    ("two-array-records", _two_array_records, "2 ArrayRecords in the reply, expected 1"),
    ("no-metric-record", _no_metric_record, "0 MetricRecords in the reply, expected 1"),
    ("silo-id-type", lambda: _reply(13, 2.5), "is not a valid silo id"),
]


@pytest.mark.parametrize(
    ("build", "reason"), [c[1:] for c in BAD_REPLIES], ids=[c[0] for c in BAD_REPLIES]
)
def test_malformed_reply_is_rejected_with_a_logged_reason(
    tmp_path, fl_log, build: Callable[[], Message], reason: str
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silos a and b are fine; c's reply (value 50, 350 examples) is broken
    strategy = _configured(tmp_path, max_num_examples=10_000)
    good = [
        _reply(11, "a", value=1.0, num_examples=100),
        _reply(12, "b", value=2.0, num_examples=300),
    ]

    # Execute
    arrays, metrics = strategy.aggregate_train(1, [*good, build()])

    # Assert: a and b only, in the sum and in the weights; one warning, one event
    # (two silos: an undeclared size weighs no more than the other's, so 300 counts as 100)
    _assert_average(arrays, [1.0, 2.0], [100, 100])
    assert metrics is not None
    silo = "node-13" if "silo id" in reason else "c"
    warnings = sorted({w for w in _warnings(fl_log) if "rejected" in w})
    assert len(warnings) == 1
    assert f"round 1: reply of silo {silo} (node 13) rejected: " in warnings[0]
    assert reason in warnings[0]
    [event] = _events(tmp_path, "rejected")
    assert (event["round"], event["silo"], event["node"]) == (1, silo, 13)
    assert reason in event["reason"]
    assert strategy.balancer.predicted_speed(silo) is None  # kept out of balancing
    assert sorted(_events(tmp_path, "train")[0]["silos"]) == ["a", "b"]


def test_cluster_rejects_gradients_of_another_layout(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: weights w, b; worker 13 sends a gradient for w of the wrong shape
    strategy = LBBSPCluster(
        initial_batch_size=32, lr=0.5, min_train_nodes=3, telemetry_path=tmp_path / "t.jsonl"
    )
    strategy.configure_train(1, _record(1.0), ConfigRecord(), FakeGrid(list(NODES)))
    replies = [
        _reply(11, "a", value=1.0, num_examples=32),
        _reply(12, "b", value=3.0, num_examples=32),
        _reply(13, "c", num_examples=32, arrays=_arrays(w=np.zeros((3, 1), np.float32))),
    ]

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: one SGD step with the mean gradient of a and b: 1 - 0.5 * 2
    _assert_average(arrays, [0.0], [1])
    [event] = _events(tmp_path, "rejected")
    assert event["silo"] == "c" and "the global model has float32[3]" in event["reason"]


def _evaluation(node: int, **metrics: Any) -> Message:
    return make_reply(RecordDict({"metrics": MetricRecord(metrics)}), node_id=node)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (_evaluation(13, **{"eval-acc": 0.1}), "missing metrics 'num-examples'"),
        (_evaluation(13, **{"num-examples": 0, "eval-acc": 0.1}), "num-examples must be"),
        (_evaluation(13, **{"num-examples": 600, "eval-acc": math.nan}), "'eval-acc' is not"),
        (_evaluation(13, **{"num-examples": 600, "eval-loss": 0.1}), "differ from the others'"),
    ],
    ids=["missing-weight", "zero-weight", "nan-metric", "other-keys"],
)
def test_malformed_evaluation_reply_is_left_out(
    tmp_path, fl_log, bad: Message, reason: str
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: Flower's FedAvg raises on some of these (stopping the run), averages others
    strategy = _configured(tmp_path)
    good = [
        _evaluation(11, **{"num-examples": 100, "eval-acc": 0.5}),
        _evaluation(12, **{"num-examples": 300, "eval-acc": 0.9}),
    ]

    # Execute
    metrics = strategy.aggregate_evaluate(1, [*good, bad])

    # Assert: the weighted mean of the good ones
    assert metrics is not None
    assert metrics["eval-acc"] == pytest.approx((0.5 * 100 + 0.9 * 300) / 400)
    [event] = _events(tmp_path, "rejected")
    assert event["node"] == 13 and event["reason"].startswith("evaluation: ")
    assert reason in event["reason"]


def test_cluster_step_that_overflows_is_skipped_and_leaves_the_momentum(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: finite but huge gradients (3e38) that a step of lr 10 takes beyond float32
    strategy = LBBSPCluster(
        initial_batch_size=32, lr=10.0, momentum=0.9, min_train_nodes=3,
        telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip

    def step(server_round: int, gradient: float) -> ArrayRecord | None:
        strategy.configure_train(server_round, _record(1.0), ConfigRecord(), FakeGrid(list(NODES)))
        silos = zip(NODES, "abc", strict=True)
        replies = [_reply(n, s, value=gradient, num_examples=32) for n, s in silos]
        return strategy.aggregate_train(server_round, replies)[0]

    # Execute
    first = step(1, 3e38)
    second = step(2, 0.01)

    # Assert: round 1 skipped; round 2 is a first momentum step: 1 - 10 * 0.01
    assert first is None
    [skipped] = _events(tmp_path, "skipped")
    assert skipped["round"] == 1 and "NaN or inf" in skipped["reason"]
    _assert_average(second, [0.9], [1])


# ---------------------------------------------------------- 6. a speed liar
@pytest.mark.parametrize("ratio", [1.5, 2.0])
def test_speed_lie_moves_the_batch_size_by_at_most_the_ratio_and_not_the_weight(
    tmp_path, ratio: float
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: three equally fast silos; from round 3 on silo a claims to be 100x faster
    strategy = _strategy(
        tmp_path,
        allocator="proportional",
        estimator="last",
        max_change_ratio=ratio,
        robust_aggregation="mean",  # the exact weighted mean is what is compared
    )
    grid = FakeGrid(list(NODES))
    examples, values = (100, 300, 350), (1.0, 2.0, 4.0)
    sizes: list[dict[int, int]] = []
    aggregates = []

    # Execute
    for server_round in range(1, 8):
        messages = strategy.configure_train(server_round, _record(), ConfigRecord(), grid)
        sent = {m.metadata.dst_node_id: int(m.content["config"]["batch-size"]) for m in messages}
        sizes.append(sent)
        lie = 100.0 if server_round >= 3 else 1.0
        replies = [
            _reply(node, silo, value=v, num_examples=n, batch_size=sent[node],
                   train_time=sent[node] / 32 / (lie if silo == "a" else 1.0))
            for node, silo, n, v in zip(NODES, "abc", examples, values, strict=True)
        ]  # fmt: skip
        aggregates.append(strategy.aggregate_train(server_round, replies)[0])

    # Assert: the first lie is held back as a possible spike; once a second one confirms
    # a change, the liar's batch grows by at most the ratio cubed in that round and by
    # the ratio after it (the total stays 96, the others keep their floor of B_init / 4)
    liar = [s[11] for s in sizes]
    assert all(sum(s.values()) == 96 for s in sizes)
    assert liar[:4] == [32, 32, 32, 32]
    assert 32 < liar[4] <= min(math.floor(32 * ratio**3), 96 - 2 * 8)
    for before, after in zip(liar[4:], liar[5:], strict=False):
        assert before <= after <= math.floor(before * ratio)
    # ... and its weight in the model is still its dataset size
    for arrays in aggregates:
        _assert_average(arrays, list(values), list(examples))


# ------------------------------------------------------ 7. oversized replies
@pytest.mark.parametrize("cap", [None, 100_000], ids=["automatic-cap", "max_reply_bytes"])
@pytest.mark.parametrize("where", ["array", "config"])
def test_reply_over_the_byte_cap_is_rejected_without_a_copy(
    tmp_path, fl_log, cap, where: str
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silo c's reply carries 20 MiB (as an array's bytes, or in its silo record)
    strategy = _configured(tmp_path, max_reply_bytes=cap)
    blob = bytes(20 << 20)
    if where == "array":
        big = _reply(13, "c", arrays=_raw("w", blob))
    else:
        big = _reply(13, "c")
        big.content["silo"]["padding"] = blob
    good = [_reply(11, "a", value=1.0), _reply(12, "b", value=3.0)]

    # Execute
    tracemalloc.start()
    try:
        arrays, _ = strategy.aggregate_train(1, [*good, big])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Assert: rejected for its size; nothing near its size was allocated on the way
    _assert_average(arrays, [1.0, 3.0], [100, 100])
    [event] = _events(tmp_path, "rejected")
    assert strategy.round is not None
    limit = cap if cap is not None else default_reply_cap(strategy.round.expected_bytes)
    assert f"bytes is over the {limit}-byte cap" in event["reason"]
    assert limit < len(blob)
    assert peak < 4 << 20


@pytest.mark.parametrize("cap", [None, 2 << 20], ids=["from-the-model-sent", "max_reply_bytes"])
def test_the_in_process_grid_refuses_an_oversized_reply_before_serialising_it(
    cap: int | None,
) -> None:
    # Prepare: a silo app that answers a 4 KiB model with 64 MiB (a SuperLink would refuse
    # it on the wire; serialising it in-process costs seconds and several copies)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        size = 64 << 20 if context.node_config["partition-id"] == 1 else 4096
        record = ArrayRecord({"w": Array(np.zeros(size // 4, dtype=np.float32))})
        return Message(RecordDict({"arrays": record}), reply_to=msg)

    grid = InProcessGrid(app, num_nodes=2, max_reply_bytes=cap)
    model = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(1024, dtype=np.float32))})})
    messages = [grid.create_message(model, "train", node, "1") for node in (100, 101)]

    # Execute
    replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(messages)}

    # Assert: the small reply passes; the large one is an error reply naming the limit,
    # never serialised (no bytes went over the grid's wire)
    assert replies[100].has_content()
    assert replies[101].has_error()
    assert "-byte limit of the grid" in replies[101].error.reason
    small, large = grid.transfers
    assert small.reply_bytes > 4096 and large.reply_bytes == 0
    assert large.error is not None and "limit of the grid" in large.error


# ------------------------------------------- 9. random garbage (hypothesis)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
METRIC_VALUES = st.one_of(
    FLOATS,
    st.integers(-(2**63), 2**63 - 1),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=3),
)
METRIC_KEYS = ["num-examples", "train-time", "batch-size", "samples-processed", "cpu-percent",
               "max-batch-size", "he-time", "train-loss", "junk"]  # fmt: skip


@st.composite
def _metric_faults(draw: st.DrawFn) -> tuple[list[str], dict[str, Any]]:
    """Keys to drop and entries to set in a reply's metrics (both often empty)."""
    drop = draw(st.lists(st.sampled_from(METRIC_KEYS[:4]), max_size=2, unique=True))
    changes = draw(st.dictionaries(st.sampled_from(METRIC_KEYS), METRIC_VALUES, max_size=2))
    return drop, changes


@st.composite
def _array_faults(draw: st.DrawFn) -> dict[str, Array]:
    """The reply's arrays, damaged at random (or, rarely, not: finite values)."""
    kinds = ["values", "values", "dtype", "shape", "drop", "extra", "bytes", "cut"]
    kind = draw(st.sampled_from(kinds))
    name = draw(st.sampled_from(sorted(SHAPES)))
    arrays = {k: Array(v) for k, v in _model(1.0).items()}
    if kind == "values":
        size = math.prod(SHAPES[name])
        special = st.sampled_from([math.nan, math.inf, -math.inf, 3.4e38, -3.4e38])
        values = draw(
            st.lists(st.one_of(special, st.floats(width=32)), min_size=size, max_size=size)
        )
        arrays[name] = Array(np.array(values, np.float32).reshape(SHAPES[name]))
    elif kind == "dtype":
        dtype = draw(st.sampled_from([np.float64, np.float16, np.int32, np.bool_]))
        arrays[name] = Array(np.zeros(SHAPES[name], dtype))
    elif kind == "shape":
        arrays[name] = Array(np.zeros((*SHAPES[name], draw(st.integers(1, 3))), np.float32))
    elif kind == "drop":
        del arrays[name]
    elif kind == "extra":
        arrays["extra"] = Array(np.zeros(2, np.float32))
    elif kind == "bytes":
        arrays = _raw(name, draw(st.binary(max_size=200)))
    else:
        data = arrays[name].data
        arrays = _raw(name, data[: draw(st.integers(0, len(data) - 1))])
    return arrays


@st.composite
def _garbage_reply(draw: st.DrawFn) -> tuple[Message, tuple[float, int] | None]:
    """A reply, well-formed or damaged at random, and its (value, num-examples) if it is
    well-formed (as far as it alone can tell)."""
    value = float(np.float32(draw(st.floats(-1e6, 1e6))))
    n = draw(st.integers(1, 10**6))
    node, silo = draw(st.sampled_from(list(zip(NODES, "abc", strict=True))))
    if not draw(st.booleans()):
        return _reply(node, silo, value=value, num_examples=n), (value, n)
    kind = draw(st.sampled_from(["error", "identity", "metrics", "arrays", "records"]))
    if kind == "error":
        return _error_reply(node, "boom"), None
    if kind == "records":
        return draw(st.sampled_from([_two_array_records, _no_metric_record]))(), None
    if kind == "identity":
        node = draw(st.sampled_from([*NODES, 99]))
        silo = draw(st.one_of(st.integers(0, 2), st.floats(), st.binary(max_size=3)))
        return _reply(node, silo, value=value, num_examples=n), None
    drop, changes = draw(_metric_faults()) if kind == "metrics" else ([], {})
    arrays = draw(_array_faults()) if kind == "arrays" else None
    time_ = draw(st.floats(1e-3, 1e3))
    reply = _reply(node, silo, value=value, arrays=arrays, num_examples=n, train_time=time_,
                   drop=drop, extra=changes)  # fmt: skip
    return reply, None


@st.composite
def _garbage_round(draw: st.DrawFn) -> tuple[list[Message], list[tuple[float, int]] | None]:
    """Replies to round 1, and the (value, num-examples) of each if all are well-formed
    and come from distinct nodes and silos."""
    drawn = draw(st.lists(_garbage_reply(), min_size=1, max_size=5))
    replies = [reply for reply, _ in drawn]
    clean = [c for _, c in drawn if c is not None]
    nodes = [m.metadata.src_node_id for m in replies]
    ok = len(clean) == len(drawn) and len(set(nodes)) == len(nodes)
    return replies, clean if ok else None


def _assert_finite_model(arrays: ArrayRecord | None) -> None:
    if arrays is None:
        return
    assert sorted(arrays.keys()) == sorted(SHAPES)
    for name, shape in SHAPES.items():
        values = arrays[name].numpy()
        assert values.shape == shape and values.dtype == np.float32
        assert np.isfinite(values).all()


@settings(max_examples=150, deadline=None)
@given(round_=_garbage_round())
def test_random_malformed_replies_never_crash_or_put_nan_in_the_model(
    round_: tuple[list[Message], list[tuple[float, int]] | None],
) -> None:
    # Prepare
    replies, clean = round_
    strategy = _configured(None)
    event("well-formed round" if clean else "damaged round")

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: never NaN or inf; a round of well-formed replies gives a weighted mean of
    # them (the weights capped and far updates screened out, it stays within their range)
    _assert_finite_model(arrays)
    if clean:
        assert arrays is not None
        values = [v for v, _ in clean]
        atol = 1e-6 * max(map(abs, values)) + 1e-9  # float32 rounding of the mean
        for name in SHAPES:
            got = arrays[name].numpy()
            assert (got >= min(values) - atol).all() and (got <= max(values) + atol).all()


# Encrypted: the same garbage plus damaged ciphertext records; the server cannot read the
# aggregate, so the test decrypts it with the silos' key.
@pytest.fixture(scope="module")
def he_parts():  # type: ignore[no-untyped-def]
    """The federation's keys and one valid encrypted update per silo (values 1, 2, 4)."""
    pytest.importorskip("tenseal")
    from fl_lbbsp.crypto import encrypt_update, flatten, generate_keys
    from fl_lbbsp.crypto.records import update_to_record

    keys = generate_keys()
    updates = {}
    for node, value, n in zip(NODES, (1.0, 2.0, 4.0), (100, 300, 350), strict=True):
        flat, layout = flatten(_model(value))
        update = encrypt_update(keys, flat, layout=layout)
        updates[node] = (value, n, dict(update_to_record(update).items()))
    return keys, updates


@st.composite
def _ciphertext_faults(draw: st.DrawFn, arrays: dict[str, Array], others: list[dict[str, Array]]):  # type: ignore[no-untyped-def]
    """``arrays`` (an encrypted update's record) with one entry damaged."""
    arrays = dict(arrays)
    name = draw(st.sampled_from(sorted(arrays)))
    entry = arrays[name]
    data = bytearray(entry.data)
    kind = draw(st.sampled_from(["flip", "cut", "drop", "swap", "stype"]))
    if kind == "drop":
        del arrays[name]
        return arrays
    if kind == "swap":
        donor = draw(st.sampled_from(others))
        arrays[name] = donor.get(name, entry)
        return arrays
    stype = entry.stype
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    else:
        stype = draw(st.sampled_from([SType.NUMPY, "junk"]))
    arrays[name] = Array(dtype="uint8", shape=(len(data),), stype=stype, data=bytes(data))
    return arrays


@st.composite
def _encrypted_round(
    draw: st.DrawFn, updates
) -> tuple[list[Message], list[tuple[float, int]] | None]:  # type: ignore[no-untyped-def]
    replies, clean = [], []
    for _ in range(draw(st.integers(1, 4))):
        node = draw(st.sampled_from(NODES))
        value, n, arrays = updates[node]
        silo = "abc"[NODES.index(node)]
        kind = draw(
            st.sampled_from(["good", "good", "ciphertext", "metrics", "plaintext", "garbage"])
        )
        if kind == "garbage":
            reply, _ = draw(_garbage_reply())
            replies.append(reply)
            clean.append(None)
            continue
        drop, changes = draw(_metric_faults()) if kind == "metrics" else ([], {})
        if kind == "ciphertext":
            others = [a for k, (_, _, a) in updates.items() if k != node]
            arrays = draw(_ciphertext_faults(arrays, others))
        elif kind == "plaintext":
            arrays = {k: Array(v) for k, v in _model(value).items()}
        replies.append(_reply(node, silo, arrays=arrays, num_examples=n, drop=drop, extra=changes))
        clean.append((value, n) if kind == "good" else None)
    nodes = [m.metadata.src_node_id for m in replies]
    ok = all(c is not None for c in clean) and len(set(nodes)) == len(nodes)
    return replies, [c for c in clean if c is not None] if ok else None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_malformed_encrypted_replies_never_crash_or_put_nan_in_the_model(
    he_parts, data: st.DataObject
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    from fl_lbbsp.crypto import decrypt_update
    from fl_lbbsp.crypto.records import update_from_record
    from fl_lbbsp.security.update_screen import cap_weights
    from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg

    keys, updates = he_parts
    replies, clean = data.draw(_encrypted_round(updates))
    event("well-formed round" if clean else "damaged round")
    strategy = EncryptedLBBSPFedAvg(
        public_context=keys.public(), initial_batch_size=32, local_steps=10, lr=0.01,
        min_train_nodes=3, min_available_nodes=3,
    )  # fmt: skip
    strategy.configure_train(1, _record(), ConfigRecord(), FakeGrid(list(NODES)))

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: what the silos decrypt is finite; well-formed rounds give the capped-weight
    # mean
    if arrays is not None:
        model = decrypt_update(keys, update_from_record(arrays))
        assert model.shape == (7,) and np.isfinite(model).all()
        if clean:
            # the server's weights: each size capped against the round's others
            claimed = {str(n): float(n) for _, n in clean}
            capped = cap_weights(claimed, known=claimed, declared={}, max_weight_ratio=10.0)
            weights = [capped[str(n)][0] for _, n in clean]
            expected = np.average([v for v, _ in clean], weights=weights)
            np.testing.assert_allclose(model, expected, atol=1e-6)
    else:
        assert not clean
