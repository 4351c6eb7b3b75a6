"""The accuracy benchmark section: its statistics on injected numbers (mean difference with
a 95% CI from Student's t, time to target, speed-up, steady batch sizes), the section's
extra checks in report.py, and the smoke run's JSON (tiny rounds, embedded data)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_accuracy as bench  # noqa: E402
import report  # noqa: E402

T_975_4 = 2.7764451051977987
"""Student's t, 97.5% quantile, 4 degrees of freedom (tables)."""


def _trace(round_time: float, accuracy: list[float], sizes: dict[str, int]) -> bench.Trace:
    return bench.Trace(
        elapsed=[round_time * (r + 1) for r in range(len(accuracy))],
        accuracy=list(accuracy),
        batch_sizes=[dict(sizes) for _ in accuracy],
        round_times=[round_time] * len(accuracy),
    )


def _row(diff: float | None, speedup: float | None, min_b: float = 7.0) -> dict[str, Any]:
    return {"diff_points": diff, "speedup": speedup, "lbbsp_min_batch_size": min_b}


# ------------------------------------------------------------------------- statistics
def test_mean_ci_uses_students_t_with_n_minus_1_degrees_of_freedom() -> None:
    # Execute: sd of 1..5 is sqrt(2.5)
    mean, low, high = bench.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])

    # Assert
    half = T_975_4 * math.sqrt(2.5) / math.sqrt(5)
    assert mean == pytest.approx(3.0)
    assert (low, high) == pytest.approx((3.0 - half, 3.0 + half))


def test_mean_ci_of_one_value_is_unbounded_and_of_equal_values_is_a_point() -> None:
    # Execute / Assert
    assert bench.mean_ci([0.4]) == (0.4, -math.inf, math.inf)
    assert bench.mean_ci([-0.5, -0.5, -0.5]) == pytest.approx((-0.5, -0.5, -0.5))
    with pytest.raises(ValueError, match="no values"):
        bench.mean_ci([])
    with pytest.raises(ValueError, match="confidence"):
        bench.mean_ci([1.0, 2.0], confidence=1.0)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(-50, 50), min_size=2, max_size=12))
def test_mean_ci_contains_the_mean_and_widens_with_confidence(values: list[float]) -> None:
    # Execute
    mean, low, high = bench.mean_ci(values, 0.95)
    _, low99, high99 = bench.mean_ci(values, 0.99)

    # Assert
    assert low <= mean + 1e-9 and mean <= high + 1e-9
    assert low99 <= low + 1e-9 and high <= high99 + 1e-9


def test_seeds_needed_is_the_smallest_n_whose_half_width_fits_the_margin() -> None:
    # Execute
    n = bench.seeds_needed(3.0, 1.0)

    # Assert: t(0.975, n - 1) * 3 / sqrt(n) is 1.0002 at n = 37 and 0.986 at n = 38
    assert n == 38
    assert bench.seeds_needed(0.0, 1.0) == 2
    assert bench.seeds_needed(1.0, 1.0) == 7  # t(0.975, 6) = 2.447 < sqrt(7) = 2.646


def test_noise_ratio_is_the_mean_inverse_batch_size_over_fedavgs() -> None:
    # Execute: FedAvg 2 x 32; LB-BSP 56 and 8 -> mean(1/56, 1/8) / (1/32)
    ratio = bench.noise_ratio({"0": 32.0, "1": 32.0}, {"0": 56.0, "1": 8.0})

    # Assert
    assert ratio == pytest.approx((1 / 56 + 1 / 8) / 2 * 32)
    assert bench.noise_ratio({}, {"0": 8.0}) is None


def test_time_to_target_is_the_first_round_at_or_above_the_target() -> None:
    # Prepare: 0.9 at round 3 after 7.5 emulated seconds; it drops again later
    elapsed = [2.5, 5.0, 7.5, 10.0]
    accuracy = [0.5, None, 0.9, 0.8]

    # Execute / Assert
    assert bench.time_to_target(elapsed, accuracy, 0.8) == (7.5, 3)
    assert bench.time_to_target(elapsed, accuracy, 0.9) == (7.5, 3)
    assert bench.time_to_target(elapsed, accuracy, 0.95) == (None, None)


@pytest.mark.parametrize(
    ("fedavg", "lbbsp", "expected"),
    [(10.0, 4.0, 2.5), (3.0, 6.0, 0.5), (None, 4.0, None), (10.0, None, None), (1.0, 0.0, None)],
)
def test_speedup_is_fedavg_time_over_lbbsp_time(
    fedavg: float | None, lbbsp: float | None, expected: float | None
) -> None:
    # Execute / Assert
    assert bench.speedup(fedavg, lbbsp) == expected


