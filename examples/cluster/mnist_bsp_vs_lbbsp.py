"""Cluster mode on real MNIST: BSP, LB-BSP and LB-BSP with naive aggregation.

Four workers of emulated capacities 4:2:1:1 draw i.i.d. batches from the MNIST training
split (../shared/data/mnist, the real 10k test set split 8k/2k). One round is one
synchronous iteration through Flower; the server applies SGD (lr 0.03, momentum 0.9) to the
gradient aggregated with batch-size weights.

Each worker's batch time is emulated with a GPU-shaped cost model
``t(x) = k_i * max(C, m*x + b)`` (here m = 0.05 s/sample, b = 0.5 s, C = 1 s, x_max = 400)
so one iteration takes ~7.4 s (LB-BSP's ideal) to ~15 s (BSP) of emulated time while the real
messaging overhead per iteration (~0.5-1 s in the Simulation Engine on 2 cores) stays
under ~10% of it; the run itself takes a few minutes because nothing waits for the
modelled time. Run from the repository root:

    .venv/bin/python examples/cluster/mnist_bsp_vs_lbbsp.py [--iterations 150]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fl_lbbsp.cli import main as cli

MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"


def main() -> int:
    """Run the three schemes with ``fl-lbbsp cluster`` and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--data", type=Path, default=MNIST, help="folder of the MNIST IDX files")
    parser.add_argument("--out", type=Path, default=Path("runs/cluster-mnist"))
    args = parser.parse_args()
    if not args.data.is_dir():
        print(f"MNIST not found at {args.data}; pass --data DIR", file=sys.stderr)
        return 2
    return cli(
        [
            "cluster",
            "--schemes", "bsp,lbbsp,lbbsp-naive",
            "--workers", "4",
            "--speeds", "4,2,1,1",
            "--dataset", f"mnist:{args.data}",
            "--data", "full",
            "--iterations", str(args.iterations),
            "--batch-size", "64",
            "--lr", "0.03",
            "--momentum", "0.9",
            "--cost-model", "0.05,0.5,1.0,400",
            "--eval-every", "5",
            "--out", str(args.out),
            "--quiet",
        ]
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
