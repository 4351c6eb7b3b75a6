"""What every benchmark section script shares: its command line, the data it runs on,
the machine it ran on, and writing its section and plots."""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MNIST = ROOT.parent / "shared" / "data" / "mnist"

__all__ = ["MNIST", "RESULTS", "ROOT", "dataset", "machine", "parser", "save_figure"]


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every section takes: ``--out DIR`` and ``--smoke``."""
    args = argparse.ArgumentParser(description=description)
    args.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)"
    )
    args.add_argument(
        "--smoke", action="store_true", help="a tiny run that only checks the pipeline"
    )
    return args


def dataset(mnist: Path = MNIST) -> tuple[str, str]:
    """The dataset spec to run on and its description: real MNIST (the 10k test set in
    ``shared/data/mnist``) when present, else the embedded digits."""
    if (mnist / "t10k-images-idx3-ubyte.gz").is_file() or (
        mnist / "t10k-images-idx3-ubyte"
    ).is_file():
        return f"mnist:{mnist}", "real MNIST (the 10,000-image test set, split 8k train / 2k test)"
    return "embedded", (
        f"the embedded digits (scikit-learn, 1,797 images; MNIST not found at {mnist})"
    )


def machine() -> str:
    """One line on the machine: CPUs, Python, platform."""
    return (
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )


def save_figure(figure: Any, out: Path, name: str) -> str:
    """Save a matplotlib figure as ``out/name`` (PNG), close it, return the file name."""
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / name, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return name