def test_steady_batch_sizes_are_medians_from_the_steady_round_on() -> None:
    # Prepare: rounds 1-3 settle, then silo 4 runs at 6, 8, 7
    sizes = [
        {"0": 32, "4": 32},
        {"0": 48, "4": 16},
        {"0": 56, "4": 8},
        {"0": 57, "4": 6},
        {"0": 55, "4": 8},
        {"0": 57, "4": 7},
    ]

    # Execute / Assert
    assert bench.steady_batch_sizes(sizes, steady_from=4) == {"0": 57.0, "4": 7.0}
    assert bench.steady_batch_sizes(sizes[:2], steady_from=4) == {"0": 40.0, "4": 24.0}


def test_compare_seed_on_injected_traces() -> None:
    # Prepare: FedAvg rounds take 3 s, LB-BSP's 1 s; LB-BSP needs one round more
    fedavg = _trace(3.0, [0.5, 0.8, 0.9, 0.95, 0.92, 0.94], {"0": 32, "1": 32})
    lbbsp = _trace(1.0, [0.4, 0.6, 0.8, 0.9, 0.93, 0.91], {"0": 57, "1": 7})

    # Execute
    row = bench.compare_seed(fedavg, lbbsp, target_share=0.9, last=3, steady_from=4)

    # Assert: target 0.9 * min(0.95, 0.93); FedAvg reaches it in round 3 (9 s), LB-BSP in 4
    assert row["target"] == pytest.approx(0.837)
    assert (row["fedavg_time"], row["fedavg_rounds"]) == (9.0, 3)
    assert (row["lbbsp_time"], row["lbbsp_rounds"]) == (4.0, 4)
    assert row["speedup"] == pytest.approx(2.25)
    assert row["fedavg_final"] == pytest.approx((0.95 + 0.92 + 0.94) / 3)
    assert row["lbbsp_final"] == pytest.approx((0.9 + 0.93 + 0.91) / 3)
    assert row["diff_points"] == pytest.approx(100 * (2.74 - 2.81) / 3)
    assert row["lbbsp_batch_sizes"] == {"0": 57.0, "1": 7.0}
    assert row["lbbsp_min_batch_size"] == 7.0
    assert row["noise_ratio"] == pytest.approx((1 / 57 + 1 / 7) / 2 * 32)
    assert (row["fedavg_round_time"], row["lbbsp_round_time"]) == (3.0, 1.0)
    # the swing: mean |change| over the last 3 rounds, averaged over both schemes
    assert row["swing"] == pytest.approx(((0.03 + 0.02) / 2 + (0.03 + 0.02) / 2) / 2)


@pytest.mark.parametrize(
    ("accuracy", "last", "expected"),
    [
        ([0.1, 0.5, 0.4, 0.6], 3, (0.1 + 0.2) / 2),  # only the last 3 rounds count
        ([0.1, None, 0.4, 0.6], 10, (0.3 + 0.2) / 2),  # rounds without evaluation skipped
        ([0.8, 0.8, 0.8], 3, 0.0),  # a plateau does not swing
        ([0.7], 3, None),  # one round: no change to measure
    ],
)
def test_swing_is_the_mean_round_to_round_change_of_the_last_rounds(
    accuracy: list[float | None], last: int, expected: float | None
) -> None:
    # Execute
    value = bench.swing(accuracy, last)

    # Assert
    assert value == (None if expected is None else pytest.approx(expected))


def test_aggregate_marks_both_goals_met() -> None:
    # Prepare: differences 0, +1, -1, +0.5, -0.5 points; speed-ups all >= 1.5
    diffs, speedups = [0, 1, -1, 0.5, -0.5], [2.0, 1.5, 3.0, 2.2, 1.8]
    rows = [_row(d, s) for d, s in zip(diffs, speedups, strict=True)]

    # Execute
    result = bench.aggregate(rows)

    # Assert: sd = sqrt(0.625), t(0.975, 4) = 2.776
    half = T_975_4 * math.sqrt(0.625) / math.sqrt(5)
    assert result["diff_mean"] == pytest.approx(0.0)
    assert result["diff_sd"] == pytest.approx(math.sqrt(0.625))
    assert result["seeds_needed"] == bench.seeds_needed(math.sqrt(0.625), 1.0)
    assert (result["diff_low"], result["diff_high"]) == pytest.approx((-half, half))
    assert result["diff_goal_met"] is True
    assert result["speedup_min"] == 1.5 and result["speedup_median"] == 2.0
    assert result["speedup_seeds_met"] == 5 and result["speedup_goal_met"] is True
    assert result["seeds"] == 5 and result["min_batch_size"] == 7.0


