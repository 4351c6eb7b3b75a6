"""Round deadlines and reply polling: the policy, the grid wrapper and LBBSPFedAvg.start."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid

from fl_lbbsp.contract import EQUAL_SPLIT_TIME, WALL_CLOCK_TIME
from fl_lbbsp.core import BatchSizeBalancer, SiloReport
from fl_lbbsp.core.round.deadline import DeadlinePolicy, predicted_compute_time
from fl_lbbsp.core.round.equal_split import rounds_saved
from fl_lbbsp.core.settings import BalancingKnobs
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.deadline import DeadlineGrid

pytestmark = pytest.mark.usefixtures("flower_task")


# ------------------------------------------------------------------------- policy
def test_deadline_is_margin_times_prediction_clipped_to_floor_and_ceiling() -> None:
    # Prepare
    policy = DeadlinePolicy(margin=2.0, floor=5.0, ceiling=60.0)

    # Execute / Assert
    assert policy.timeout(10.0) == 20.0
    assert policy.timeout(1.0) == 5.0  # floor
    assert policy.timeout(100.0) == 60.0  # ceiling
    assert policy.timeout(None) == 60.0  # nothing predicted yet: the ceiling
    assert policy.timeout(100.0, cap=30.0) == 30.0  # start()'s timeout caps it
    assert DeadlinePolicy(margin=None).timeout(10.0, cap=42.0) == 42.0  # off


def test_predicted_compute_time_is_the_slowest_silo() -> None:
    # Prepare: a processes 100 samples/s, b 50 samples/s, c never reported
    balancer = BatchSizeBalancer(initial_batch_size=10, knobs=BalancingKnobs(estimator="last"))
    balancer.report("a", SiloReport(batch_size=10, train_time=1.0, samples=100))
    balancer.report("b", SiloReport(batch_size=10, train_time=2.0, samples=100))

    # Execute
    slowest = predicted_compute_time(balancer, {"a": 20, "b": 10}, local_steps=10)
    with_unknown = predicted_compute_time(balancer, {"a": 20, "b": 10, "c": 30}, 10)

    # Assert: a: 200 samples / 100 = 2 s, b: 100 / 50 = 2 s; c at their mean 75/s: 4 s
    assert slowest == pytest.approx(2.0)
    assert with_unknown == pytest.approx(300 / 75)
    assert predicted_compute_time(BatchSizeBalancer(initial_batch_size=1), {"x": 1}, 1) is None


def test_predicted_compute_time_adds_the_fixed_per_round_time() -> None:
    # Prepare: 100 samples/s plus 0.5 s of encryption per round (he-time)
    balancer = BatchSizeBalancer(initial_batch_size=10, knobs=BalancingKnobs(estimator="last"))
    balancer.report("a", SiloReport(batch_size=10, train_time=1.0, samples=100, fixed_time=0.5))

    # Execute / Assert: 20 * 10 samples at 100/s, plus 0.5 s
    assert predicted_compute_time(balancer, {"a": 20}, local_steps=10) == pytest.approx(2.5)


# ------------------------------------------------------------------- fake grid
class ScriptedGrid(Grid):
    """An in-process Grid: node ``n`` replies ``delays[n]`` s after the push (never if None).

    Train replies carry the contract's metrics: train time ``B * tau / speeds[n]``.
    """

    def __init__(self, speeds: dict[int, float], delays: dict[int, float | None]) -> None:
        self.speeds = speeds
        self.delays = delays
        self.pending: dict[str, tuple[float, Message]] = {}
        self.pulls = 0
        self.pushed: list[Message] = []
        self.own_loop_timeouts: list[float | None] = []

    def set_run(self, run) -> None:  # type: ignore[no-untyped-def]
        raise NotImplementedError

    @property
    def run(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.speeds)

    def push_messages(self, messages) -> list[str]:  # type: ignore[no-untyped-def]
        ids = []
        now = time.monotonic()
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{len(self.pushed)}-{i}"
            self.pushed.append(msg)
            delay = self.delays[msg.metadata.dst_node_id]
            if delay is not None:
                self.pending[msg.metadata.message_id] = (now + delay, self._reply(msg))
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids) -> list[Message]:  # type: ignore[no-untyped-def]
        self.pulls += 1
        now = time.monotonic()
        ready = [mid for mid in message_ids if mid in self.pending and self.pending[mid][0] <= now]
        return [self.pending.pop(mid)[1] for mid in ready]

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
        self.own_loop_timeouts.append(timeout)
        ids = set(self.push_messages(messages))
        end = time.monotonic() + (timeout or 0.0)
        replies: list[Message] = []
        while ids and time.monotonic() < end:
            got = self.pull_messages(ids)
            replies += got
            ids -= {m.metadata.reply_to_message_id for m in got}
            time.sleep(0.01)
        return replies

    def _reply(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type != MessageType.TRAIN:
            content = RecordDict({"metrics": MetricRecord({"num-examples": 10})})
            return Message(content=content, reply_to=msg)
        config = msg.content["config"]
        b, tau = int(config["batch-size"]), int(config["local-steps"])
        metrics = MetricRecord(
            {
                "num-examples": 100,
                "train-time": b * tau / self.speeds[node],
                "batch-size": b,
                "samples-processed": b * tau,
            }
        )
        content = RecordDict(
            {
                "arrays": msg.content["arrays"],
                "metrics": metrics,
                "silo": ConfigRecord({"silo-id": f"s{node}"}),
            }
        )
        return Message(content=content, reply_to=msg)


def _train_messages(nodes: list[int]) -> list[Message]:
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    config = ConfigRecord({"batch-size": 10, "local-steps": 1})
    return [
        Message(
            content=RecordDict({"arrays": arrays, "config": config}),
            message_type=MessageType.TRAIN,
            dst_node_id=node,
        )
        for node in nodes
    ]


# ------------------------------------------------------------------ DeadlineGrid
def test_deadline_grid_collects_replies_at_its_polling_interval() -> None:
    # Prepare: replies after 0.05 s and 0.25 s; poll every 0.02 s
    inner = ScriptedGrid({1: 1.0, 2: 1.0}, {1: 0.05, 2: 0.25})
    grid = DeadlineGrid(inner, timeout_fn=lambda t: 5.0, poll_interval=0.02)

    # Execute
    start = time.monotonic()
    replies = list(grid.send_and_receive(_train_messages([1, 2]), timeout=100.0))
    waited = time.monotonic() - start

    # Assert: back after the last reply and before the 5 s deadline (bounds from the
    # configured times only, so a busy machine cannot fail it)
    assert sorted(m.metadata.src_node_id for m in replies) == [1, 2]
    assert 0.25 <= waited < 5.0
    assert inner.pulls >= 5
    assert grid.last_timeout == 5.0


@pytest.mark.parametrize("nodes", [[1, 2, 3, 4, 5, 6, 7, 8], [8, 3, 5, 1, 7, 2, 6, 4]])
def test_replies_pulled_together_come_back_in_the_order_they_were_sent(
    nodes: list[int],
) -> None:
    # Prepare: every node has answered by the first pull
    inner = ScriptedGrid(dict.fromkeys(nodes, 1.0), dict.fromkeys(nodes, 0.0))
    grid = DeadlineGrid(inner, timeout_fn=lambda t: 5.0, poll_interval=0.02)

    # Execute
    replies = list(grid.send_and_receive(_train_messages(nodes)))

    # Assert: the order sent, so that a simulation adds the updates alike every run
    assert [m.metadata.src_node_id for m in replies] == nodes


def test_deadline_grid_leaves_out_replies_that_miss_the_deadline() -> None:
    # Prepare: node 2 would answer after 20 s, node 3 never; deadline 0.3 s
    inner = ScriptedGrid({1: 1.0, 2: 1.0, 3: 1.0}, {1: 0.0, 2: 20.0, 3: None})
    grid = DeadlineGrid(inner, timeout_fn=lambda t: 0.3, poll_interval=0.05)

    # Execute
    start = time.monotonic()
    replies = list(grid.send_and_receive(_train_messages([1, 2, 3])))
    waited = time.monotonic() - start

    # Assert
    assert [m.metadata.src_node_id for m in replies] == [1]
    assert 0.3 <= waited < 20.0


def test_deadline_grid_without_poll_interval_uses_the_grids_own_loop() -> None:
    # Prepare
    inner = ScriptedGrid({1: 1.0}, {1: 0.0})
    grid = DeadlineGrid(inner, timeout_fn=lambda t: 7.0, poll_interval=None)

    # Execute
    replies = list(grid.send_and_receive(_train_messages([1]), timeout=100.0))

    # Assert: the deadline, not the caller's timeout, went to the grid
    assert len(replies) == 1
    assert inner.own_loop_timeouts == [7.0]
    assert list(grid.get_node_ids()) == [1]


# ---------------------------------------------------------- LBBSPFedAvg.start
def _strategy(tmp_path, **kwargs) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    settings = {
        "initial_batch_size": 30,
        "local_steps": 10,
        "lr": 0.1,
        "allocator": "proportional",
        "estimator": "last",
        "fraction_evaluate": 0.0,
        "min_train_nodes": 2,
        "min_available_nodes": 2,
        "telemetry_path": tmp_path / "t.jsonl",
        **kwargs,
    }
    return LBBSPFedAvg(**settings)


def _train_events(tmp_path) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "train"]


def test_dead_silo_is_left_out_at_the_deadline_and_keeps_its_estimate(tmp_path) -> None:
    # Prepare: nodes 1 and 2 answer at once; node 3 dies after round 1
    speeds = {1: 3000.0, 2: 1500.0, 3: 1000.0}
    grid = ScriptedGrid(speeds, {1: 0.0, 2: 0.0, 3: 0.0})
    strategy = _strategy(tmp_path, deadline_margin=2.0, deadline_floor=0.4, deadline_ceiling=30.0)
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    estimates: list[float | None] = []

    def after_round(server_round: int, _: ArrayRecord) -> None:
        estimates.append(strategy.balancer.predicted_speed("s3"))
        if server_round == 1:
            grid.delays[3] = None  # a crash: no reply, ever

    # Execute
    start = time.monotonic()
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3, evaluate_fn=after_round)
    elapsed = time.monotonic() - start

    # Assert: round 1 waited on the ceiling but everyone answered; rounds 2-3 ended at
    # the floor (predicted compute 0.1 s x margin 2 < 0.4 s) without the dead silo
    events = _train_events(tmp_path)
    assert [e["round"] for e in events] == [1, 2, 3]
    assert events[0]["deadline"] == 30.0
    assert events[0]["missed"] == []
    for event in events[1:]:
        assert event["deadline"] == pytest.approx(0.4)
        assert event["missed"] == ["s3"]
        assert event["sent"]["s3"] == 16  # still sent work, from its kept estimate
        assert sorted(event["silos"]) == ["s1", "s2"]
        assert 0.4 <= event["wall_time"] < 30.0  # at the floor, not the 30 s ceiling
    assert elapsed < 30.0
    assert estimates[1] == estimates[2] == estimates[3] == pytest.approx(1000.0)
    sent_to_dead = [m for m in grid.pushed if m.metadata.dst_node_id == 3]
    assert [m.content["config"]["batch-size"] for m in sent_to_dead] == [30, 16, 16]


def test_deadline_follows_the_predicted_round_time(tmp_path) -> None:
    # Prepare: slow silos (200 samples/s): round 2 predicted at 1.5 s of compute
    grid = ScriptedGrid({1: 200.0, 2: 200.0}, {1: 0.0, 2: 0.0})
    strategy = _strategy(tmp_path, deadline_margin=3.0, deadline_floor=1.0)
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})

    # Execute
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=2, timeout=100.0)

    # Assert: round 1 has the ceiling capped by start's timeout; round 2 is
    # margin x (30 * 10 / 200 s compute + observed overhead)
    events = _train_events(tmp_path)
    assert events[0]["deadline"] == 100.0
    overhead = events[0]["wall_time"] - events[0]["round_time"]
    assert events[1]["deadline"] == pytest.approx(3.0 * (1.5 + max(overhead, 0.0)), abs=1e-6)


def test_start_without_deadlines_passes_the_timeout_through(tmp_path) -> None:
    # Prepare
    grid = ScriptedGrid({1: 100.0, 2: 100.0}, {1: 0.0, 2: 0.0})
    strategy = _strategy(tmp_path, deadline_margin=None, poll_interval=None)
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})

    # Execute
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=2, timeout=12.5)

    # Assert: Flower's own loop, with start()'s timeout, for train and evaluate
    assert grid.own_loop_timeouts == [12.5, 12.5, 12.5, 12.5]


def test_the_run_reports_what_the_equal_split_would_have_needed(tmp_path) -> None:
    # Prepare: node 1 three times as fast as node 2, both answering at once
    grid = ScriptedGrid({1: 3000.0, 2: 1000.0}, {1: 0.0, 2: 0.0})
    strategy = _strategy(tmp_path, clock=lambda: 0.0)  # no wall time passes
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})

    # Execute
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

    # Assert: the last round's train metrics hold the rounds' time and the equal split's
    # predicted time, which is longer (the balanced split's compute is shorter). The
    # scripted silos answer at no wall time (times emulated, not waited out), so each round took
    # its slowest silo's reported time: 0.3 s at 30/30, then 0.15 s at 45/15; the equal
    # split 0.3 s every round
    last = result.train_metrics_clientapp[max(result.train_metrics_clientapp)]
    assert [e["wall_time"] for e in _train_events(tmp_path)] == [0.0, 0.0, 0.0]
    assert last[WALL_CLOCK_TIME] == pytest.approx(0.3 + 0.15 + 0.15)
    assert last[EQUAL_SPLIT_TIME] == pytest.approx(0.9)


# ------------------------------------------------------- spending the time saved
class TimedGrid(ScriptedGrid):
    """A ScriptedGrid on a virtual clock (:meth:`clock`, the strategy's): a train round
    takes 0.1 s plus its slowest silo's train time; every reply is there at once."""

    def __init__(self, speeds: dict[int, float]) -> None:
        super().__init__(speeds, dict.fromkeys(speeds, 0.0))
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def push_messages(self, messages) -> list[str]:  # type: ignore[no-untyped-def]
        messages = list(messages)
        times = [
            int(m.content["config"]["batch-size"])
            * int(m.content["config"]["local-steps"])
            / self.speeds[m.metadata.dst_node_id]
            for m in messages
            if m.metadata.message_type == MessageType.TRAIN
        ]
        self.now += 0.1 + max(times) if times else 0.0
        return super().push_messages(messages)


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        ([], (0, 0.0, None)),  # no round timed: the equal split's time is unknown
        ([(8.0, {"a": 30, "b": 30})] * 2, (0, 0.0, 16.0)),  # the equal split: no saving
        ([(10.0, {"a": 40, "b": 20})], (0, 2.0, 12.0)),  # 2 s saved on rounds of 10 s
        ([(3.75, {"a": 40, "b": 20})] * 3, (2, 6.0, 17.25)),  # 1.6 rounds: 2 (0.4 over)
        ([(1.9, {"a": 40, "b": 20})] * 4, (4, 8.0, 15.6)),  # 4.2 rounds: 4
    ],
    ids=["unknown", "no-saving", "under-half-a-round", "1.6-rounds", "4.2-rounds"],
)
def test_the_rounds_the_saving_buys_never_overshoot_by_over_half_a_round(
    rounds: list[tuple[float, dict[str, int]]], expected: tuple[int, float, float | None]
) -> None:
    # Prepare: a does 1 s per 10 samples, b 1 s per 5 samples plus 2 s: a round sent 40 / 20
    # computes max(4, 6) = 6 s, the equal split's 30 / 30 max(3, 8) = 8 s, 2 s saved
    lines = {"a": (0.1, 0.0), "b": (0.2, 2.0)}

    # Execute
    more, saved, equal = rounds_saved(rounds, lines.get)

    # Assert: floor(saved / mean round + 1/2)
    assert more == expected[0]
    assert saved == pytest.approx(expected[1])
    assert equal == (None if expected[2] is None else pytest.approx(expected[2]))


