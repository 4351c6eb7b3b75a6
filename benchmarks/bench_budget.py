"""Benchmark section ``budget``: the noise budget on wide capacity mixes and bent curves.

The default balancer (``noise_budget`` sqrt(2), no blanket floor) and the balancer of
earlier versions (the blanket floor ``min_batch_fraction`` 1/3, no budget) are driven on
emulated cost curves, as in section ``noise`` (``bench_noise.simulate``): silo i takes
``tau * (a_i * max(x, k_i) + b_i) * noise_i(r)`` for a round, with ``a_i`` set by its
capacity, ``b_i`` zero (``none``) or a mixed fixed cost (``mixed``, 17-50% of the time
at B_init), and ``k_i`` zero or B_init / 2 for every silo (``knee``: GPU silos, flat up
to half of B_init). Cells: the capacity mixes (the wide one of issue 29,
8,8,6,6,4,4,2,2,1,1, and held-out ones), noise-free and at 10% jitter.

Figures per cell: LB-BSP's mean steady round time over T* (the real-valued min-max of the
true curves under the same noise budget), over T* without a budget, over the oracle split
(the integer min-max of the true curves, the same budget and floor), its idle fraction and
the update's noise against FedAvg's (``sum_i 1 / B_i`` over the equal split's, equal
weights); the same for the blanket floor's balancer, whose oracle has its floor and no
budget. One table gives T*(rho) / T*(no budget) of the wide mix for a few budgets.

Run: ``python benchmarks/bench_budget.py [--smoke] [--out DIR] [--mixes wide,H1,...]``;
deterministic, about a minute.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from bench_noise import FULL, PER_SAMPLE, SMOKE, Settings, jitter, simulate
from common import RHO, ideal_time, machine, mark, parser
from report import write_section

from fl_lbbsp.core import BatchSizeBalancer, ideal_round_time
from fl_lbbsp.core.allocation.budget import noise_ratio
from fl_lbbsp.core.settings import BalancingKnobs

SECTION = "budget"
MIXES: dict[str, tuple[float, ...]] = {
    "wide": (8, 8, 6, 6, 4, 4, 2, 2, 1, 1),
    "H1": (12, 3, 3, 1, 1),
    "H2": (5, 5, 5, 5, 1, 1),
    "H3": (3, 2.5, 2, 1.5, 1, 1, 1, 0.5),
    "H4": (16, 8, 4, 2, 1),
    "H5": (10, 1, 1, 1, 1, 1, 1, 1),
}
"""Capacity mixes: ``wide`` is issue 29's; ``H1``-``H5`` were written down before the
budget's default or any rule was chosen and were not looked at while designing them."""
CURVES = ("none", "mixed", "knee")
JITTERS = (0.0, 0.1)
GOAL_IDEAL = 1.15
"""Issue 29: round time / T* at most this on the wide mix without noise."""
GOAL_ORACLE = 1.05
"""Section noise's goal at jitter <= 10%: round time / oracle at most this."""
FLOOR = 1.0 / 3.0
"""The blanket floor of earlier versions (``min_batch_fraction``)."""
BUDGETS = (1.0, 1.1, 1.2, float(np.sqrt(2.0)), 1.5, 2.0, 3.0)


