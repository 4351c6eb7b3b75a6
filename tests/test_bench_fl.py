"""The FL and dynamics benchmark sections: the smoke run writes schema-valid JSON and its
plots (same code path as the full run, tiny settings, embedded data)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fl.py"
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

    # Execute
    code = bench.main(["--smoke", "--out", str(tmp_path)])

    # Assert
    assert code == 0
    fl = json.loads((tmp_path / "fl.json").read_text())
    dynamics = json.loads((tmp_path / "dynamics.json").read_text())
    _check_section(fl, "fl", tmp_path)
    _check_section(dynamics, "dynamics", tmp_path)
    labels = [f["label"] for f in fl["figures"]]
    assert "LB-BSP steady round time / T*" in labels
    assert [row[0] for row in fl["tables"][0]["rows"]] == ["FedAvg", "LB-BSP"]
    assert "embedded" in fl["setting"]
    recover = [f for f in dynamics["figures"] if f["label"].startswith("Rounds to recover")]
    assert len(recover) == 4 and all(f["goal"] == {"op": "<=", "target": 3} for f in recover)
