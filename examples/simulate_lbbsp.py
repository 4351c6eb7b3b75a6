"""LB-BSP against FedAvg from Python, on the embedded data (no network, ~2 min on 2 cores).

Five silos of emulated capacities 16:8:8:4:4, two disjoint classes each (the LB-BSP paper's
cross-silo setting). Run: ``.venv/bin/python examples/simulate_lbbsp.py``.
"""

from __future__ import annotations

from pathlib import Path

from fl_lbbsp.runs.fl import SimulationConfig, run
from fl_lbbsp.runs.summary import format_table, run_cost_lines, summarise


def main() -> None:
    """Run both schemes on the same setup and print the side-by-side table."""
    common = {
        "silos": 5,
        "speeds": (16.0, 8.0, 8.0, 4.0, 4.0),
        "partition": "labels:2",
        "rounds": 15,
        "local_steps": 40,
        "batch_size": 48,
        "lr": 0.05,
        "out": Path("runs/example"),
    }
    events = {
        scheme: run(SimulationConfig(scheme=scheme, **common))  # type: ignore[arg-type]
        for scheme in ("fedavg", "lbbsp")
    }
    _, costs = run_cost_lines(events)
    summaries = {s: summarise(e, cost=costs[s], target_accuracy=0.7) for s, e in events.items()}
    print(format_table(summaries))


if __name__ == "__main__":
    main()
