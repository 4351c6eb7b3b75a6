"""The overhead section's comparison at scale: paired ratios to Flower's FedAvg, the
figures and table it writes, and one tiny real run of every aggregation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_overhead  # noqa: E402
from report import validate_section  # noqa: E402


def _times(flower: float, factor: dict[str, float]) -> dict[str, dict[str, Any]]:
    seconds = {"flower": [flower, flower]}
    seconds |= {name: [flower * f, flower * f] for name, f in factor.items()}
    return bench_overhead.summarise_times(seconds)


def test_ratios_to_flower_are_medians_of_paired_ratios() -> None:
    # Prepare: the machine is twice as busy in the second repetition, for both sides
    seconds = {"flower": [1.0, 2.0, 4.0], "lbbsp": [0.5, 1.0, 9.0]}

    # Execute
    summary = bench_overhead.summarise_times(seconds)

    # Assert: paired ratios 0.5, 0.5, 2.25 -> 0.5; medians of the seconds as they are
    assert summary["lbbsp"]["ratio"] == pytest.approx(0.5)
    assert summary["lbbsp"]["median"] == pytest.approx(1.0)
    assert summary["flower"]["ratio"] == pytest.approx(1.0)
    assert summary["lbbsp"]["seconds"] == [0.5, 1.0, 9.0]


def test_section_has_the_goal_at_a_thousand_silos_and_a_row_per_silo_count() -> None:
    # Prepare
    factors = {
        "lbbsp": 0.8, "lbbsp-telemetry": 0.9, "weighted-mean": 0.1,
        "weighted-mean-decode": 0.7,
    }  # fmt: skip
    aggregation = {n: _times(0.001 * n, factors) for n in (10, 100, 1000)}
    settings = bench_overhead.SMOKE
    decisions = {
        a: {n: {"decision": 1e-4, "reports": 1e-3} for n in settings.silos}
        for a in bench_overhead.ALLOCATORS
    }
    fl = {s: {"server": 0.01, "balancer": 0.001, "round": 1.0} for s in ("lbbsp", "fedavg")}

    # Execute
    section = bench_overhead.section(
        decisions, fl, [], settings, "digits", smoke=True, aggregation=aggregation
    )

    # Assert: valid; LB-BSP's ratio per silo count, with the goal (< 1) at 1,000 only
    validate_section(section, source="overhead")
    scale = [f for f in section["figures"] if "LB-BSP / Flower FedAvg" in f["label"]]
    assert [f["value"] for f in scale] == pytest.approx([0.8, 0.8, 0.8])
    assert [f["goal"] for f in scale] == [None, None, {"op": "<", "target": 1.0}]
    [table] = [t for t in section["tables"] if "Flower FedAvg" in t["title"]]
    assert [row[0] for row in table["rows"]] == ["10", "100", "1,000"]
    assert all(len(row) == len(table["columns"]) for row in table["rows"])
    assert table["rows"][2][1:4] == ["1.0000", "0.8000", "0.80"]
    assert "1,000 silos, WeightedMean alone / Flower FedAvg" in " ".join(
        f["label"] for f in section["figures"]
    )


@pytest.mark.usefixtures("flower_task")
def test_every_aggregation_runs_on_the_same_replies_and_agrees(tmp_path: Path) -> None:
    # Prepare / Execute: three silos, two repetitions (every aggregate is checked
    # against Flower's inside)
    times = bench_overhead.aggregation_times(3, 2, seed=0, workdir=tmp_path)

    # Assert
    assert set(times) == set(bench_overhead.AGGREGATIONS)
    assert times["flower"]["ratio"] == 1.0
    assert all(len(t["seconds"]) == 2 and t["median"] > 0 for t in times.values())
    assert not list(tmp_path.glob("*.jsonl"))  # the telemetry files are removed


def test_reference_model_is_lenet5_sized() -> None:
    # Execute
    reference = bench_overhead.lenet5_reference()

    # Assert
    assert sum(a.size for a in reference.values()) == 61_706
    assert {a.dtype.name for a in reference.values()} == {"float32"}


@pytest.mark.parametrize("allocator", ["linear", "proportional", "iterative"])
def test_balancer_times_measure_a_round_of_reports_and_a_decision(allocator: str) -> None:
    # Prepare / Execute: 12 silos (the fits over arrays) for 4 rounds
    times = bench_overhead.balancer_times(allocator, 12, 4, 0)

    # Assert: both medians measured
    assert set(times) == {"decision", "reports"}
    assert times["decision"] > 0 and times["reports"] > 0
