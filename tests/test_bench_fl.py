"""The FL and dynamics benchmark sections: the smoke run writes schema-valid JSON and its
plots (same code path as the full run, tiny settings, embedded data)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fl.py"
sys.path.insert(0, str(BENCH.parent))  # bench_fl imports benchmarks/common.py
OPS = {"<=", "<", ">=", ">"}


def _load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_fl", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_section(section: dict[str, Any], name: str, folder: Path) -> None:
    assert section["section"] == name
    assert section["title"] and "emulated" in section["setting"]
    assert section["figures"]
    for figure in section["figures"]:
        assert set(figure) == {"label", "value", "format", "unit", "goal", "note"}
        value, goal = figure["value"], figure["goal"]
        assert value is None or (isinstance(value, int | float) and math.isfinite(value))
        if value is not None:
            format(value, figure["format"])  # the report can render it
        assert goal is None or (goal["op"] in OPS and isinstance(goal["target"], int | float))
        assert figure["note"]
    for table in section["tables"]:
        assert all(len(row) == len(table["columns"]) for row in table["rows"])
    assert section["plots"] and all((folder / plot).is_file() for plot in section["plots"])
    assert all(isinstance(note, str) for note in section["notes"])


@pytest.mark.slow
def test_smoke_run_writes_both_sections_following_the_schema(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    bench = _load_bench()

    telemetry = tmp_path / "telemetry"

    # Execute
    code = bench.main(["--smoke", "--out", str(tmp_path), "--telemetry", str(telemetry)])

    # Assert
    assert code == 0
    fl = json.loads((tmp_path / "fl.json").read_text())
    dynamics = json.loads((tmp_path / "dynamics.json").read_text())
    _check_section(fl, "fl", tmp_path)
    _check_section(dynamics, "dynamics", tmp_path)
    labels = [f["label"] for f in fl["figures"]]
    assert "LB-BSP steady round time / T*" in labels
    assert "LB-BSP steady round time / oracle, worst seed" in labels
    assert "LB-BSP round time / FedAvg's equal split under the same noise, worst seed" in labels
    assert [row[0] for row in fl["tables"][0]["rows"]] == ["FedAvg", "LB-BSP"]
    assert "round / oracle" in fl["tables"][0]["columns"]
    assert [row[:2] for row in fl["tables"][1]["rows"]] == [["FedAvg", "0"], ["LB-BSP", "0"]]
    assert "embedded" in fl["setting"]
    # dynamics: the rounds to the oracle after both changes for each of the 2 predictors
    # of the smoke run, the goal of <= 2 on the default only; FedAvg beside them
    follow = [
        f for f in dynamics["figures"] if f["label"].startswith("Rounds to within 5% of the oracle")
    ]
    assert len(follow) == 4
    assert [f["goal"] for f in follow if f["label"].endswith(", default")] == [
        {"op": "<=", "target": 2}
    ] * 2
    assert all(f["goal"] is None for f in follow if not f["label"].endswith(", default"))
    # beside each: what an informed balancer did under the run's noise, and for the
    # default the same change in every LB-BSP run (each repeats the default balancer)
    assert all("An informed balancer" in f["note"] for f in follow)
    assert all(
        f["note"].count("(informed: ") == 2 for f in follow if f["label"].endswith(", default")
    )
    assert "load average" in dynamics["notes"][-1]
    assert [row[0] for row in dynamics["tables"][0]["rows"]][-1] == "FedAvg"
    # the sections rebuilt from the kept telemetry carry the same figures
    again = tmp_path / "again"
    rebuilt = ["--smoke", "--out", str(again), "--telemetry", str(telemetry), "--rebuild"]
    assert bench.main(rebuilt) == 0
    for name, section in (("fl", fl), ("dynamics", dynamics)):
        copy = json.loads((again / f"{name}.json").read_text())
        assert copy["figures"] == section["figures"] and copy["tables"] == section["tables"]
        assert "rebuilt from the telemetry" in copy["notes"][-1]
