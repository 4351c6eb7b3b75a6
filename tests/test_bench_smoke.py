"""The benchmark suite end to end, tiny: ``benchmarks/run_all.py --smoke`` writes a
section JSON per benchmark (each following the schema) and ``REPORT.md``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_run_all_smoke_writes_valid_sections_and_the_report(tmp_path: Path) -> None:
    # Prepare: the sections this checkout can run
    expected = {"noise", "accuracy", "predictors", "cluster", "ddp", "overhead", "wallclock"}
    if (ROOT / "benchmarks" / "bench_fl.py").is_file():
        expected |= {"fl", "dynamics"}
    if all(importlib.util.find_spec(m) for m in ("tenseal", "phe", "gmpy2")):
        expected.add("he")

    # Execute
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run_all.py"),
            "--smoke",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1800,  # every section's smoke run, on a machine that may be busy
        cwd=ROOT,
        check=False,
    )

    # Assert: every section ran and validates; the report lists each of them
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = _load("bench_report_smoke")
    sections = report.load_sections(tmp_path)  # type: ignore[attr-defined]
    assert {s["section"] for s in sections} >= expected
    text = (tmp_path / "REPORT.md").read_text()
    assert text.startswith("# Benchmark report")
    for section in sections:
        assert f'<a id="{section["section"]}"></a>' in text
        for plot in section.get("plots", []):
            assert (tmp_path / plot).is_file(), plot
    assert "Smoke run on" in text
