"""The oracle shared by the benchmark sections (``benchmarks/common.py``): the oracle split
of a run of measured noise, read from its telemetry, and the rounds to within 5% of it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import common  # noqa: E402

A, B, TAU = 0.01, 0.2, 4  # the machine's line for tau steps: t = A x + B


def _silo(x: int, k: float, noise: float, **extra: Any) -> dict[str, Any]:
    compute = (A * x + B) * noise
    return {
        "batch-size": x,
        "samples-processed": x * TAU,
        "compute-time": compute,
        "train-time": k * compute,
        "slowdown": k,
        **extra,
    }


def _run(rounds: list[dict[str, dict[str, Any]]], **event: Any) -> list[dict[str, Any]]:
    config = {"event": "config", "local_steps": TAU, "batch_size": 30, "silos": 2}
    train = [
        {
            "event": "train",
            "round": r + 1,
            "silos": silos,
            "round_time": max(s["train-time"] for s in silos.values()),
            **event,
        }
        for r, silos in enumerate(rounds)
    ]
    return [config, *train]


def test_oracle_of_a_run_without_noise_is_the_min_max_split_of_the_true_lines() -> None:
    # Prepare: silo 1 twice as slow; both at B_init = 30 (the equal split)
    events = _run([{"0": _silo(30, 1.0, 1.0), "1": _silo(30, 2.0, 1.0)}])

    # Execute
    oracle = common.telemetry_oracle(events, A, B, floor=1)

    # Assert: the oracle moves samples to the fast silo (x0 + x1 = 60 with
    # A x0 + B = 2 (A x1 + B): x0 = 46.7, x1 = 13.3 in reals, rounded to integers)
    best = common.oracle_split(np.array([A, 2 * A]), np.array([B, 2 * B]), 60, 1)
    x0, x1 = oracle.sizes[0]
    assert [x0, x1] == [int(v) for v in best] and x0 + x1 == 60 and x0 > 3 * x1
    assert oracle.oracle[0] == pytest.approx(max(A * x0 + B, 2 * (A * x1 + B)))
    assert oracle.oracle == oracle.oracle_clean
    assert oracle.clean == pytest.approx([2 * (A * 30 + B)])
    assert oracle.noise == pytest.approx([1.0, 1.0])
    assert oracle.over_oracle() == pytest.approx(oracle.round_time[0] / oracle.oracle[0])
    assert oracle.over_oracle() > 1.0


def test_each_silos_noise_factor_of_the_round_is_applied_to_the_oracles_time() -> None:
    # Prepare: round 1 quiet, round 2 silo 0 30% slower and silo 1 10% faster
    quiet = {"0": _silo(40, 1.0, 1.0), "1": _silo(20, 2.0, 1.0)}
    noisy = {"0": _silo(40, 1.0, 1.3), "1": _silo(20, 2.0, 0.9)}

    # Execute
    oracle = common.telemetry_oracle(_run([quiet, noisy]), A, B, floor=1)

    # Assert
    x0, x1 = oracle.sizes[1]
    assert oracle.noise == pytest.approx([1.0, 1.0, 1.3, 0.9])
    assert oracle.oracle[1] == pytest.approx(max(1.3 * (A * x0 + B), 0.9 * 2 * (A * x1 + B)))
    assert oracle.oracle_clean[1] == pytest.approx(oracle.oracle_clean[0])
    assert oracle.clean[1] == pytest.approx(oracle.clean[0])
    assert oracle.noise_level() == pytest.approx(np.std(np.log([1, 1, 1.3, 0.9])))
    np.testing.assert_allclose(oracle.factors, [[1.0, 1.0], [1.3, 0.9]])
    np.testing.assert_allclose(oracle.slowdowns, [[1.0, 2.0], [1.0, 2.0]])


def test_dropped_silos_count_for_the_oracle_and_other_step_counts_are_scaled_to_tau() -> None:
    # Prepare: partial aggregation dropped silo 1; silo 0 ran 8 steps of 15 (LB-BSP-tau:
    # batch-size is its equivalent share 30, the step batch size 15)
    ran = {
        "batch-size": 30,
        "step-batch-size": 15,
        "samples-processed": 15 * 8,
        "compute-time": 2 * (A * 15 + B),  # twice tau steps of 15, on the line
        "slowdown": 1.0,
    }
    ran["train-time"] = ran["compute-time"]
    events = _run([{"0": ran}], dropped={"1": _silo(30, 2.0, 1.5)})

    # Execute
    oracle = common.telemetry_oracle(events, A, B, floor=1)

    # Assert: silo 0 is on its line (noise 1), the dropped silo's noise is in the oracle
    assert oracle.noise == pytest.approx([1.0, 1.5])
    x0, x1 = oracle.sizes[0]
    assert oracle.oracle[0] == pytest.approx(max(A * x0 + B, 1.5 * 2 * (A * x1 + B)))
    assert oracle.clean == pytest.approx([2 * (A * 15 + B)])  # the kept silo only


def test_skipped_rounds_are_left_out_and_positions_find_the_next_round() -> None:
    events = _run([{"0": _silo(30, 1.0, 1.0), "1": _silo(30, 1.0, 1.0)}] * 3)
    events[2]["round_time"] = None  # round 2 skipped

    oracle = common.telemetry_oracle(events, A, B, floor=1)

    assert oracle.rounds == [1, 3]
    assert oracle.position(2) == 1 and oracle.position(9) == 2
    assert oracle.over_oracle(3) == pytest.approx(1.0)
    assert oracle.over_oracle(4) is None


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([1.0, 1.0, 2.0, 2.0, 1.0, 1.0], [2, 0]),  # r, r+1 off, r+2 within
        ([1.0, 1.0, 1.04, 1.0, 1.0, 1.0], [0, 0]),  # within 5% at once
        ([1.0, 1.0, 2.0, 2.0, 2.0, 2.0], [None, None]),  # never within
    ],
)
def test_rounds_within_counts_from_each_change_to_the_next(
    times: list[float], expected: list[int | None]
) -> None:
    assert common.rounds_within(times, [1.0] * 6, [2, 5]) == expected


def test_oracle_goal_follows_the_jitter() -> None:
    assert common.oracle_goal(0.0) == common.oracle_goal(0.1) == 1.05
    assert common.oracle_goal(0.3) == common.oracle_goal("real") == 1.10


def test_the_equal_split_runs_under_the_same_noise() -> None:
    # Prepare: B_init 30 each would be FedAvg's split; the run sent 40 and 20
    events = _run([{"0": _silo(40, 1.0, 1.2), "1": _silo(20, 2.0, 0.8)}])

    # Execute
    oracle = common.telemetry_oracle(events, A, B, floor=1)

    # Assert
    assert oracle.equal == pytest.approx([max(1.2 * (A * 30 + B), 0.8 * 2 * (A * 30 + B))])
    assert oracle.over_equal() == pytest.approx(oracle.round_time[0] / oracle.equal[0])
    x0, x1 = oracle.sizes[0]
    times = [1.2 * (A * x0 + B), 0.8 * 2 * (A * x1 + B)]
    assert oracle.oracle_idle == pytest.approx([1 - np.mean(times) / max(times)])


def _halving(noise_of_target: tuple[float, float]) -> tuple[np.ndarray, ...]:
    """Three silos on proportional lines, silo 0 twice as slow from row 2 on, no noise
    but silo 0's in rows 2 and 3 (the reports that confirm the change)."""
    slopes = np.tile([1.0, 2.0, 2.0], (6, 1))
    slopes[2:, 0] = 2.0
    noise = np.ones((6, 3))
    noise[2:4, 0] = noise_of_target
    return slopes, np.zeros_like(slopes), noise


