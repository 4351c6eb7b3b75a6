"""Report figures: which measured cost line each run's ideal T* comes from."""

from __future__ import annotations

import pytest

from fl_lbbsp.contract import STEP_BATCH_SIZE
from fl_lbbsp.report import fit_cost_line, run_cost_lines


def _round(sizes: list[int], a: float, b: float) -> dict[str, object]:
    silos = {str(k): {"batch-size": x, "compute-time": a * x + b} for k, x in enumerate(sizes)}
    return {"event": "train", "round": 1, "silos": silos}


def test_every_scheme_of_a_comparison_shares_one_cost_line() -> None:
    # Prepare: LB-BSP ran several batch sizes, FedAvg one, on the same machine
    lbbsp = [_round([10, 20, 40, 80], a=0.01, b=0.1), _round([12, 25, 30, 60], a=0.01, b=0.1)]
    fedavg = [_round([32, 32, 32, 32], a=0.01, b=0.1)]
    slowdowns = [1.0, 2.0, 2.0, 4.0]

    # Execute
    line, costs = run_cost_lines({"fedavg": fedavg, "lbbsp": lbbsp})

    # Assert: one line, fitted on both runs, hence one T* for both schemes
    assert costs["lbbsp"] is costs["fedavg"] is line
    assert line.a == pytest.approx(0.01)
    assert line.b == pytest.approx(0.1)
    assert costs["fedavg"].ideal(slowdowns, 128) == costs["lbbsp"].ideal(slowdowns, 128)
    assert not fit_cost_line(fedavg).fitted


def test_cost_modelled_runs_get_the_model_line_whatever_was_measured() -> None:
    # Prepare: silos reported t = tau * k * (m B + b) from a cost model; compute was noise
    config = {"event": "config", "local_steps": 10, "cost_model": "0.002,0.01"}
    runs = {
        name: [config, _round(sizes, a=0.5, b=3.0)]
        for name, sizes in (("fedavg", [32, 32]), ("lbbsp", [50, 14]))
    }

    # Execute
    line, costs = run_cost_lines(runs)

    # Assert: a = tau m, b = tau b, exactly
    assert (line.a, line.b) == pytest.approx((0.02, 0.1))
    assert costs["fedavg"] is costs["lbbsp"] is line


def test_tau_variant_times_count_per_configured_steps() -> None:
    # Prepare: tau = 10 configured; silos ran 5, 10 and 20 steps of 16 samples at
    # 0.002 s per sample + 0.01 s per step (the line at tau: a = 0.02, b = 0.1)
    silos = {
        str(k): {
            "batch-size": 8 * (k + 1),
            STEP_BATCH_SIZE: 16,
            "samples-processed": 16 * steps,
            "compute-time": steps * (0.002 * 16 + 0.01),
        }
        for k, steps in enumerate([5, 10, 20])
    }
    run = [{"event": "config", "local_steps": 10}, {"event": "train", "round": 1, "silos": silos}]

    # Execute
    line = fit_cost_line(run)

    # Assert: every silo counts at its cost of 10 steps of 16: 10 * (0.032 + 0.01)
    assert line.a * 16 + line.b == pytest.approx(0.42)
