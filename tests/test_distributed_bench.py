"""The ``ddp`` benchmark section, tiny: ``benchmarks/bench_ddp.py --smoke`` launches the
stock DDP script and the example with torchrun (2 gloo ranks) and the Flower cluster mode,
and writes a ``ddp.json`` that follows the report schema; and the section's pure parts
(T*, the pairs' ratios, the figures and goals, the commands)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _run(throughputs: list[float], **extra: Any) -> dict[str, Any]:
    """A scheme's summarised repeats, as ``run_case`` keeps them."""
    runs = [
        {"throughput": t, "final_sizes": [64, 64], "exchange_share": extra.get("share", 0.0),
         "position": k % 2, "load": [1.0, 1.2], "final_accuracy": 0.9,
         "iteration_time": 0.01, "overhead": 1e-5, "compute_time": None, "t_star": None,
         "t_star_floor": None, "time_to_target": None, "target": 0.85}
        for k, t in enumerate(throughputs)
    ]  # fmt: skip
    return _load("ddp_figures").median_run(runs)


def test_repeats_keep_the_median_run_and_every_pair() -> None:
    # Prepare: 3 alternated pairs; LB-BSP's throughputs 1,000, 900, 1,200, the stock
    # script's 1,000, 1,000, 800 (the third pair ran while the machine was faster)
    figures = _load("ddp_figures")
    lb, stock = _run([1000.0, 900.0, 1200.0]), _run([1000.0, 1000.0, 800.0])

    # Execute
    ratios = figures.pair_ratios(lb, stock)

    # Assert: one whole run of median throughput per scheme; the ratios are the pairs'
    # (1.0, 0.9, 1.5), in repeat order, not the medians' ratio
    assert lb["throughput"] == 1000.0 and lb["throughputs"] == [1000.0, 900.0, 1200.0]
    assert ratios == pytest.approx([1.0, 0.9, 1.5])


def test_equal_case_figures_hold_lbbsp_against_the_stock_script() -> None:
    # Prepare: the smoke run's equal case, 3 pairs, an exchange of 0.5% of an iteration
    bench = _load("bench_ddp")
    case = bench.SMOKE.cases[0]
    runs = {"lbbsp": _run([990.0, 1000.0, 930.0], share=0.005),
            "stock": _run([1000.0, 1000.0, 1000.0])}  # fmt: skip

    # Execute
    figures = {f["label"]: f for f in _load("ddp_figures").case_figures(case, runs)}
    rows = _load("ddp_figures").pair_rows(case, runs)

    # Assert: the median pair ratio against >= 0.98 with every pair in the note, the
    # exchange against <= 1%; one table row per pair
    ratio = figures["equal, 2 ranks: LB-BSP throughput / stock DDP's"]
    assert ratio["value"] == pytest.approx(0.99)
    assert ratio["goal"] == {"op": ">=", "target": 0.98}
    assert "0.990, 1.000, 0.930" in ratio["note"] and "slower in 2" in ratio["note"]
    share = figures["equal, 2 ranks: LB-BSP exchange cost / iteration time"]
    assert share["value"] == pytest.approx(0.005) and share["goal"]["target"] == 0.01
    assert [row[2] for row in rows] == ["1", "2", "3"]
    assert [row[6] for row in rows] == ["0.990", "1.000", "0.930"]


