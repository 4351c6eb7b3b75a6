"""Measured times on a pool of fewer actors than silos (issue 38): the claim check observes
each reply's own compute interval, not the wall time since the send (which, on Flower's
Simulation Engine with one Ray actor, holds the silos queued before it), and a queued
round is named once with the fix. Injected times: no clock, no Ray."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from hypothesis import given
from hypothesis import strategies as st

from fl_lbbsp.strategies.intervals import max_overlap, observed_time, queued

B_INIT, TAU = 32, 5


# ------------------------------------------------------------------ the functions
@pytest.mark.parametrize(
    ("metrics", "wall", "expected"),
    [
        ({"compute-start": 10.0, "compute-end": 11.5}, 4.0, 1.5),  # queued: the interval
        ({"compute-start": 10.0, "compute-end": 19.0}, 4.0, 4.0),  # longer than the wait
        ({}, 4.0, 4.0),  # no interval: the wall time
        ({"compute-start": 10.0, "compute-end": 9.0}, 4.0, 4.0),  # ends before it starts
        ({"compute-start": 10.0, "compute-end": float("nan")}, 4.0, 4.0),
        ({"compute-start": 10.0, "compute-end": 12.0}, None, 2.0),
        ({}, None, None),
    ],
    ids=["interval", "capped-by-wall", "none", "reversed", "nan", "no-wall", "neither"],
)
def test_the_observed_time_is_the_replys_own_interval_within_the_wait(
    metrics: dict[str, float], wall: float | None, expected: float | None
) -> None:
    # Execute
    observed = observed_time(metrics, wall)

    # Assert
    assert observed == expected


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([(0.0, 1.0), (1.0, 2.0), (2.0, 4.0)], 1),  # one actor: one after the other
        ([(0.0, 1.0), (0.0, 1.0), (1.0, 2.0)], 2),  # two actors, three silos
        ([(0.0, 1.0), (0.1, 2.0), (0.0, 4.0)], None),  # side by side
        ([(0.0, 1.0), (1.0, 1.2)], None),  # a small lag is no queue (span 1.2 < 1.5)
        ([(0.0, 1.0)], None),
        # 50 ms computes between ClientApp start-ups seconds apart: the gaps make the round
        ([(0.0, 0.05), (2.0, 2.05), (5.0, 5.05)], None),
        ([(0.0, 1.0), (1.5, 2.5), (3.0, 4.0)], 1),  # one actor, half-second hand-overs
    ],
    ids=[
        "one-actor",
        "two-actors",
        "side-by-side",
        "small-lag",
        "one-silo",
        "start-ups",
        "hand-overs",
    ],  # fmt: skip
)
def test_a_queued_round_is_told_from_its_intervals(
    intervals: list[tuple[float, float]], expected: int | None
) -> None:
    # Execute / Assert
    assert queued(intervals) == expected


@given(
    st.lists(
        st.tuples(st.floats(0, 100), st.floats(0, 10)).map(lambda p: (p[0], p[0] + p[1])),
        min_size=1,
        max_size=12,
    )
)
def test_the_overlap_is_between_one_and_all(intervals: list[tuple[float, float]]) -> None:
    # Execute
    most = max_overlap(intervals)

    # Assert: within bounds, and every silo when they all share one moment
    assert 1 <= most <= len(intervals)
    start, end = max(s for s, _ in intervals), min(e for _, e in intervals)
    if start < end:
        assert most == len(intervals)


# ------------------------------------------------------------- the strategy
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _QueuedGrid(Grid):
    """Three silos claiming 1 s each. In ``parallel`` rounds each starts ``startup`` s after
    the push (its ClientApp's start-up) and they reply together (after 1.1 s by default);
    otherwise one actor runs them one after the other, replies coming 1.1, 2.1 and 3.1 s
    after the push. Each reply reports its own interval when ``intervals``."""

    def __init__(self, clock: _Clock, *, intervals: bool, startup: float = 0.05) -> None:
        self.clock, self.intervals, self.startup = clock, intervals, startup
        self.parallel = True
        self.queue: list[tuple[float, Message]] = []

    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return [1, 2, 3]

    def get_nodes(self) -> Any:
        raise NotImplementedError

    def send_and_receive(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        pushed = self.clock.now
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{i}"
            node = msg.metadata.dst_node_id
            b = int(msg.content["config"]["batch-size"])
            start = pushed + (self.startup if self.parallel else node - 1.0)
            values: dict[str, int | float | list[int] | list[float]] = {
                "num-examples": 100,
                "train-time": 1.0,
                "batch-size": b,
                "samples-processed": b * TAU,
            }
            if self.intervals:
                values.update({"compute-start": start, "compute-end": start + 1.0})
            content = RecordDict(
                {
                    "arrays": msg.content["arrays"],
                    "metrics": MetricRecord(values),
                    "silo": ConfigRecord({"silo-id": f"s{node}"}),
                }
            )
            self.queue.append((start + 1.05, Message(content, reply_to=msg)))
            ids.append(f"m{i}")
        self.queue.sort(key=lambda pair: pair[0])
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        if not self.queue:
            return []
        at, reply = self.queue.pop(0)
        self.clock.now = at
        return [reply]


def _run(
    grid: _QueuedGrid,
    clock: _Clock,
    rounds: int,
    *,
    check_times: bool = True,
    queue_from: int = 3,
    deadlines: list[float | None] | None = None,
) -> list[float]:
    """Each round's train-time of silo s3, the round run through the strategy (queued
    from round ``queue_from``; each round's deadline appended to ``deadlines``)."""
    from fl_lbbsp.strategies import LBBSPFedAvg

    strategy = LBBSPFedAvg(
        initial_batch_size=B_INIT,
        local_steps=TAU,
        lr=0.1,
        fraction_evaluate=0.0,
        check_times=check_times,
        clock=clock,
    )
    deadline = strategy.deadline_grid(grid, timeout=60)
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    times = []
    for server_round in range(1, rounds + 1):
        grid.parallel = server_round < queue_from
        sent = list(strategy.configure_train(server_round, arrays, ConfigRecord(), deadline))
        strategy.aggregate_train(server_round, list(deadline.send_and_receive(sent)))
        assert strategy.round is not None
        if deadlines is not None:
            deadlines.append(strategy.round.deadline)
        times.append(float(strategy.round.reports["s3"]["train-time"]))
    return times


def _queue_warnings(fl_log: pytest.LogCaptureFixture) -> list[str]:
    """The queue warnings logged at WARNING, each record once (the handler may see it on
    our logger and on the root)."""
    records = {id(r): r for r in fl_log.records if "computed at a time" in r.getMessage()}
    return [r.getMessage() for r in records.values() if r.levelno == logging.WARNING]


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize(("intervals", "replaced"), [(True, False), (False, True)])
def test_an_honest_claim_queued_behind_others_is_believed(
    intervals: bool, replaced: bool, fl_log: pytest.LogCaptureFixture
) -> None:
    # Prepare: rounds 1 and 2 side by side (round 1 cold; the overhead learned in round 2:
    # 0.05 s), rounds 3 and 4 queued
    # behind one actor: the last silo's reply comes 3.1 s after the push for 1 s claimed
    clock = _Clock()
    grid = _QueuedGrid(clock, intervals=intervals)

    # Execute
    times = _run(grid, clock, rounds=4)

    # Assert: with the intervals the claim stands in every round (without, the wait
    # since the send replaces it in round 3), and the queue is named once, with the fix
    assert times[:2] == [1.0, 1.0]
    assert (times[2] != 1.0) is replaced
    if not replaced:
        assert times == [1.0] * 4
    warned = _queue_warnings(fl_log)
    assert len(warned) == (1 if intervals else 0)
    if intervals:
        assert "at most 1 of the 3 silos" in warned[0]
        assert "backend.client-resources.num-cpus" in warned[0]
        assert "num-supernodes" in warned[0]


@pytest.mark.usefixtures("flower_task")
def test_silos_queued_where_wall_time_is_not_theirs_give_no_warning(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: the queued rounds of the test above, the wall times not the silos' (as on
    # an in-process grid, whose silos run in turn by design, or with a cost model)
    clock = _Clock()
    grid = _QueuedGrid(clock, intervals=True)

    # Execute
    _run(grid, clock, rounds=4, check_times=False)

    # Assert: no advice to size a Ray pool there is none of
    assert not [r for r in fl_log.records if "computed at a time" in r.getMessage()]


@pytest.mark.usefixtures("flower_task")
def test_a_clientapp_that_starts_slowly_is_not_cut_off_by_a_deadline_of_its_compute() -> None:
    # Prepare: every silo's ClientApp takes 35 s to start (torch imported, data loaded),
    # then computes its claimed 1 s and reports that interval; replies 36.05 s after the
    # push, every round
    clock = _Clock()
    grid = _QueuedGrid(clock, intervals=True, startup=35.0)
    deadlines: list[float | None] = []

    # Execute
    _run(grid, clock, rounds=5, queue_from=99, deadlines=deadlines)

    # Assert: every deadline leaves the replies in time (3x their 36.05 s, held to the run's
    # 60 s timeout; it was 3x the 1 s compute, raised to the 30 s floor, from round 3 on)
    assert deadlines == [60.0] * 5


@pytest.mark.usefixtures("flower_task")
def test_a_first_round_whose_silos_start_apart_is_no_queue(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: the silos run one after the other from round 1 on: in round 1 that is their
    # ClientApps' start-up skew, from round 2 on a pool too small
    clock = _Clock()
    grid = _QueuedGrid(clock, intervals=True)

    # Execute
    _run(grid, clock, rounds=2, queue_from=1)

    # Assert: the warning comes with the first warm round, not the cold one
    warned = _queue_warnings(fl_log)
    assert len(warned) == 1 and warned[0].startswith("round 2:")
