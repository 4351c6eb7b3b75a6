"""Transfer-aware allocation (issue 40) with injected times (no clock, no network): the
server learns each silo's per-round transfer time from observed minus claimed time, and
the allocation treats it as a fixed per-round cost: a slow link moves the split, a one-off
delay does not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fl_lbbsp.contract import TRANSFER_TIME, WAITED_TIME, RecordKeys
from fl_lbbsp.core.round.engine import RoundEngine
from fl_lbbsp.core.round.equal_split import equal_split_time
from fl_lbbsp.core.round.state import Verdict
from fl_lbbsp.core.settings import ReplyLimits, balancing_config
from fl_lbbsp.core.silo.transfer import TransferTimes
from fl_lbbsp.security.guard import guard

KEYS = RecordKeys()
B_INIT, TAU = 32, 5
COST = 0.001  # seconds per sample of every silo (equal compute)
MESSAGING = 0.01  # seconds every silo's reply spends in messaging
LINK = 0.06  # extra seconds a round of the slow link's silo spends transferring (within the
# claim check's tolerance: a longer one cannot be told from a time lie, see below)
ROUNDS = 10


def _engine() -> RoundEngine:
    engine = RoundEngine(
        config=balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
    )
    guard(engine)
    return engine


def _metrics(size: int, seconds: float) -> dict[str, Any]:
    return {
        KEYS.num_examples: 100,
        KEYS.train_time: seconds,
        KEYS.batch_size: size,
        KEYS.samples_processed: size * TAU,
    }


def _federation(
    links: Mapping[int, float],
    *,
    delays: Mapping[tuple[int, int], float] | None = None,
    interval: bool = False,
    queued: bool = False,
) -> tuple[list[dict[int, int]], list[float], list[dict[str, Any]]]:
    """Three silos of equal compute; silo i's reply spends ``links[i]`` more seconds in
    transfer, and ``delays[(round, i)]`` more once. With ``interval`` the claim check
    observes each reply's own compute interval and the server's wait comes as ``waited``
    (as the strategy reports a deployment's replies); with ``queued`` every round is marked
    as one whose silos queued. Returns the batch sizes of every round, the true round times
    (compute plus transfer, the slowest silo) and the records."""
    engine = _engine()
    sizes, times, records = [], [], []
    delays = delays or {}
    for server_round in range(1, ROUNDS + 1):
        state = engine.plan(server_round, range(3))
        finish = {}
        for node, instruction in state.instructions.items():
            size = instruction.batch_size
            compute = size * TAU * COST
            transfer = MESSAGING + links.get(int(node), 0.0)
            finish[node] = compute + transfer
            waited = finish[node] + delays.get((server_round, int(node)), 0.0)
            verdict = Verdict(node=node, silo=f"silo-{node}")
            if interval:
                engine.report(
                    state, verdict, _metrics(size, compute), observed=compute, waited=waited
                )
            else:
                engine.report(state, verdict, _metrics(size, compute), observed=waited)
        state.queued = queued
        engine.close(state, replied=list(finish), wall=max(finish.values()))
        sizes.append({int(n): i.batch_size for n, i in state.instructions.items()})
        times.append(max(finish.values()))
        records.append(dict(state.reports))
    return sizes, times, records


# ----------------------------------------------------------------- the estimate
def test_the_estimate_is_the_lower_quartile_of_the_window() -> None:
    # Prepare
    transfer = TransferTimes(window=8)

    # Execute: 8 gaps, then a 9th that pushes the first out
    for gap in (5.0, 1.0, 4.0, 2.0, 8.0, 3.0, 7.0, 6.0, 9.0):
        transfer.observe({"a": gap})

    # Assert: window 1..9 without 5 -> sorted 1,2,3,4,6,7,8,9, element (8 - 1) // 4 = 1
    assert transfer.estimate("a") == 2.0
    assert transfer.estimate("unseen") is None


def test_excess_is_beyond_the_smallest_silos_and_skips_unknown_silos() -> None:
    # Prepare: steady gaps, and c's only ever NaN
    transfer = TransferTimes(min_gaps=2)
    for _ in range(2):
        transfer.observe({"a": 1.5, "b": 4.0, "c": float("nan"), "d": -0.5})

    # Execute
    excess = transfer.excess(["a", "b", "c", "d", "e"])

    # Assert: a negative gap counts as 0 and d's 0 is what all pay; a is the typical silo
    # (the median upper quartile), b beyond it pays its whole 4 s; NaN and unseen skipped
    assert excess == {"a": 0.0, "b": 4.0, "d": 0.0}


def test_a_difference_within_the_jitter_is_no_cost_and_one_beyond_counts_whole() -> None:
    # Prepare: a and b jitter over 2 s, b 1 s later; c 5 s later than a (quartiles of 4
    # gaps: sorted[0] and sorted[2])
    transfer = TransferTimes()
    for jitter in (0.0, 0.5, 1.5, 2.0):
        transfer.observe({"a": 1.0 + jitter, "b": 2.0 + jitter, "c": 6.0 + jitter})

    # Execute
    excess = transfer.excess(["a", "b", "c"])

    # Assert: the typical upper quartile is b's 3.5: b's lower quartile 2 is within it (no
    # cost); c's 6 lies beyond it and pays its whole 5 s above a's shared level 1
    assert excess == {"a": 0.0, "b": 0.0, "c": pytest.approx(5.0)}


def test_too_few_gaps_give_no_estimate() -> None:
    transfer = TransferTimes(min_gaps=4)
    for _ in range(3):
        transfer.observe({"a": 1.0})
    assert transfer.estimate("a") is None
    assert transfer.excess(["a"]) == {}


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"window": 0}, "window"), ({"window": -1}, "window"), ({"window": 2.5}, "window"),
     ({"window": True}, "window"), ({"min_gaps": 0}, "min_gaps"),
     ({"window": 4, "min_gaps": 5}, "more than the window")],
)  # fmt: skip
def test_bad_window_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransferTimes(**settings)


@given(
    gap=st.floats(min_value=0.0, max_value=100.0),
    delay=st.floats(min_value=0.0, max_value=1e6),
    before=st.integers(min_value=3, max_value=7),
    after=st.integers(min_value=0, max_value=7),
)
def test_a_one_off_delay_does_not_move_the_estimate(
    gap: float, delay: float, before: int, after: int
) -> None:
    # Prepare: a silo with a steady gap
    transfer = TransferTimes(window=8)

    # Execute: one delayed round among steady ones
    for _ in range(before):
        transfer.observe({"a": gap})
    transfer.observe({"a": gap + delay})
    for _ in range(after):
        transfer.observe({"a": gap})

    # Assert
    assert transfer.estimate("a") == gap


# ------------------------------------------------------------------ the allocation
def test_a_slow_link_moves_the_split() -> None:
    # Prepare: the same federation without and with silo 2 behind a slow link
    equal, _, _ = _federation({})

    # Execute
    sizes, times, records = _federation({2: LINK})

    # Assert: without a link the split stays equal; with it, silo 2 gets a smaller batch
    # than the others and the round is shorter than the equal split's
    assert equal[-1][0] == equal[-1][1] == equal[-1][2]
    last = sizes[-1]
    assert last[2] < min(last[0], last[1])
    assert sum(last.values()) == 3 * B_INIT
    equal_round = B_INIT * TAU * COST + MESSAGING + LINK
    assert times[-1] < 0.9 * equal_round
    assert records[-1]["silo-2"][TRANSFER_TIME] == pytest.approx(LINK)
    assert records[-1]["silo-0"][TRANSFER_TIME] == 0.0


@pytest.mark.parametrize("delayed_round", range(2, ROUNDS + 1))
def test_a_one_off_delay_does_not_move_the_split(delayed_round: int) -> None:
    # Prepare: the slow-link federation of a deployment (the wait beside each reply's
    # compute interval), steady
    steady, _, _ = _federation({2: LINK}, interval=True)

    # Execute: the same, silo 0's reply delayed 30 s once
    delayed, _, records = _federation({2: LINK}, delays={(delayed_round, 0): 30.0}, interval=True)

    # Assert: every round's split is the same as without the delay
    assert delayed == steady
    assert records[delayed_round - 1]["silo-0"][WAITED_TIME] > 30.0


def test_a_one_off_delay_in_the_observed_time_does_not_move_the_split() -> None:
    # Prepare: the slow-link federation where the claim check observes the whole wait
    # (a simulation's replies), steady
    steady, _, _ = _federation({2: LINK})

    # Execute: the same, silo 0's reply delayed 30 s once, in round 8, when every silo has
    # reported twice at its batch size (the first report at a new batch size has no level
    # to be judged against yet, so a delay there, taken for the silo's time, moves the
    # next round's split: a limit of the silo model, not of the transfer estimate)
    delayed, _, records = _federation({2: LINK}, delays={(8, 0): 30.0})

    # Assert: every round's split is the same as without the delay
    assert delayed == steady
    assert records[7]["silo-0"]["observed-time"] > 30.0


def test_a_link_the_claim_check_never_sees_still_moves_the_split() -> None:
    # Prepare: a deployment's replies: the claim check observes each reply's compute
    # interval, the server's wait holds a slow link 50 times the round's compute
    slow = 50 * B_INIT * TAU * COST

    # Execute
    sizes, times, records = _federation({2: slow}, interval=True)

    # Assert: silo 2's claims stand (no lie), its link is learned from the wait, and it
    # gets the smallest batch the bounds allow while the others share the rest
    assert all("claimed-train-time" not in r["silo-2"] for r in records)
    assert records[-1]["silo-2"][TRANSFER_TIME] == pytest.approx(slow)
    last = sizes[-1]
    assert last[2] < min(last[0], last[1])
    assert sum(last.values()) == 3 * B_INIT


def test_a_round_whose_silos_queued_teaches_no_transfer() -> None:
    # Prepare / Execute: the slow link's federation, every round's silos queued
    sizes, _, records = _federation({2: LINK}, interval=True, queued=True)

    # Assert: the waits held the queue, so no transfer is learned and the split stays
    assert TRANSFER_TIME not in records[-1]["silo-2"]
    assert sizes[-1][0] == sizes[-1][1] == sizes[-1][2]


# ------------------------------------------------------- what the equal split would cost
def test_the_equal_split_time_swaps_each_rounds_compute_for_the_equal_splits() -> None:
    # Prepare: silo a does 1 s per 10 samples, b 1 s per 5 samples plus 2 s of transfer
    lines = {"a": (0.1, 0.0), "b": (0.2, 2.0)}
    rounds = [
        (12.0, {"a": 40, "b": 20}),  # sent: max(4, 6) = 6 s; equal 30/30: max(3, 8) = 8 s
        (7.0, {"a": 30, "b": 30}),  # the equal split itself: as it was
        (5.0, {"a": 30, "unknown": 30}),  # a silo without a line: as it was
    ]

    # Execute
    predicted = equal_split_time(rounds, lines.get)

    # Assert: 12 - 6 + 8, then 7 and 5 unchanged
    assert predicted == pytest.approx(14.0 + 7.0 + 5.0)
    assert equal_split_time([], lines.get) is None


@given(
    walls=st.lists(st.floats(min_value=0.0, max_value=1e4), min_size=1, max_size=5),
    size=st.integers(min_value=1, max_value=1000),
)
def test_under_the_equal_split_the_prediction_is_the_time_taken(
    walls: list[float], size: int
) -> None:
    # Prepare: every round sent the equal split, every silo with a line
    lines = {"a": (0.1, 1.0), "b": (0.3, 0.0), "c": (0.2, 5.0)}
    rounds = [(wall, {"a": size, "b": size, "c": size}) for wall in walls]

    # Execute
    predicted = equal_split_time(rounds, lines.get)

    # Assert
    assert predicted == pytest.approx(sum(walls))
