"""How often LB-BSP's ranks exchange their times (pure logic, injected times, no
processes): k backs off only on windows that show the ranks equal, and comes back to its
base as soon as a window does not, so that a rank falling behind after a long quiet spell
is moved within windows of the base length; the first iteration is left out of the first
window."""

from __future__ import annotations

import math
import random

import pytest

from fl_lbbsp.core.balancer import BatchSizeBalancer
from fl_lbbsp.distributed import HoldGate, LBBSPCoordinator, Verdict, WindowStats
from fl_lbbsp.distributed.cadence import Cadence
from fl_lbbsp.distributed.decision import Decision
from fl_lbbsp.distributed.exchange import Row

B_INIT = 64
EVERY = 10
BACKOFF = 4
BASE = 0.01  # seconds per iteration of an unloaded rank at B_INIT


def _decision(ranks: int) -> Decision:
    return Decision(
        balancer=BatchSizeBalancer(initial_batch_size=B_INIT),
        rank_ids=[str(r) for r in range(ranks)],
        total=ranks * B_INIT,
        gate=HoldGate(),
        cadence=Cadence(every=EVERY, overhead_share=0.01, max_every=100, backoff=BACKOFF),
        review=True,
    )


def _row(times: list[float], size: int) -> list[float]:
    row = [0.0] * len(Row)
    row[Row.TIME], row[Row.SQUARE] = sum(times), sum(t * t for t in times)
    row[Row.SAMPLES], row[Row.SIZE], row[Row.COUNT] = float(size * len(times)), size, len(times)
    return row


def simulate(
    ranks: int, slowdown: list[float], iterations: int, *, seed: int, spread: float = 0.2
) -> list[tuple[int, tuple[int, ...], Verdict, int]]:
    """Drive a Decision with injected per-iteration times: rank r at size B takes
    BASE B / B_INIT, times ``slowdown[r]`` in the second half of the ``iterations``, with
    log-normal noise of ``spread``. One exchange every k iterations, decided at once.
    Returns (iteration, sizes after, verdict, k after) per exchange."""
    rng = random.Random(seed)
    decision = _decision(ranks)
    sizes = decision.allocate()
    out = []
    times: list[list[float]] = [[] for _ in range(ranks)]
    for it in range(1, iterations + 1):
        factors = slowdown if it > iterations // 2 else [1.0] * ranks
        for r in range(ranks):
            noise = math.exp(rng.gauss(0.0, spread))
            times[r].append(BASE * sizes[r] / B_INIT * factors[r] * noise)
        if len(times[0]) >= decision.cadence.k:
            rows = [_row(times[r], sizes[r]) for r in range(ranks)]
            sizes = decision.decide(rows, sizes)
            assert decision.last_verdict is not None
            out.append((it, sizes, decision.last_verdict, decision.cadence.k))
            times = [[] for _ in range(ranks)]
    return out


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", range(3))
def test_on_equal_ranks_k_backs_off_and_the_sizes_stay(ranks: int, seed: int) -> None:
    # Prepare / Execute: 1,000 iterations of equal ranks under injected noise
    exchanges = simulate(ranks, [1.0] * ranks, 1000, seed=seed)

    # Assert: no move; k reached its most (4 x 10) and the exchanges were fewer than at a
    # fixed k (100), yet k came back to 10 on the windows that did not show them equal
    assert all(sizes == (B_INIT,) * ranks for _, sizes, _, _ in exchanges)
    ks = [k for *_, k in exchanges]
    assert max(ks) == BACKOFF * EVERY
    assert len(exchanges) < 1000 / EVERY / 1.5
    assert all(
        k == EVERY for (_, _, verdict, k) in exchanges if not verdict.equal
    )  # back to the base


@pytest.mark.parametrize("seed", range(4))
def test_a_rank_falling_behind_after_the_backoff_is_moved_within_base_windows(
    seed: int,
) -> None:
    # Prepare / Execute: 2 ranks equal for 500 iterations (k backs off), then rank 0
    # twice as slow
    exchanges = simulate(2, [2.0, 1.0], 1000, seed=seed, spread=0.1)
    change = 500

    # Assert: k was backed off when rank 0 fell behind; the first exchange after the
    # change brought k back to 10, and the move came within the window under way (at
    # most 40 iterations) and two windows of 10 (seen, confirmed), rank 0 given less
    k_at_change = [k for it, _, _, k in exchanges if it <= change][-1]
    assert k_at_change > EVERY
    after = [(it, sizes, verdict, k) for it, sizes, verdict, k in exchanges if it > change]
    assert after[0][3] == EVERY
    moved = next(it for it, sizes, _, _ in after if sizes != (B_INIT, B_INIT))
    assert moved - change <= k_at_change + 2 * EVERY
    assert after[-1][1][0] < B_INIT < after[-1][1][1]


def _stats(times: list[float], size: int = B_INIT) -> WindowStats:
    return WindowStats(size, sum(times), sum(t * t for t in times), len(times))


def test_a_window_shows_the_ranks_equal_only_against_the_noise_between_windows() -> None:
    # Prepare: a first window 8% apart with a spread of its own (no window before it)
    rng = random.Random(0)
    gate = HoldGate()
    spread = [BASE * math.exp(rng.gauss(0.0, 0.3)) for _ in range(EVERY)]

    # Execute
    first = gate.judge([_stats(spread), _stats([t * 1.17 for t in spread])])
    verdicts = []
    for _ in range(40):
        windows = [
            _stats([BASE * math.exp(rng.gauss(0.0, 0.2)) for _ in range(EVERY)]) for _ in range(2)
        ]
        verdicts.append((gate.judge(windows), gate.noise()))

    # Assert: the first is held within the noise of its own spread, but does not show the
    # ranks equal; later windows within tolerance do, and those within the noise do when
    # their gain is within one standard deviation of the noise measured between windows
    assert first.reason == "within noise" and not first.equal
    held = [(v, n) for v, n in verdicts if v.reason == "within noise"]
    assert held and any(v.equal for v, _ in held) and any(not v.equal for v, _ in held)
    for verdict, between in verdicts:
        if verdict.reason == "within tolerance":
            assert verdict.equal
        elif verdict.reason == "within noise" and between is not None:
            assert verdict.noise is not None
            assert verdict.equal == (verdict.gain <= verdict.noise)
        else:
            assert not verdict.equal


@pytest.mark.parametrize("resume", [False, True])
def test_the_first_iteration_is_left_out_of_the_first_window(resume: bool) -> None:
    # Prepare: a world of one, k = 3; a first iteration 100x the others (set-up), from
    # the start or after a resume
    coordinator = LBBSPCoordinator(initial_batch_size=B_INIT, every=3, overlap=False)
    if resume:
        for _ in range(4):
            coordinator.step(1.0)
        coordinator.load_state_dict(coordinator.state_dict())

    # Execute
    decided = [coordinator.step(seconds) for seconds in (100.0, 1.0, 1.0, 1.0)]

    # Assert: the window of 3 iterations closed at the fourth step, without the first
    assert decided == [False, False, False, True]
    report = coordinator.last_reports[0]
    assert report.iterations == 3 and report.compute_time == pytest.approx(3.0)


def test_without_warm_up_the_first_iteration_counts() -> None:
    # Prepare
    coordinator = LBBSPCoordinator(initial_batch_size=B_INIT, every=3, overlap=False, warm_up=0)

    # Execute
    decided = [coordinator.step(seconds) for seconds in (100.0, 1.0, 1.0)]

    # Assert
    assert decided == [False, False, True]
    assert coordinator.last_reports[0].compute_time == pytest.approx(102.0)
