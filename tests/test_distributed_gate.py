"""The hold gate of LB-BSP on torch.distributed (pure logic, no processes): equal ranks
under injected noise keep their sizes, a lasting lead moves them after two windows, one
slow window does not, the predicted gain is the proportional split's, and an allocation
the window predicts no faster than the sizes in force is held."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from fl_lbbsp.distributed import HoldGate, Verdict, WindowStats
from fl_lbbsp.distributed.gate import predicted_gain, review_proposal

K = 10  # iterations per window, the coordinator's default
BASE = 0.01  # seconds per iteration of an unloaded rank at B = 64


def window(times: list[float], batch_size: int = 64) -> WindowStats:
    """A rank's window from its per-iteration times."""
    return WindowStats(
        batch_size=batch_size,
        time=sum(times),
        square=sum(t * t for t in times),
        iterations=len(times),
    )


def noisy_windows(
    rng: random.Random, slowdowns: list[float], *, spread: float = 0.2, spikes: float = 0.03
) -> list[WindowStats]:
    """One window of every rank: per-iteration log-normal noise of ``spread``, a slowdown
    all ranks share in the window (a busy machine), and, with probability ``spikes`` per
    iteration, one iteration 3x slower (a co-tenant's burst)."""
    shared = math.exp(rng.gauss(0.0, 0.15))
    return [
        window([
            BASE * k * shared * math.exp(rng.gauss(0.0, spread))
            * (3.0 if rng.random() < spikes else 1.0)
            for _ in range(K)
        ])
        for k in slowdowns
    ]  # fmt: skip


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", range(4))
def test_sizes_are_held_on_equal_ranks_under_injected_noise(ranks: int, seed: int) -> None:
    # Prepare: equal ranks, 100 windows of injected noisy times (a 200-iteration run is 20)
    rng = random.Random(seed)
    gate = HoldGate()

    # Execute
    verdicts = [gate.judge(noisy_windows(rng, [1.0] * ranks)) for _ in range(100)]

    # Assert: never moved; the noise, not only the tolerance, held windows whose gain
    # exceeded the tolerance
    assert not any(v.move for v in verdicts)
    noisy = [v for v in verdicts if v.gain > gate.tolerance]
    assert noisy and all(v.reason in ("within noise", "unconfirmed") for v in noisy)


@pytest.mark.parametrize("ranks", [2, 4])
def test_without_the_noise_test_equal_ranks_chase_the_noise(ranks: int) -> None:
    # Prepare: the same noise, only the tolerance holding the sizes
    rng = random.Random(0)
    gate = HoldGate(sigmas=None)

    # Execute
    moves = sum(gate.judge(noisy_windows(rng, [1.0] * ranks)).move for _ in range(100))

    # Assert: the noise alone would have moved the sizes again and again
    assert moves > 10


@pytest.mark.parametrize(
    ("slowdowns", "spread", "spikes", "seed"),
    [([2.0, 1.0], 0.2, 0.03, 0), ([1.5, 1.0], 0.1, 0.0, 1), ([4.0, 2.0, 1.0, 1.0], 0.2, 0.03, 2)],
)
def test_a_lasting_lead_moves_the_sizes_after_two_windows(
    slowdowns: list[float], spread: float, spikes: float, seed: int
) -> None:
    # Prepare: unequal ranks under noise (a 1.5x lead needs quieter ranks, without
    # bursts, to stand out of a window's noise)
    rng = random.Random(seed)
    gate = HoldGate()

    # Execute
    first = gate.judge(noisy_windows(rng, slowdowns, spread=spread, spikes=spikes))
    second = gate.judge(noisy_windows(rng, slowdowns, spread=spread, spikes=spikes))

    # Assert: held once (one window could be a burst), moved on the second
    assert (first.move, first.reason) == (False, "unconfirmed")
    assert (second.move, second.reason) == (True, "confirmed")
    assert second.slowest == 0


def test_one_slow_window_does_not_move_the_sizes() -> None:
    # Prepare: 8 quiet windows of 2 equal ranks, then rank 0 is 1.6x slower for one window
    rng = random.Random(5)
    gate = HoldGate()
    quiet = [gate.judge(noisy_windows(rng, [1.0, 1.0], spread=0.05, spikes=0.0)) for _ in range(8)]

    # Execute
    burst = gate.judge(noisy_windows(rng, [1.6, 1.0], spread=0.05, spikes=0.0))
    after = gate.judge(noisy_windows(rng, [1.0, 1.0], spread=0.05, spikes=0.0))

    # Assert: the burst is beyond the noise but unconfirmed; the next window is quiet
    assert not any(v.move for v in quiet)
    assert (burst.move, burst.reason) == (False, "unconfirmed")
    assert not after.move