def test_emulated_case_is_held_against_the_splits_bound() -> None:
    # Prepare: the smoke run's emulated case: LB-BSP, the equal split, and the stock
    # script on as many equal ranks, 2 triples
    bench = _load("bench_ddp")
    case = bench.SMOKE.cases[1]
    runs = {"lbbsp": _run([900.0, 940.0]), "ddp": _run([600.0, 640.0]),
            "bound": _run([1000.0, 1000.0])}  # fmt: skip

    # Execute
    figures = {f["label"]: f for f in _load("ddp_figures").case_figures(case, runs)}
    rows = _load("ddp_figures").pair_rows(case, runs)

    # Assert: LB-BSP / bound pair by pair (0.90, 0.94), the median against >= 0.9; the
    # bound over the equal split; both references' pairs in the table
    label = case.label
    bound = figures[f"{label}: LB-BSP throughput / the split's bound"]
    assert bound["value"] == pytest.approx(0.92) and bound["goal"]["target"] == 0.9
    gain = figures[f"{label}: the most any split could gain over the equal split"]
    assert gain["value"] == pytest.approx((1000 / 600 + 1000 / 640) / 2)
    assert figures[f"{label}: LB-BSP throughput / the equal split's"]["goal"] is None
    assert {row[1] for row in rows} == {"equal split (the example's --mode ddp)",
                                        "stock DDP on equal ranks (the split's bound)"}  # fmt: skip
    assert len(rows) == 4


def test_case_schemes_alternate_against_their_reference() -> None:
    # Prepare
    bench = _load("bench_ddp")
    equal, burner, emulated = (bench.FULL.cases[k] for k in (0, 2, 3))

    # Assert: the stock script on real ranks; the equal split and the bound when emulated
    assert equal.schemes == ("lbbsp", "stock") and burner.schemes == ("lbbsp", "stock")
    assert emulated.schemes == ("lbbsp", "ddp", "bound")


def test_commands_launch_the_stock_script_or_the_example(tmp_path: Path) -> None:
    # Prepare
    bench = _load("bench_ddp")
    burner, emulated = bench.FULL.cases[2], bench.FULL.cases[3]

    # Execute
    stock = bench.command_of(burner, "stock", bench.FULL, "embedded", tmp_path / "a.json")
    bound = bench.command_of(emulated, "bound", bench.FULL, "embedded", tmp_path / "b.json")
    lbbsp = bench.command_of(emulated, "lbbsp", bench.FULL, "embedded", tmp_path / "c.json")

    # Assert: pinned for the burner; the bound runs the stock script without slowdowns
    assert stock[5].endswith("stock_ddp.py") and "--pin" in stock
    assert bound[5].endswith("stock_ddp.py") and "--slowdowns" not in bound
    assert lbbsp[5].endswith("ddp_lbbsp.py") and lbbsp[lbbsp.index("--mode") + 1] == "lbbsp"
    assert lbbsp[lbbsp.index("--slowdowns") + 1] == "4,2,1,1"


def test_lbbsp_args_reach_only_lbbsps_runs(tmp_path: Path) -> None:
    # Prepare: the burner case with the backoff off for LB-BSP
    from dataclasses import replace

    bench = _load("bench_ddp")
    case = replace(bench.FULL.cases[2], lbbsp_args=("--backoff", "1"))

    # Execute
    lbbsp = bench.command_of(case, "lbbsp", bench.FULL, "embedded", tmp_path / "a.json")
    stock = bench.command_of(case, "stock", bench.FULL, "embedded", tmp_path / "b.json")

    # Assert
    assert lbbsp[-2:] == ["--backoff", "1"] and "--backoff" not in stock


@pytest.mark.slow
def test_smoke_run_writes_a_valid_ddp_section(tmp_path: Path) -> None:
    # Execute: the smoke run, torchrun launches included
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_ddp.py"), "--smoke", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip

    # Assert: the section validates; every scheme ran; the pairs are listed
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = _load("report")
    data = report.validate_section(json.loads((tmp_path / "ddp.json").read_text()))
    assert data["section"] == "ddp" and data["setting"].startswith("SMOKE RUN")
    schemes = {row[1] for row in data["tables"][0]["rows"]}
    assert schemes == {"LB-BSP (DDP)", "stock DDP (textbook script)",
                       "equal split (the example's --mode ddp)",
                       "stock DDP on equal ranks (the split's bound)",
                       "Flower cluster mode"}  # fmt: skip
    assert len(data["tables"][1]["rows"]) == 3
    goals = [f for f in data["figures"] if f["goal"] is not None]
    assert {f["goal"]["target"] for f in goals} == {0.98, 0.01, 0.9, 1.05, 1.8, -0.5}