def curves(
    capacity: Sequence[float], curve: str, settings: Settings, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per-step cost curve of each silo: ``a_i`` from its capacity, ``b_i`` and the knee
    ``k_i`` of the curve kind (see the module)."""
    cap = np.asarray(capacity, dtype=np.float64)
    a = PER_SAMPLE * cap.max() / cap
    if curve == "none":
        return a, np.zeros_like(a), None
    if curve == "mixed":
        return a, rng.uniform(0.2, 1.0, len(a)) * a * settings.initial_batch_size, None
    if curve == "knee":
        return a, np.zeros_like(a), np.full(len(a), settings.initial_batch_size / 2.0)
    raise ValueError(f"unknown curve {curve!r}; expected one of {CURVES}")


def floor_balancer(settings: Settings) -> BatchSizeBalancer:
    """The balancer of earlier versions: the blanket floor, no noise budget."""
    return BatchSizeBalancer(
        initial_batch_size=settings.initial_batch_size,
        knobs=BalancingKnobs(min_batch_fraction=FLOOR, noise_budget=None),
    )


def cell(name: str, curve: str, sigma: float, settings: Settings) -> dict[str, Any]:
    """One mix x curve x jitter over the seeds: the default balancer and the floor's."""
    capacity = MIXES[name]
    local = dataclasses.replace(settings, silos=len(capacity))
    out: dict[str, Any] = {"mix": name, "curve": curve, "jitter": sigma}
    for label, make in (("budget", None), ("floor", floor_balancer)):
        rows = []
        for seed in settings.seeds:
            rng = np.random.default_rng([seed, len(capacity), len(curve), int(sigma * 100)])
            a, b, knee = curves(capacity, curve, local, rng)
            noise = jitter(sigma, (local.rounds, local.silos), rng)
            balancer = None if make is None else make(local)
            run = simulate(a, b, noise, np.ones_like(noise), local, balancer=balancer, knee=knee)
            rows.append(run.ratios(local.warmup))
        for key in ("ideal", "ideal_free", "oracle", "idle", "noise_ratio", "fedavg_ideal"):
            out[f"{label}_{key}"] = float(np.mean([r[key] for r in rows]))
        out[f"{label}_oracle_worst"] = float(max(r["oracle"] for r in rows))
    return out


def budget_curve(settings: Settings) -> list[list[str]]:
    """T*(rho) / T*(no budget) and the least-noise share of the wide mix's lines."""
    capacity = MIXES["wide"]
    a = PER_SAMPLE * max(capacity) / np.asarray(capacity, dtype=np.float64)
    b = np.zeros_like(a)
    total = len(capacity) * settings.initial_batch_size
    free = ideal_round_time(a, b, total)
    equal = float(np.max(a * settings.initial_batch_size))
    rows = []
    for rho in BUDGETS:
        t = ideal_time(a, b, total, rho=rho)
        rows.append([f"{rho:.3g}", f"{t / free:.3f}", f"{equal / t:.2f}"])
    proportional = total * (1.0 / a) / np.sum(1.0 / a)
    rows.append(["none", "1.000", f"{equal / free:.2f} (noise {noise_ratio(proportional):.2f})"])
    return rows


def run(settings: Settings, mixes: Sequence[str]) -> list[dict[str, Any]]:
    """Every cell of the mixes."""
    return [
        cell(name, curve, sigma, settings)
        for name in mixes
        for curve in CURVES
        for sigma in JITTERS
    ]


def _figure(label: str, value: float | None, goal: dict[str, Any] | None, note: str,
            fmt: str = ".3f") -> dict[str, Any]:  # fmt: skip
    return {"label": label, "value": value, "format": fmt, "unit": "", "goal": goal, "note": note}


def section(
    cells: list[dict[str, Any]], settings: Settings, smoke: bool, seconds: float
) -> dict[str, Any]:
    """The section JSON (schema of benchmarks/report.py)."""
    figures = []
    for name in dict.fromkeys(c["mix"] for c in cells):
        clean = [c for c in cells if c["mix"] == name and c["jitter"] == 0.0]
        noisy = [c for c in cells if c["mix"] == name and c["jitter"] > 0.0]
        mix = ",".join(f"{v:g}" for v in MIXES[name])
        w = max(clean, key=lambda c: c["budget_ideal"])
        figures.append(
            _figure(
                f"{name} mix {mix}, noise-free: LB-BSP round time / T*, worst curve",
                w["budget_ideal"],
                {"op": "<=", "target": GOAL_IDEAL},
                f"worst of {len(clean)} curves ({w['curve']}); T* under the same noise budget "
                f"(rho {RHO:.3g}); over T* without a budget {w['budget_ideal_free']:.3f}; "
                f"update noise vs FedAvg {w['budget_noise_ratio']:.2f}; the blanket floor "
                f"(1/3 of B_init, no budget): {w['floor_ideal_free']:.3f} x T* without a "
                f"budget, noise {w['floor_noise_ratio']:.2f}",
            )
        )
        if noisy:
            w = max(noisy, key=lambda c: c["budget_oracle"])
            figures.append(
                _figure(
                    f"{name} mix {mix}, jitter 10%: LB-BSP round time / oracle, worst curve",
                    w["budget_oracle"],
                    {"op": "<=", "target": GOAL_ORACLE},
                    f"worst of {len(noisy)} curves ({w['curve']}); worst seed "
                    f"{w['budget_oracle_worst']:.3f}; the oracle under the same budget",
                )
            )
    rows = [
        [
            c["mix"], c["curve"], f"{c['jitter']:.0%}",
            f"{c['budget_ideal']:.3f}", f"{c['budget_ideal_free']:.3f}",
            f"{c['budget_oracle']:.3f}", f"{c['budget_idle']:.1%}",
            f"{c['budget_noise_ratio']:.2f}",
            f"{c['floor_ideal_free']:.3f}", f"{c['floor_oracle']:.3f}",
            f"{c['floor_idle']:.1%}", f"{c['floor_noise_ratio']:.2f}",
            f"{c['budget_fedavg_ideal']:.3f}",
            mark(
                (c["budget_ideal"] <= GOAL_IDEAL if c["jitter"] == 0.0 else None)
                if c["mix"] == "wide" else None
            ),
        ]
        for c in cells
    ]  # fmt: skip
    mixes = "; ".join(f"{n}: {','.join(f'{v:g}' for v in MIXES[n])}" for n in
                      dict.fromkeys(c["mix"] for c in cells))  # fmt: skip
    return {
        "section": SECTION,
        "title": "Noise budget: wide capacity mixes and bent cost curves",
        "setting": (
            f"Emulated (bench_noise.simulate, no Flower): tau = {settings.tau}, B_init = "
            f"{settings.initial_batch_size}, {settings.rounds} rounds, the first "
            f"{settings.warmup} a warm-up; seeds {list(settings.seeds)}. Mixes (capacities, "
            f"fastest first): {mixes}. Curves: none (lines), mixed (fixed cost 17-50% at "
            f"B_init), knee (flat up to B_init / 2). Jitter: log-normal log-sd 0 and 10%. "
            f"LB-BSP: the default balancer (noise budget rho = {RHO:.3g}); floor: the "
            f"blanket floor of earlier versions (1/3 of B_init, no budget). Machine: "
            f"{machine()}; {seconds:.0f} s." + (" Smoke run." if smoke else "")
        ),
        "figures": figures,
        "tables": [
            {
                "title": "Cells (means over the seeds)",
                "columns": [
                    "mix",
                    "curve",
                    "jitter",
                    "LB-BSP / T*",
                    "LB-BSP / T* no budget",
                    "LB-BSP / oracle",
                    "LB-BSP idle",
                    "LB-BSP noise vs FedAvg",
                    "floor / T* no budget",
                    "floor / its oracle",
                    "floor idle",
                    "floor noise vs FedAvg",
                    "FedAvg / T*",
                    "goal",
                ],
                "rows": rows,
            },
            {
                "title": "The wide mix's lines: T*(rho) over T* without a budget",
                "columns": ["rho", "T*(rho) / T*(no budget)", "FedAvg / T*(rho)"],
                "rows": budget_curve(settings),
            },
        ],  # fmt: skip
        "notes": [
            "T* and the oracle honour the balancer's noise budget (shared/DESIGN.md, "
            "'Speed and accuracy together'): round time / T* is what the balancer and noise "
            "cost; the blanket floor's figures are against T* without a budget (its oracle "
            "has the floor).",
            "Update noise vs FedAvg: sum_i 1 / B_i over the equal split's (equal weights), the "
            "variance of the averaged update from minibatch sampling relative to FedAvg's.",
        ],
    }


def main(
    argv: Sequence[str] | None = None, *, report: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Run the cells, print them, write ``budget.json``."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument(
        "--mixes", default="all", help=f"comma-separated mix names of {sorted(MIXES)} or 'all'"
    )
    args = cli.parse_args(argv)
    names = list(MIXES) if args.mixes == "all" else [m.strip() for m in args.mixes.split(",")]
    unknown = sorted(set(names) - set(MIXES))
    if unknown:
        cli.error(f"unknown mixes {unknown}; expected {sorted(MIXES)}")
    settings = SMOKE if args.smoke else FULL
    start = time.perf_counter()
    cells = run(settings, names)
    data = section(cells, settings, args.smoke, time.perf_counter() - start)
    path = write_section(data, args.out)
    (report or _print)(data)
    print(f"wrote {path}")
    return 0


def _print(data: dict[str, Any]) -> None:
    for figure in data["figures"]:
        print(f"{figure['label']}: {figure['value']:.3f}  ({figure['note']})")
    for table in data["tables"]:
        print(f"\n{table['title']}")
        rows = [table["columns"], *table["rows"]]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(table["columns"]))]
        for row in rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
