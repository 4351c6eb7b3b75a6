"""The balancer's decisions on seeded random report sequences, pinned.

``tests/data/balancer_pinned.json`` holds the batch sizes the per-silo balancer (before
the columnar silo table, commit 5eae4d4) handed out on each scenario below; the balancer
must still hand out exactly those. Regenerate (only when a decision is meant to change):
``python tests/test_balancer_pinned.py``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_lbbsp.core import BatchSizeBalancer, SiloReport
from fl_lbbsp.core.settings import BalancingKnobs

PINNED = Path(__file__).parent / "data" / "balancer_pinned.json"
SCENARIOS = 300


def _settings(rng: np.random.Generator) -> dict[str, Any]:
    """Random balancer settings around the defaults."""
    allocator = str(rng.choice(["linear", "linear", "proportional", "iterative"]))
    return {
        "initial_batch_size": int(rng.choice([16, 32, 64])),
        "allocator": allocator,
        "estimator": str(rng.choice(["ema", "ema", "last", "change-ema"])),
        "fit": str(rng.choice(["robust", "robust", "robust", "wls"])),
        "change_sigmas": None if rng.random() < 0.2 else 2.5,
        "common_noise": bool(rng.random() < 0.8),
        "max_change_ratio": None if rng.random() < 0.2 else float(rng.choice([1.5, 2.0, 4.0])),
        "noise_budget": None if rng.random() < 0.3 else float(rng.choice([1.5, 2.0, 4.0])),
        "history": int(rng.choice([5, 10, 20])),
    }


def _report(rng: np.random.Generator, size: int, a: float, b: float, k: float,
            jitter: float, cap: int | None) -> SiloReport:  # fmt: skip
    time = (a * max(size, k) + b) * float(np.exp(rng.normal(0.0, jitter)))
    if rng.random() < 0.05:
        time *= float(rng.choice([0.3, 3.0]))  # a spike
    return SiloReport(
        batch_size=size,
        train_time=time,
        samples=size * 4 if rng.random() < 0.5 else None,
        cpu_percent=50.0,
        memory_percent=40.0,
        max_batch_size=cap,
        fixed_time=0.01 if rng.random() < 0.1 else None,
    )


def scenario(
    seed: int, scalar_rows: int | None = None, silos: int | None = None
) -> list[list[int]]:
    """The batch sizes of every round of one seeded scenario (silos of random cost
    curves, jitter, spikes, co-tenants, a shared slowdown, restarts, bad reports, a
    checkpoint round trip); ``scalar_rows``: the silo table's (0: every fit over arrays);
    ``silos``: that many silos instead of 1 to 6."""
    rng = np.random.default_rng(seed)
    settings = _settings(rng)
    b_init = settings.pop("initial_batch_size")
    balancer = BatchSizeBalancer(initial_batch_size=b_init, knobs=BalancingKnobs(**settings))
    balancer._table.scalar_rows = scalar_rows
    n = int(rng.integers(1, 7)) if silos is None else silos
    ids = [f"s{i}" for i in range(n)]
    a = 1.0 / rng.uniform(50.0, 400.0, n)
    b = rng.uniform(0.0, 0.1, n) * rng.integers(0, 2, n)
    k = rng.uniform(0.0, 48.0, n) * (rng.random(n) < 0.3)
    jitter = float(rng.choice([0.0, 0.02, 0.05, 0.15]))
    caps = [int(rng.integers(24, 200)) if rng.random() < 0.2 else None for _ in ids]
    out = []
    sizes = balancer.allocate(ids)
    for round_ in range(int(rng.integers(8, 25))):
        if rng.random() < 0.1:
            a = a * rng.choice([0.5, 1.0, 2.0], n)  # co-tenants come and go
        shared = float(rng.choice([1.0, 1.0, 1.0, 1.6]))
        reports = {
            silo: _report(rng, sizes[silo], a[i] * shared, b[i], k[i], jitter, caps[i])
            for i, silo in enumerate(ids)
            if rng.random() > 0.05  # a silo missing
        }
        if reports and rng.random() < 0.05:
            reports[next(iter(reports))] = SiloReport(batch_size=0, train_time=1.0)
        if rng.random() < 0.15:
            for silo, report in reports.items():
                with contextlib.suppress(ValueError):
                    balancer.report(silo, report)
        else:
            balancer.report_round(reports)
        # (the iterative allocator needs a report after a restart: not restarted here)
        if rng.random() < 0.05 and settings["allocator"] != "iterative":
            balancer.restart(ids[int(rng.integers(n))])
        if round_ == 6:
            balancer = BatchSizeBalancer.from_json(balancer.to_json())
            balancer._table.scalar_rows = scalar_rows
        sizes = balancer.allocate(ids)
        out.append([sizes[silo] for silo in ids])
    return out


@pytest.fixture(scope="module")
def pinned() -> list[list[list[int]]]:
    data: list[list[list[int]]] = json.loads(PINNED.read_text())
    return data


@pytest.mark.parametrize("scalar_rows", [0, None], ids=["arrays", "default"])
@pytest.mark.parametrize("block", range(5))
def test_the_balancer_hands_out_the_pinned_batch_sizes(
    pinned: list[list[list[int]]], block: int, scalar_rows: int | None
) -> None:
    # Prepare: the fits over arrays (0), or one at a time for a few silos (the default)
    seeds = range(block * SCENARIOS // 5, (block + 1) * SCENARIOS // 5)

    # Execute
    got = {seed: scenario(seed, scalar_rows) for seed in seeds}

    # Assert
    differ = [seed for seed in seeds if got[seed] != pinned[seed]]
    assert differ == []


@pytest.mark.parametrize("seed", range(6))
def test_many_silos_get_the_same_sizes_over_arrays_as_one_at_a_time(seed: int) -> None:
    # Prepare / Execute: 30 silos, every round over arrays, and one silo at a time (the
    # arithmetic of the balancer before the silo table had columns)
    arrays = scenario(1000 + seed, scalar_rows=0, silos=30)
    single = scenario(1000 + seed, scalar_rows=10**6, silos=30)

    # Assert
    assert arrays == single


if __name__ == "__main__":
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps([scenario(seed) for seed in range(SCENARIOS)]) + "\n")
    sys.exit(0)
