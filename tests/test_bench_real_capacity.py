"""Pure parts of the ``real-capacity`` section (benchmarks/bench_real_capacity.py) on
synthetic telemetry: no federation, no CPU group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_real_capacity as bench  # noqa: E402


def _events(walls: list[float], accuracies: list[float], sizes: dict[str, int]) -> list[Any]:
    """Train and evaluate events as the quickstart writes them: silo a computes 0.1 s per
    sample, b 0.2 s per sample, every reply received 1 s after its compute (b: 3 s)."""
    events: list[dict[str, Any]] = []
    sent = 1000.0
    for r, (wall, acc) in enumerate(zip(walls, accuracies, strict=True), start=1):
        silos = {}
        for silo, size in sizes.items():
            train = (0.1 if silo == "a" else 0.2) * size
            gap = 1.0 if silo == "a" else 3.0
            silos[silo] = {"batch-size": size, "train-time": train, "num-examples": 100,
                           "claimed-time": train, "observed-time": train,
                           "waited-time": train + gap}  # fmt: skip
        events.append({"event": "train", "round": r, "sent_at": sent, "wall_time": wall,
                       "silos": silos})  # fmt: skip
        events.append({"event": "evaluate", "round": r, "accuracy": acc})
        sent += wall + 1.0  # one second of evaluation between rounds
    return events


def test_time_to_target_counts_from_round_2_and_includes_the_pauses() -> None:
    # Prepare
    run = bench.run_rows(_events([5.0, 4.0, 4.0, 4.0], [0.1, 0.3, 0.5, 0.6], {"a": 10}))

    # Execute
    reached = bench.time_to(run["rounds"], 0.5)

    # Assert: rounds 2 and 3 (4 s each) and the 1 s between them
    assert reached == pytest.approx(9.0)
    assert bench.time_to(run["rounds"], 0.9) is None
    assert bench.final_accuracy(run["rounds"]) == pytest.approx(0.55)


def test_the_oracle_uses_the_measured_lines_and_gaps() -> None:
    # Prepare: two runs at different splits, so that each silo's line can be fitted
    runs = [
        bench.run_rows(_events([9.0] * 3, [0.1] * 3, {"a": 20, "b": 20})),
        bench.run_rows(_events([9.0] * 3, [0.1] * 3, {"a": 30, "b": 10})),
    ]

    # Execute
    curves = bench.cost_curves(runs)
    best = bench.oracle(curves, 40)

    # Assert: the lines t = 0.1 x and 0.2 x, gaps 1 and 3 s; the oracle's round
    # 0.1 x + 1 = 0.2 (40 - x) + 3 at x = 33.3: about 4.33 s, the equal split's 7 s
    assert curves["a"]["a"] == pytest.approx(0.1)
    assert curves["b"]["a"] == pytest.approx(0.2)
    assert curves["a"]["b"] == pytest.approx(0.0, abs=1e-9)
    assert (curves["a"]["gap"], curves["b"]["gap"]) == (1.0, 3.0)
    assert best["equal_round"] == pytest.approx(7.0)
    assert best["round"] < best["equal_round"]
    assert sum(best["split"].values()) == 40


def test_a_gap_without_the_wait_recorded_is_taken_from_the_replys_creation() -> None:
    # Prepare: a silo record of a run from before the server recorded its wait
    silo = {"claimed-time": 4.0, "observed-time": 4.0, "replied-at": 1010.0}

    # Execute / Assert: sent at 1000, 10 s to the reply, 4 of them compute
    assert bench._gap(silo, 1000.0) == pytest.approx(6.0)
    assert bench._gap({"claimed-time": 4.0, "waited-time": 7.5}, 1000.0) == pytest.approx(3.5)
    assert bench._gap({"observed-time": 4.0}, 1000.0) is None


@pytest.mark.parametrize(
    ("partition", "classes"),
    [("labels:2", [0, 1, 2, 3, 4, 5]), ("labels:5", list(range(10))), ("iid", list(range(10)))],
)
def test_the_accuracy_ceiling_counts_only_the_classes_some_silo_holds(
    partition: str, classes: list[int]
) -> None:
    # Execute: 3 silos on the embedded digits (10 classes)
    ceiling = bench.accuracy_ceiling("embedded", partition, 3, seed=0)

    # Assert: with 2 classes each, 3 silos leave 4 classes out, and the test images of
    # those classes cannot be scored
    assert ceiling["classes"] == classes
    if len(classes) == 10:
        assert ceiling["share"] == 1.0
    else:  # 6 of 10 about equally frequent classes
        assert 0.5 < ceiling["share"] < 0.7


def test_the_pairs_intervals_are_students_t_on_the_differences_and_the_log_speed_ups() -> None:
    # Prepare: 3 pairs; t(0.975, 2) = 4.303 (tables)
    diffs, speed_ups = [-1.0, 0.0, 1.0], [1.0, 2.0, 4.0]

    # Execute
    found = bench.paired_intervals(diffs, speed_ups)

    # Assert: sd 1 -> half-width 4.303 / sqrt(3); the speed-ups' logs 0, ln 2, ln 4 have
    # mean ln 2 (geometric mean 2) and sd ln 2
    half = 4.302652729911275 / 3**0.5
    assert found["accuracy_interval"] == pytest.approx([-half, half])
    assert found["speed_up_interval"] == pytest.approx([2.0, 2.0 / 2**half, 2.0 * 2**half])
    assert bench.paired_intervals(diffs, [])["speed_up_interval"] is None
