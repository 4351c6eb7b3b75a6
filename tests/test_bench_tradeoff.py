"""The noise budget's trade-off section (benchmarks/budget_tradeoff.py): its budgets, the
rounds ratio on injected rows, the strategy of a ``budget@RHO`` run, and the smoke run's
section (tiny rounds, embedded data) with its runs reused from the cache."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import accuracy_study  # noqa: E402
import budget_tradeoff  # noqa: E402

from fl_lbbsp.runs.fl import SimulationConfig  # noqa: E402


def test_budgets_are_parsed_in_order_without_repeats() -> None:
    # Execute / Assert
    assert budget_tradeoff.budgets_of("2, 1.2,2,,3") == (2.0, 1.2, 3.0)
    assert budget_tradeoff.budgets_of("") == ()


@pytest.mark.parametrize("text", ["0.5", "nan", "inf", "two", "1,-3"])
def test_a_budget_below_one_or_not_a_number_is_refused(text: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError):
        budget_tradeoff.budgets_of(text)


def _row(fedavg_rounds: int | None, lbbsp_rounds: int | None, diff: float) -> dict[str, Any]:
    return {
        "diff": diff, "equal_time_diff": 1.0, "speedup": 2.0, "climbing": False,
        "noise_ratio": 1.2, "weighted_noise_ratio": 1.3, "min_batch_size": 5,
        "fedavg_rounds": fedavg_rounds, "lbbsp_rounds": lbbsp_rounds,
    }  # fmt: skip


def test_summary_gives_the_rounds_ratio_over_the_seeds_that_reach_the_target() -> None:
    # Prepare: FedAvg's rounds over LB-BSP's 8/14, 10/10, 12/8; one seed never reached it
    rows = [_row(8, 14, -1.0), _row(10, 10, 0.0), _row(12, 8, 1.0), _row(None, 9, 0.5)]

    # Execute
    out = budget_tradeoff.summary(rows)

    # Assert: the median and range of the three, and the study's own figures beside them
    median, low, high = out["rounds_ratio"]
    assert median == pytest.approx(1.0)
    assert low == pytest.approx(8 / 14)
    assert high == pytest.approx(1.5)
    assert out["seeds"] == 4
    assert out["diff_mean"] == pytest.approx(0.125)


def test_a_budget_run_gets_its_noise_budget_and_keeps_the_rest() -> None:
    # Prepare
    config = SimulationConfig(scheme="lbbsp", silos=3, speeds=(3, 2, 1), rounds=2,
                              runtime="inprocess", emulate_wait=False)  # fmt: skip

    # Execute
    at_two = accuracy_study.strategy(budget_tradeoff.scheme_of(2.0), config)
    default = accuracy_study.strategy("budget", config)

    # Assert: rho 2 where asked; every other balancing setting as the default run's
    two, base = at_two.engine.config, default.engine.config
    assert two.noise_budget == 2.0
    assert base.noise_budget != 2.0
    assert two.model_copy(update={"noise_budget": base.noise_budget}) == base


def test_smoke_run_writes_a_section_and_reuses_the_cached_runs(tmp_path: Path) -> None:
    # Prepare
    cache = tmp_path / "cache"
    levels = [logging.getLogger(n).level for n in ("flwr", "fl_lbbsp")]
    args = ["--smoke", "--mixes", "5:1", "--partitions", "dirichlet:0.3", "--budgets", "2",
            "--cache", str(cache)]  # fmt: skip

    # Execute
    assert budget_tradeoff.main([*args, "--out", str(tmp_path)]) == 0
    runs = sorted(p.name for p in cache.iterdir())
    again = tmp_path / "again"
    assert budget_tradeoff.main([*args, "--out", str(again)]) == 0

    # Assert: the process's loggers as they were (a test after this one still sees
    # Flower's warnings)
    assert [logging.getLogger(n).level for n in ("flwr", "fl_lbbsp")] == levels

    # Assert: one row per rho and cell, FedAvg's and both budgets' runs cached once
    data = json.loads((tmp_path / "budget-tradeoff.json").read_text())
    assert data["section"] == "budget-tradeoff"
    rows = data["tables"][0]["rows"]
    assert [row[1] for row in rows] == ["sqrt 2 (default)", "2"]
    assert {row[2] for row in rows} == {"2"}
    assert len(runs) == 3 * 2  # fedavg, budget, budget@2 on 2 seeds
    assert sorted(p.name for p in cache.iterdir()) == runs  # nothing new ran
    assert json.loads((again / "budget-tradeoff.json").read_text())["tables"] == data["tables"]
