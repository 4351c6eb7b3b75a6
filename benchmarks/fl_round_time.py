"""Benchmark: LB-BSP and FedAvg round time against the ideal T* on real data.

Runs ``fl-lbbsp compare`` on the embedded digits and, when present, on the real MNIST test set
(../shared/data/mnist), and prints the ratios users choose by: round time / T*, idle fraction,
LB-BSP's speed-up per round and to the target accuracy. Silo capacities are emulated
(16:8:8:4:4). Results go to runs/bench/<dataset>/report.json and runs/bench/summary.md.

Run: ``.venv/bin/python benchmarks/fl_round_time.py [--rounds 20]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MNIST = ROOT.parent / "shared" / "data" / "mnist"


def _compare(dataset: str, out: Path, rounds: int) -> dict[str, dict[str, float]]:
    cmd = [
        sys.executable, "-m", "fl_lbbsp.cli", "compare", "--dataset", dataset,
        "--silos", "5", "--speeds", "16,8,8,4,4", "--partition", "labels:2",
        "--rounds", str(rounds), "--local-steps", "40", "--batch-size", "48", "--lr", "0.05",
        "--quiet", "--out", str(out), "--json", str(out / "report.json"),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    return json.loads((out / "report.json").read_text())["schemes"]  # type: ignore[no-any-return]


def main() -> None:
    """Run the comparisons and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    datasets = {"embedded": "embedded"}
    if MNIST.exists():
        datasets["mnist"] = f"mnist:{MNIST}"
    else:
        print(f"skipping MNIST: {MNIST} not found")
    lines = [
        "| data | FedAvg round/T* | LB-BSP round/T* | idle FedAvg | idle LB-BSP "
        "| round speed-up | time-to-target speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, spec in datasets.items():
        s = _compare(spec, ROOT / "runs" / "bench" / name, args.rounds)
        f, lb = s["fedavg"], s["lbbsp"]
        tt = (
            f"{f['time_to_target'] / lb['time_to_target']:.2f}x"
            if f["time_to_target"] and lb["time_to_target"]
            else "-"
        )
        lines.append(
            f"| {name} | {f['round_time_over_ideal']:.3f} | {lb['round_time_over_ideal']:.3f} "
            f"| {f['idle_fraction_steady']:.1%} | {lb['idle_fraction_steady']:.1%} "
            f"| {f['round_time_steady'] / lb['round_time_steady']:.2f}x | {tt} |"
        )
    table = "\n".join(lines) + "\n\nSilo capacities emulated (16:8:8:4:4).\n"
    out = ROOT / "runs" / "bench" / "summary.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