def test_a_lasting_change_is_not_counted_as_noise() -> None:
    # Prepare: 12 quiet windows of 2 equal ranks, then rank 1 turns 1.4x slower for good
    rng = random.Random(7)
    gate = HoldGate()
    for _ in range(12):
        gate.judge(noisy_windows(rng, [1.0, 1.0], spread=0.05, spikes=0.0))
    before = gate.noise()

    # Execute
    verdicts = [gate.judge(noisy_windows(rng, [1.0, 1.4], spread=0.05, spikes=0.0))
                for _ in range(2)]  # fmt: skip

    # Assert: one step in the relative times leaves the robust noise where it was; the
    # lead moves the sizes at the second window
    assert before is not None and gate.noise() == pytest.approx(before, rel=0.5)
    assert [v.move for v in verdicts] == [False, True]
    assert verdicts[1].slowest == 1


def test_gain_is_the_proportional_splits() -> None:
    # Prepare: equal sizes, rank 0 takes 2 s per iteration, rank 1 takes 1 s
    gate = HoldGate(sigmas=None)

    # Execute
    verdict = gate.judge([window([2.0, 2.0]), window([1.0, 1.0])])

    # Assert: sizes proportional to speed finish together at 2 B / (B / 2 + B / 1) = 4/3 s,
    # a third of the slowest rank's 2 s given back
    assert verdict.gain == pytest.approx(1.0 - (4.0 / 3.0) / 2.0)
    assert (verdict.move, verdict.reason, verdict.slowest) == (True, "beyond tolerance", 0)


def test_predicted_gain_scales_each_ranks_time_per_sample() -> None:
    # Prepare: rank 0 takes 2 s per iteration at 64, rank 1 1 s at 64
    windows = [window([2.0, 2.0]), window([1.0, 1.0])]

    # Execute
    gains = [predicted_gain(windows, sizes) for sizes in ((43, 85), (64, 64), (80, 48))]

    # Assert: (43, 85) finish at max(2 * 43 / 64, 85 / 64) = 1.34 s instead of 2 s; the
    # sizes in force gain nothing; giving the slow rank more loses
    assert gains[0] == pytest.approx(1.0 - (2.0 * 43 / 64) / 2.0)
    assert gains[1] == pytest.approx(0.0)
    assert gains[2] == pytest.approx(1.0 - (2.0 * 80 / 64) / 2.0) and gains[2] < 0
    assert predicted_gain([window([2.0]), window([0.0])], (64, 64)) is None


@pytest.mark.parametrize(
    ("proposal", "move", "reason"),
    [
        ((66, 62), True, "confirmed"),  # near the window's proportional split
        ((81, 47), False, "proposal no faster"),  # the rank behind in the window loaded more
        ((54, 74), False, "proposal no faster"),  # the sizes in force: no gain
    ],
)
def test_an_allocation_the_window_predicts_no_faster_is_held(
    proposal: tuple[int, int], move: bool, reason: str
) -> None:
    # Prepare: a window logged on a loaded 2-core machine (equal ranks, sizes 54:74): rank
    # 0 at 5.13 ms per iteration, rank 1 at 7.53 ms; the gate let a move through
    windows = [window([0.00513] * K, 54), window([0.00753] * K, 74)]
    confirmed = Verdict(True, 0.164, 0.067, 1, "confirmed")

    # Execute
    verdict = review_proposal(confirmed, windows, proposal)

    # Assert: applied when the window predicts it faster, held otherwise (gain and noise
    # kept for the logs)
    assert (verdict.move, verdict.reason) == (move, reason)
    assert (verdict.gain, verdict.noise, verdict.slowest) == (0.164, 0.067, 1)


def test_a_held_verdict_is_not_reviewed() -> None:
    # Prepare
    held = Verdict(False, 0.01, None, 0, "within tolerance")

    # Execute
    verdict = review_proposal(held, [window([2.0]), window([1.0])], (80, 48))

    # Assert
    assert verdict is held


@pytest.mark.parametrize(
    ("rows", "options", "move", "reason"),
    [
        ([[1.04] * 4, [1.0] * 4], {}, False, "within tolerance"),
        ([[0.6, 1.8, 0.6, 1.8], [1.0] * 4], {}, False, "within noise"),
        ([[0.6, 1.8, 0.6, 1.8], [1.0] * 4], {"sigmas": None}, True, "beyond tolerance"),
        ([[1.5], [1.0]], {}, True, "noise unknown"),
        ([[1.5, 1.5], [0.0, 0.0]], {}, True, "no times"),
    ],
)
def test_verdicts_of_single_windows(
    rows: list[list[float]], options: dict[str, Any], move: bool, reason: str
) -> None:
    # Prepare
    gate = HoldGate(**options)

    # Execute
    verdict = gate.judge([window(times) for times in rows])

    # Assert
    assert (verdict.move, verdict.reason) == (move, reason)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tolerance": 1.0}, "tolerance"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"sigmas": -1.0}, "sigmas"),
        ({"sigmas": math.inf}, "sigmas"),
        ({"min_history": 2}, "min_history"),
        ({"history": 3, "min_history": 4}, "history"),
    ],
)
def test_gate_rejects_bad_arguments(options: dict[str, Any], message: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        HoldGate(**options)
