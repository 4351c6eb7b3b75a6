"""The benchmark suite end to end, tiny: ``benchmarks/run_all.py --smoke`` writes a
section JSON per benchmark (each following the schema) and ``REPORT.md``.

Three sections have their own end-to-end smoke tests and are left out here, so that the
suite runs each expensive federation once: ``ddp`` (torchrun launches,
``tests/test_distributed_bench.py``), ``wallclock`` (``tests/test_wall_clock.py``) and
``plugin`` (``flwr run`` of the quickstart app, ``tests/test_quickstart_app.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


# setup runs `make demo` itself: tests/test_bench_setup.py checks what it reads from a demo
OWN_SMOKE_TEST = {"ddp", "wallclock", "plugin", "setup"}


def _load(name: str, script: str = "report.py") -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_run_all_smoke_writes_valid_sections_and_the_report(tmp_path: Path) -> None:
    # Prepare: the sections this checkout can run
    sys.path.insert(0, str(ROOT / "benchmarks"))
    run_all = _load("bench_run_all_smoke", "run_all.py")
    assert set(run_all.SECTIONS) >= OWN_SMOKE_TEST  # a renamed section is not left out
    sections = [s for s in run_all.SECTIONS if s not in OWN_SMOKE_TEST]
    expected = {"noise", "budget", "accuracy-budget", "budget-tradeoff", "predictors", "cluster",
                "overhead"}  # fmt: skip
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
            "--sections",
            ",".join(sections),
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
    written = report.load_sections(tmp_path)
    assert {s["section"] for s in written} >= expected
    text = (tmp_path / "REPORT.md").read_text()
    assert text.startswith("# Benchmark report")
    for section in written:
        assert f'<a id="{section["section"]}"></a>' in text
        for plot in section.get("plots", []):
            assert (tmp_path / plot).is_file(), plot
    assert "Smoke run of the sections " + ", ".join(sections) + " of commit" in text
    assert "load average" in text
