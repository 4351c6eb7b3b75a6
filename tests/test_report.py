"""Report figures: which measured cost line each run's ideal T* comes from."""

from __future__ import annotations

import pytest

from fl_lbbsp.contract import STEP_BATCH_SIZE
from fl_lbbsp.report import fit_cost_line, run_cost_lines


def _round(sizes: list[int], a: float, b: float) -> dict[str, object]:
    silos = {str(k): {"batch-size": x, "compute-time": a * x + b} for k, x in enumerate(sizes)}
    return {"event": "train", "round": 1, "silos": silos}


def test_each_run_is_held_to_its_own_cost_line() -> None:
    # Prepare: the shared machine was 10% slower while FedAvg (one batch size) ran
    lbbsp = [_round([10, 20, 40, 80], a=0.01, b=0.1), _round([12, 25, 30, 60], a=0.01, b=0.1)]
    fedavg = [_round([32, 32, 32, 32], a=0.011, b=0.11)]
    slowdowns = [1.0, 2.0, 2.0, 4.0]

    # Execute
    pooled, costs = run_cost_lines({"fedavg": fedavg, "lbbsp": lbbsp})

    # Assert: LB-BSP's own line is exact; FedAvg's, through the origin at B_init, gives
    # the exact T* of the slower machine: (a X + n b) / sum(1 / k_i)
    assert costs["lbbsp"].a == pytest.approx(0.01)
    assert costs["lbbsp"].b == pytest.approx(0.1)
    assert not fit_cost_line(fedavg).fitted
    exact = (0.011 * 128 + 4 * 0.11) / sum(1 / k for k in slowdowns)
    assert costs["fedavg"].ideal(slowdowns, 128) == pytest.approx(exact)
    assert pooled.a != pytest.approx(0.01)


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
