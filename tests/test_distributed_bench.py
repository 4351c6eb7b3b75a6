"""The ``ddp`` benchmark section, tiny: ``benchmarks/bench_ddp.py --smoke`` launches the
example with torchrun (2 gloo ranks) and the Flower cluster mode, and writes a ``ddp.json``
that follows the report schema; and the section's pure parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_ideal_time_of_fitted_cost_lines() -> None:
    # Prepare: two ranks with t = 0.001 B + 0.01 and t = 0.002 B + 0.01, seen at two sizes
    bench = _load("bench_ddp")
    reports = {
        "0": [(40, 0.05), (80, 0.09)],
        "1": [(40, 0.09), (80, 0.17)],
    }

    # Execute
    t_star = bench.ideal_time(reports, 120)

    # Assert: (X + sum b/a) / sum 1/a = (120 + 10 + 5) / (1000 + 500)
    assert t_star == pytest.approx(135 / 1500)


def test_ideal_time_without_spread_is_total_over_summed_speeds() -> None:
    # Prepare: each rank seen at one size only: b = 0, a = t / B
    bench = _load("bench_ddp")

    # Execute
    t_star = bench.ideal_time({"0": [(50, 0.1)], "1": [(50, 0.05)]}, 100)

    # Assert: X / (v_0 + v_1) = 100 / (500 + 1000)
    assert t_star == pytest.approx(100 / 1500)


def test_ideal_time_with_a_floor_pins_the_ranks_below_it() -> None:
    # Prepare: t = 0.004 B + 0.01 (4x slower, the same fixed part scaled) and t = 0.001 B
    # + 0.0025, X = 100; unbounded, the slow rank's ideal batch is 18.5
    bench = _load("bench_ddp")
    reports = {"0": [(20, 0.09), (40, 0.17)], "1": [(80, 0.0825), (60, 0.0625)]}
    free = bench.ideal_time(reports, 100)

    # Execute
    floored = bench.ideal_time(reports, 100, 30)

    # Assert: (X + sum b/a) / sum 1/a unbounded; with the floor rank 0 gets 30 samples
    # (0.13 s) and rank 1 the other 70 (0.0725 s): the slowest is the floored rank
    assert free == pytest.approx((100 + 2.5 + 2.5) / 1250)
    assert floored == pytest.approx(0.13)
    assert bench.ideal_time(reports, 100, 10) == pytest.approx(free)


def test_speedup_bound_is_equal_fast_ranks_over_the_unequal_ones() -> None:
    # Prepare: the smoke cases (homogeneous 2 ranks, emulated 2:1 on 2 ranks); equal fast
    # ranks: plain DDP 900, LB-BSP 1,000 samples/s; unequal ranks: plain DDP 800
    bench = _load("bench_ddp")
    results = {
        "homogeneous-2": {"ddp": {"throughput": 900.0}, "lbbsp": {"throughput": 1000.0}},
        "heterogeneous-2": {"ddp": {"throughput": 800.0}, "lbbsp": {"throughput": 950.0}},
    }

    # Execute
    figures = bench.speedup_bounds(bench.SMOKE, results)

    # Assert: one bound, for the emulated case, from the best of the equal fast ranks' runs:
    # no split of 2:1 ranks beats 2 fast ranks
    assert [f["label"] for f in figures] == [
        "heterogeneous 2:1 (emulated), 2 ranks: the most any split could gain over plain DDP"
    ]
    assert figures[0]["value"] == pytest.approx(1.25) and figures[0]["goal"] is None


def test_repeats_report_the_median_run_and_the_median_pair_ratio() -> None:
    # Prepare: 3 alternated pairs; LB-BSP's throughputs 1,000, 900, 1,200, plain DDP's
    # 1,000, 1,000, 800 (the third pair ran while the machine was faster)
    bench = _load("bench_ddp")
    lb = [{"throughput": t, "run": k} for k, t in enumerate((1000.0, 900.0, 1200.0))]
    ddp = [{"throughput": t, "run": k} for k, t in enumerate((1000.0, 1000.0, 800.0))]

    # Execute
    lb_run, ddp_run = bench.median_run(lb), bench.median_run(ddp)
    ratio = bench._median_ratio(lb_run, ddp_run)

    # Assert: one whole run of median throughput per scheme (not a mix of runs); the
    # ratio is the median of the pairs' ratios (1.0, 0.9, 1.5), not of the medians' (1.0)
    assert (lb_run["run"], lb_run["throughput"]) == (0, 1000.0)
    assert ddp_run["run"] in (0, 1) and ddp_run["throughput"] == 1000.0
    assert lb_run["throughputs"] == [1000.0, 900.0, 1200.0]
    assert ratio == pytest.approx(1.0)
    assert bench._median_ratio(
        {"throughput": 1.0, "throughputs": [900.0, 1200.0, 1100.0]},
        {"throughput": 1.0, "throughputs": [1000.0, 800.0, 1000.0]},
    ) == pytest.approx(1.1)


def test_no_speedup_bound_without_a_homogeneous_case_of_as_many_ranks() -> None:
    # Prepare: only the emulated case ran
    bench = _load("bench_ddp")
    settings = bench.replace(bench.SMOKE, cases=bench.SMOKE.cases[1:])

    # Execute / Assert
    assert bench.speedup_bounds(settings, {"heterogeneous-2": {"ddp": {"throughput": 1.0}}}) == []


@pytest.mark.slow
def test_smoke_run_writes_a_valid_ddp_section(tmp_path: Path) -> None:
    # Execute: the smoke run, torchrun launches included
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_ddp.py"), "--smoke", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip

    # Assert: the section validates; every case has plain DDP, LB-BSP (and Flower where run)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = _load("report")
    data = report.validate_section(json.loads((tmp_path / "ddp.json").read_text()))
    assert data["section"] == "ddp" and data["setting"].startswith("SMOKE RUN")
    rows = data["tables"][0]["rows"]
    schemes = {(row[0], row[1]) for row in rows}
    assert any(s == "Flower cluster mode" for _, s in schemes)
    assert {s for _, s in schemes} == {"plain DDP", "LB-BSP (DDP)", "Flower cluster mode"}
    goals = [f for f in data["figures"] if f["goal"] is not None]
    assert {f["goal"]["target"] for f in goals} == {0.95, 1.05, 1.8, -0.5}