def test_an_informed_balancer_follows_a_change_from_its_confirming_reports() -> None:
    # Prepare: the confirming reports carry no noise
    slopes, fixed, noise = _halving((1.0, 1.0))

    # Execute
    followed = common.informed_follows(slopes, fixed, noise, [2], 0, 120, 1, confirm=2)

    # Assert: the old split is not within 5% of the new oracle's, the informed one is
    old = common.oracle_split(slopes[1], fixed[1], 120, 1)
    best = common.oracle_split(slopes[2], fixed[2], 120, 1)
    assert (slopes[2] * old).max() > 1.05 * (slopes[2] * best).max()
    assert followed == [True]


@pytest.mark.parametrize("level", [(0.8, 0.8), (1.25, 1.25)])
def test_an_informed_balancer_misled_by_its_confirming_reports_does_not_follow(
    level: tuple[float, float],
) -> None:
    # Prepare: both confirming reports 20-25% off the silo's new line
    slopes, fixed, noise = _halving(level)

    # Execute
    followed = common.informed_follows(slopes, fixed, noise, [2], 0, 120, 1, confirm=2)

    # Assert
    assert followed == [False]


def test_an_informed_balancer_needs_the_confirming_rounds_to_have_run() -> None:
    # Prepare: the change is in the last row, no report confirms it
    slopes, fixed, noise = _halving((1.0, 1.0))
    slopes[2:5, 0] = 1.0

    # Execute
    followed = common.informed_follows(slopes, fixed, noise, [5], 0, 120, 1, confirm=2)

    # Assert
    assert followed == [False]
