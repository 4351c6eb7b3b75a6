"""End to end through Flower's Simulation Engine (Ray), on the embedded data."""

from __future__ import annotations

import pytest

from fl_lbbsp.report import fit_cost_line, summarise
from fl_lbbsp.simulation import SimulationConfig, run

pytestmark = pytest.mark.slow


def test_lbbsp_simulation_balances_emulated_silos(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 silos of emulated capacity 4:2:1, 2 classes each
    config = SimulationConfig(
        scheme="lbbsp",
        silos=3,
        speeds=(4.0, 2.0, 1.0),
        partition="labels:2",
        rounds=4,
        local_steps=10,
        batch_size=32,
        lr=0.05,
        model="mlp",
        out=tmp_path,
    )

    # Execute
    events = run(config)

    # Assert
    train = [e for e in events if e["event"] == "train"]
    evaluate = [e for e in events if e["event"] == "evaluate"]
    assert [e["round"] for e in train] == [1, 2, 3, 4]
    assert len(evaluate) == 5  # initial model and every round
    assert all(e["total_batch_size"] == 96 for e in train)
    assert all(sum(s["batch-size"] for s in e["silos"].values()) == 96 for e in train)
    assert {s["batch-size"] for s in train[0]["silos"].values()} == {32}
    last = train[-1]["silos"]
    assert last["0"]["batch-size"] > last["1"]["batch-size"] > last["2"]["batch-size"]
    assert [last[s]["slowdown"] for s in ("0", "1", "2")] == [1.0, 2.0, 4.0]
    summary = summarise(events, cost=fit_cost_line(events), target_accuracy=0.5, steady_from=3)
    assert summary["emulated"] is True
    assert summary["idle_fraction_steady"] < train[0]["idle_fraction"]
    assert 0.0 <= summary["final_accuracy"] <= 1.0
