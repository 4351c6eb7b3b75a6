"""Report figures: which measured cost line each run's ideal T* comes from."""

from __future__ import annotations

import pytest

from fl_lbbsp.report import fit_cost_line, run_cost_lines


def _round(sizes: list[int], a: float, b: float) -> dict[str, object]:
    silos = {str(k): {"batch-size": x, "compute-time": a * x + b} for k, x in enumerate(sizes)}
    return {"event": "train", "round": 1, "silos": silos}


def test_each_run_is_held_to_its_own_cost_line_when_it_has_one() -> None:
    # Prepare: the shared machine was 10% slower while FedAvg (one batch size) ran
    lbbsp = [_round([10, 20, 40, 80], a=0.01, b=0.1), _round([12, 25, 30, 60], a=0.01, b=0.1)]
    fedavg = [_round([32, 32, 32, 32], a=0.011, b=0.11)]

    # Execute
    pooled, costs = run_cost_lines({"fedavg": fedavg, "lbbsp": lbbsp})

    # Assert: LB-BSP's own line is exact; FedAvg identifies none and gets the pooled one
    assert costs["lbbsp"].a == pytest.approx(0.01)
    assert costs["lbbsp"].b == pytest.approx(0.1)
    assert not fit_cost_line(fedavg).fitted
    assert costs["fedavg"] is pooled
    assert pooled.a != pytest.approx(0.01)
