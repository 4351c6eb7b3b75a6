"""A simulation run twice with the same seed gives the same model: the silos' replies are
sampled, sent and added to the aggregate in the same order every run (Flower samples
nodes in a random order, and a float sum depends on its order in the last bit, which
training then amplifies round after round)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_lbbsp.runs.fl import SimulationConfig, run


def _evaluations(config: SimulationConfig) -> list[tuple[Any, Any]]:
    events = run(config)
    return [(e["loss"], e["accuracy"]) for e in events if e.get("event") == "evaluate"]


def test_the_same_seed_gives_the_same_model_twice(tmp_path: Path) -> None:
    # Prepare: LB-BSP on 10 unequal silos in process, emulated times (no wall clock); in
    # this federation a reply order drawn afresh changed the test loss from round 2 on
    config = SimulationConfig(
        scheme="lbbsp", seed=0, silos=10, speeds=(8, 8, 6, 6, 4, 4, 2, 2, 1, 1),
        partition="labels:2", rounds=6, local_steps=10, batch_size=32, dataset="embedded",
        model="mlp", runtime="inprocess", emulate_wait=False, cost_model="1e-4,5e-4",
        out=tmp_path / "a",
    )  # fmt: skip

    # Execute
    first = _evaluations(config)
    second = _evaluations(config.model_copy(update={"out": tmp_path / "b"}))

    # Assert: every round's test loss and accuracy, bit for bit
    assert len(first) == config.rounds + 1
    assert first == second