def _timed_run(tmp_path, speeds: dict[int, float], **settings):  # type: ignore[no-untyped-def]
    """5 rounds on a TimedGrid: the Result and the rounds evaluate_fn saw."""
    grid = TimedGrid(speeds)
    strategy = _strategy(tmp_path, clock=grid.clock, **settings)
    seen: list[int] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        seen.append(server_round)
        return MetricRecord({"round": server_round})

    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=5, evaluate_fn=evaluate)
    return result, seen


def test_the_configured_rounds_run_alone_by_default(tmp_path) -> None:
    # Prepare: node 1 three times as fast as node 2: LB-BSP saves time on the equal split
    speeds = {1: 3000.0, 2: 1000.0}

    # Execute
    result, seen = _timed_run(tmp_path, speeds)

    # Assert: exactly num_rounds
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4, 5]
    assert seen == [0, 1, 2, 3, 4, 5]


def test_the_time_saved_is_spent_on_more_rounds_numbered_on(tmp_path, fl_log) -> None:
    # Prepare: round 1 at the equal split takes 0.1 + 300 / 1000 s; rounds 2-5 balanced
    # (45 / 15) take 0.1 + 0.15 s, 0.15 s less than the equal split's: 0.6 s saved on
    # 1.4 s, rounds of 0.28 s on average: 2.1 rounds
    fl_log.set_level(logging.INFO, logger="fl_lbbsp")
    speeds = {1: 3000.0, 2: 1000.0}

    # Execute
    result, seen = _timed_run(tmp_path, speeds, spend_saved_time=True)

    # Assert: 2 more rounds, in the Result, evaluate_fn and the telemetry as rounds 6, 7
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4, 5, 6, 7]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert seen == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [e["round"] for e in _train_events(tmp_path)] == [1, 2, 3, 4, 5, 6, 7]
    said = {id(r): r.getMessage() for r in fl_log.records}.values()
    lines = [line for line in said if "more rounds" in line]
    assert len(lines) == 1 and "the 0.6 s saved on 2 more rounds" in lines[0]
    assert "for the 5 rounds run: 2.0 s" in lines[0]