def test_aggregate_marks_goals_missed_by_a_low_bound_and_a_slow_seed() -> None:
    # Prepare: LB-BSP 2 points worse on average; one seed at 1.4x
    diffs, speedups = [-2.0, -1.5, -2.5, -2.0], [2.0, 1.4, 2.5, 2.0]
    rows = [_row(d, s) for d, s in zip(diffs, speedups, strict=True)]

    # Execute
    result = bench.aggregate(rows)

    # Assert
    assert result["diff_mean"] == pytest.approx(-2.0)
    assert result["diff_low"] < -2.0 and result["diff_goal_met"] is False
    assert result["speedup_min"] == 1.4 and result["speedup_goal_met"] is False
    assert result["speedup_seeds_met"] == 3


def test_aggregate_with_one_seed_or_a_missing_speedup_cannot_meet_the_goals() -> None:
    # Execute
    one = bench.aggregate([_row(0.5, 2.0)])
    missing = bench.aggregate([_row(0.5, 2.0), _row(0.2, None)])

    # Assert: no interval from one seed; a seed without a time to target counts as missed
    assert one["diff_mean"] == 0.5 and one["diff_low"] is None and one["diff_goal_met"] is None
    assert one["diff_sd"] is None and one["seeds_needed"] is None
    assert missing["speedup_min"] is None and missing["speedup_goal_met"] is False
    assert missing["speedup_median"] == 2.0 and missing["speedup_seeds_met"] == 1


# -------------------------------------------------------------------- section, report
def _built_section() -> dict[str, Any]:
    fedavg = _trace(3.0, [0.5, 0.8, 0.9, 0.95, 0.92, 0.94], {"0": 32, "1": 32})
    rows = {
        partition: {
            seed: bench.compare_seed(
                fedavg, _trace(1.0, [0.4, 0.7 + seed / 100, 0.85, 0.9, 0.93, 0.91], {"0": 57})
            )
            for seed in range(3)
        }
        for partition in ("labels:2", "dirichlet:0.3")
    }
    settings_ = bench.Settings(
        dataset="embedded", seeds=(0, 1, 2), partitions=("labels:2", "dirichlet:0.3"),
        rounds=6, local_steps=2, batch_size=8, lr=0.1,
    )  # fmt: skip
    section = bench.build_section(settings_, rows, data_text="injected", seconds=1.0)
    return json.loads(json.dumps(section, allow_nan=False))


def test_built_section_follows_the_schema_and_its_figures_match_the_summary() -> None:
    # Execute
    section = report.validate_section(_built_section(), source="accuracy.json")

    # Assert
    lows = {f["label"]: f["value"] for f in section["figures"] if "lower bound" in f["label"]}
    assert lows == {
        f"LB-BSP - FedAvg final accuracy, 95% lower bound, {p}": section["summary"][p]["diff_low"]
        for p in ("labels:2", "dirichlet:0.3")
    }
    per_seed = section["tables"][1]
    assert len(per_seed["rows"]) == 6
    assert "emulated" in section["setting"] and "cost model" in section["setting"]
    text = report.render_report([section])
    assert "Per partition" in text and "Per seed" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("summary"), "summary"),
        (lambda s: s["summary"]["labels:2"].pop("diff_low"), "diff_low"),
        (lambda s: s["summary"]["labels:2"].update(diff_low="x"), "diff_low"),
        (lambda s: s["tables"].pop(), "per-seed"),
        (lambda s: s["figures"].pop(0), "95% lower bound of labels:2"),
        (lambda s: s["tables"][0]["rows"].pop(), "have no summary row"),
    ],
)
def test_report_refuses_an_accuracy_section_without_its_parts(change: Any, message: str) -> None:
    # Prepare
    section = copy.deepcopy(_built_section())
    change(section)

    # Execute / Assert
    with pytest.raises(report.SectionError, match=message):
        report.validate_section(section, source="accuracy.json")


# ------------------------------------------------------------------------------- smoke
def test_smoke_run_writes_a_valid_section(tmp_path: Path) -> None:
    # Execute: 2 seeds x 2 partitions x 2 schemes, 2 rounds of 2 steps, embedded digits
    code = bench.main(["--smoke", "--out", str(tmp_path)])

    # Assert
    assert code == 0
    section = json.loads((tmp_path / "accuracy.json").read_text())
    report.validate_section(section, source="accuracy.json")
    assert section["section"] == "accuracy" and "embedded" in section["setting"]
    for figure in section["figures"]:
        assert set(figure) == {"label", "value", "format", "unit", "goal", "note"}
        assert figure["note"]
    goals = [f for f in section["figures"] if f["goal"]]
    assert len(goals) == 4
    assert [row[:2] for row in section["tables"][1]["rows"]] == [
        ["labels:2", "0"], ["labels:2", "1"], ["dirichlet:0.3", "0"], ["dirichlet:0.3", "1"],
    ]  # fmt: skip
    assert all(section["summary"][p]["seeds"] == 2 for p in ("labels:2", "dirichlet:0.3"))