def test_a_run_counts_its_iterations_at_unequal_sizes() -> None:
    # Prepare: a 2-rank LB-BSP log of 6 iterations, the first 2 skipped; it moved to 60:68
    # at iteration 4 and back at iteration 6
    sizes = [[64, 64], [60, 68], [64, 64], [60, 68], [60, 68], [64, 64]]
    log = {
        "config": {"batch_size": 64},
        "iterations": [{"iteration": k + 1, "wall": 0.01, "sizes": s} for k, s in enumerate(sizes)],
        "evaluations": [{"iteration": 6, "time": 0.06, "accuracy": 0.9}],
        "rebalances": [],
        "summary": {"final_sizes": [64, 64], "training_time": 0.06},
    }

    # Execute
    run = _load("ddp_figures").summarise_ddp(log, 2)

    # Assert: iterations 3-6 measured, 2 of them at unequal sizes
    assert run["unequal_iterations"] == 2


def test_figures_give_the_pairs_by_order_and_the_table_the_unequal_iterations() -> None:
    # Prepare: 4 pairs, LB-BSP first in pairs 1 and 3 (as the alternation runs them)
    bench = _load("bench_ddp")
    figures_module = _load("ddp_figures")
    case = bench.SMOKE.cases[0]
    lb = _run([900.0, 1100.0, 950.0, 1050.0])
    lb["unequal_per_run"] = [0, 12, 0, 0]
    runs = {"lbbsp": lb, "stock": _run([1000.0] * 4)}

    # Execute
    figures = {f["label"]: f for f in figures_module.case_figures(case, runs)}
    rows = figures_module.pair_rows(case, runs)

    # Assert: the medians of the pairs where LB-BSP ran first (0.9, 0.95) and second
    # (1.1, 1.05) apart; the unequal iterations of each pair's LB-BSP run in the table
    note = figures["equal, 2 ranks: LB-BSP throughput / stock DDP's"]["note"]
    assert "LB-BSP first: median 0.925 (2 pairs), second: 1.075 (2)" in note
    balanced = figures["equal, 2 ranks: the same, order-balanced"]
    assert balanced["value"] == pytest.approx((0.925 * 1.075) ** 0.5)
    assert [row[3] for row in rows] == ["LB-BSP first", "LB-BSP later"] * 2
    assert [row[9] for row in rows] == ["0", "12", "0", "0"]


def test_every_full_case_runs_each_scheme_first_as_often_as_second() -> None:
    # Prepare
    bench = _load("bench_ddp")

    # Execute
    counts = {case.key: case.repeats or bench.FULL.repeats for case in bench.FULL.cases}

    # Assert: an even number of alternated pairs in every case
    assert all(n % 2 == 0 for n in counts.values()), counts


@pytest.mark.parametrize(("failures", "retries"), [(0, 0), (1, 1), (2, None)])
def test_a_failed_launch_is_run_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int, retries: int | None
) -> None:
    # Prepare: torchrun stood in for by a launch that fails ``failures`` times, then
    # writes a rank-0 log
    bench = _load("bench_ddp")
    case = bench.Case("equal", "equal", 2)
    calls = []

    def launch(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        if len(calls) <= failures:
            return subprocess.CompletedProcess(command, 1, "", "terminate called")
        Path(command[command.index("--json-log") + 1]).write_text(json.dumps({"summary": {}}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", launch)

    # Execute / Assert: a second failure raises; otherwise the run, with its retries
    if retries is None:
        with pytest.raises(RuntimeError, match="torchrun exited 1"):
            bench.run_ddp(case, "stock", bench.SMOKE, "embedded", tmp_path)
        assert len(calls) == 2
    else:
        data = bench.run_ddp(case, "stock", bench.SMOKE, "embedded", tmp_path)
        assert data["retries"] == retries and len(calls) == failures + 1