def test_no_extra_round_without_a_saving(tmp_path, fl_log) -> None:
    # Prepare: equal silos: the balanced split is the equal split
    fl_log.set_level(logging.INFO, logger="fl_lbbsp")

    # Execute
    result, seen = _timed_run(tmp_path, {1: 1000.0, 2: 1000.0}, spend_saved_time=True)

    # Assert
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4, 5]
    assert seen == [0, 1, 2, 3, 4, 5]
    assert any("no extra round" in r.getMessage() for r in fl_log.records)


def test_extra_rounds_are_checkpointed_and_a_run_resumed_after_them_adds_none(
    tmp_path, fl_log
) -> None:
    # Prepare: a run that spent its saving on rounds 6 and 7, checkpointing every round
    fl_log.set_level(logging.INFO, logger="fl_lbbsp")
    speeds = {1: 3000.0, 2: 1000.0}
    settings = {"spend_saved_time": True, "checkpoint_dir": tmp_path / "ckpt"}
    _timed_run(tmp_path, speeds, **settings)
    written = sorted(p.name for p in (tmp_path / "ckpt").glob("round-*.ckpt"))

    # Execute: the same run again resumes from round 7, after its 5 configured rounds
    result, seen = _timed_run(tmp_path, speeds, **settings)

    # Assert: rounds 6 and 7 were checkpointed; the rerun times no round, so it cannot
    # know the equal split's time and runs none, and says so
    assert written[-1] == "round-000007.ckpt"
    assert result.train_metrics_clientapp == {} and seen == []
    assert any("equal split's time is unknown" in r.getMessage() for r in fl_log.records)
