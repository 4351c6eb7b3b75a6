"""The noise budget's trade-off (issue 29): ``python benchmarks/budget_tradeoff.py``.

What raising or lowering the noise budget rho buys in time to accuracy and costs at the
plateau, measured: LB-BSP at the default rho (sqrt 2) and at the budgets of ``--budgets``
against FedAvg, on the same seeds, cells, federation and emulated capacities as the
accuracy study (:mod:`accuracy_study`, whose runs, measures and run cache it shares: its
FedAvg and default-budget runs are not run again when ``--cache`` holds them).

Per cell and rho, over the same seeds (the first ``--seeds`` of each cell): LB-BSP minus
FedAvg at FedAvg's plateau and at equal emulated time (mean, 95% interval), the
time-to-target speed-up (geometric mean, smallest), the update's noise against FedAvg's
(dataset weights, the largest over the seeds) and the ratio of the rounds each scheme
takes to the target, FedAvg's over LB-BSP's (median and range). A seed's speed-up is
about its steady round-time ratio (what the balancer sets, through rho) times that rounds
ratio (where each scheme's noisy accuracy curve first crosses the target, less round 1):
the rounds ratio's spread on seeds whose round-time ratio is the same is what the
accuracy curves' evaluation noise does to the smallest speed-up over many seeds.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import accuracy_study as study_mod
import bench_accuracy as ba
from accuracy_study import number as _n
from common import machine, parser, quiet_logs
from report import write_section

SECTION = "budget-tradeoff"
DEFAULT = "budget"
"""The study's LB-BSP variant: the default balancer (rho = sqrt 2)."""


def scheme_of(rho: float) -> str:
    """The run's scheme name at noise budget ``rho`` (:func:`accuracy_study.strategy`)."""
    return f"{study_mod.BUDGET_AT}{rho:g}"


def budgets_of(text: str) -> tuple[float, ...]:
    """The noise budgets of ``--budgets`` (comma-separated, each at least 1).

    Raises
    ------
    ValueError
        On a value that is not a number of at least 1.
    """
    values = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        value = float(item)
        if not math.isfinite(value) or value < 1.0:
            raise ValueError(f"a noise budget is a number >= 1, got {item!r}")
        values.append(value)
    return tuple(dict.fromkeys(values))


def seed_row(
    fedavg: ba.Trace, lbbsp: ba.Trace, target_share: float, weights: Mapping[str, float]
) -> dict[str, Any]:
    """One seed's figures (:func:`accuracy_study.compare`) and the rounds each scheme
    takes to the target (``None``: never reached)."""
    row = study_mod.compare(fedavg, lbbsp, target_share=target_share, weights=weights)
    same = ba.compare_seed(fedavg, lbbsp, target_share=target_share)
    row["fedavg_rounds"], row["lbbsp_rounds"] = same["fedavg_rounds"], same["lbbsp_rounds"]
    return row


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`accuracy_study.summarise` and the rounds ratio FedAvg / LB-BSP to the
    target: its median, smallest and largest over the seeds where both reach it."""
    out = study_mod.summarise(rows)
    ratios = sorted(
        r["fedavg_rounds"] / r["lbbsp_rounds"]
        for r in rows
        if r.get("fedavg_rounds") and r.get("lbbsp_rounds")
    )
    out["rounds_ratio"] = (
        (statistics.median(ratios), ratios[0], ratios[-1]) if ratios else (None, None, None)
    )
    return out


def run_cells(
    study: study_mod.Study, budgets: Sequence[float], cache: Path | None, minutes: float | None
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per cell and variant, the rows of the seeds run (whole seeds, cell by cell, until
    ``minutes``)."""
    deadline = math.inf if minutes is None else time.monotonic() + 60.0 * minutes
    variants = (DEFAULT, *(scheme_of(rho) for rho in budgets))
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for mix in study.mixes:
        for dataset in study.datasets:
            for partition in study.partitions:
                cell = f"{study_mod.source_name(dataset)} | {mix} | {partition}"
                for seed in study.seeds:
                    if time.monotonic() > deadline:
                        return rows
                    started = time.perf_counter()
                    fedavg, _ = study_mod.trace(
                        study, "fedavg", dataset, mix, partition, seed, cache
                    )
                    for variant in variants:
                        lbbsp, weights = study_mod.trace(
                            study, variant, dataset, mix, partition, seed, cache
                        )
                        row = seed_row(fedavg, lbbsp, study.target_share, weights)
                        rows.setdefault(cell, {}).setdefault(variant, []).append(row)
                    took = time.perf_counter() - started
                    print(f"tradeoff: {cell} seed {seed} ({took:.0f} s)", file=sys.stderr)
    return rows


def _rho(variant: str) -> str:
    return "sqrt 2 (default)" if variant == DEFAULT else variant.removeprefix(study_mod.BUDGET_AT)


def section(
    study: study_mod.Study,
    rows: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    seconds: float,
) -> dict[str, Any]:
    """The section JSON (the schema of benchmarks/report.py): one table row per cell and
    rho; no goals (the study's section holds them)."""
    table = []
    summaries: dict[str, dict[str, Any]] = {}
    for cell, by in rows.items():
        for variant, seeds in by.items():
            s = summaries.setdefault(cell, {})[variant] = summary(seeds)
            median, low, high = s["rounds_ratio"]
            table.append([
                cell, _rho(variant), str(s["seeds"]),
                f"{_n(s['diff_mean'], '+.2f')} [{_n(s['diff_low'], '+.2f')}, "
                f"{_n(s['diff_high'], '+.2f')}]",
                f"{_n(s['equal_time_mean'], '+.2f')}",
                f"{_n(s.get('speedup_geo'), '.2f')}", _n(s["speedup_min"], ".2f"),
                _n(s["weighted_noise_ratio"], ".2f"),
                f"{_n(median, '.2f')} [{_n(low, '.2f')}, {_n(high, '.2f')}]",
            ])  # fmt: skip
    seeds = study.seeds
    setting = (
        f"{study.model} on {', '.join(study_mod.source_name(d) for d in study.datasets)}; the "
        f"accuracy study's mixes, partitions and settings (tau = {study.local_steps}, "
        f"B_init = {study.batch_size}, eta = {study.lr:g}, up to {study.rounds} rounds, "
        f"capacities emulated by the cost model {study.cost_model}, times emulated); seeds "
        f"{seeds[0]}-{seeds[-1]} of every cell, the same seeds for every rho. FedAvg's runs "
        f"and the default budget's are the study's (its cache). {seconds:.0f} s on "
        f"{machine()}."
    )
    return {
        "section": SECTION,
        "title": "The noise budget's trade-off: time to accuracy against accuracy at the plateau",
        "setting": setting,
        "figures": [],
        "tables": [
            {
                "title": "Per cell and noise budget rho: LB-BSP against FedAvg on the same "
                "seeds, means [95% CI]",
                "columns": [
                    "cell",
                    "rho",
                    "seeds",
                    "LB-BSP - FedAvg at plateau (pts)",
                    "at equal emulated time (pts)",
                    "speed-up to target, geo mean",
                    "min speed-up",
                    "max update noise vs FedAvg (dataset weights)",
                    "rounds to target, FedAvg / LB-BSP: median [min, max]",
                ],
                "rows": table,
            }
        ],  # fmt: skip
        "notes": [
            "A larger rho lets the slow silos take smaller batches: shorter rounds, a "
            "noisier update. The rounds ratio is where each scheme's accuracy curve first "
            "crosses the target: below 1, LB-BSP needed more rounds than FedAvg on that "
            "seed. Where the round-time ratio is the same on every seed (labels:2: equal "
            "dataset sizes), the spread of the rounds ratio is the evaluation noise of the "
            "crossing, and the smallest speed-up over many seeds is set by its low end.",
        ],
        "summary": summaries,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run (or resume from ``--cache``) the trade-off and write ``budget-tradeoff.json``."""
    cli = parser("The noise budget's trade-off")
    cli.add_argument("--budgets", default="1.2,2,3", help="noise budgets beside sqrt 2")
    cli.add_argument("--datasets", default="embedded", help="embedded, mnist")
    cli.add_argument("--mixes", default="wide,5:1")
    cli.add_argument("--partitions", default="labels:2,dirichlet:0.3")
    cli.add_argument("--seeds", type=int, default=8, help="the first this many seeds per cell")
    cli.add_argument("--cache", type=Path, default=None, help="the accuracy study's run cache")
    cli.add_argument("--minutes", type=float, default=None, help="stop starting seeds after")
    args = cli.parse_args(argv)
    try:
        budgets = budgets_of(args.budgets)
    except ValueError as err:
        cli.error(str(err))
    if args.seeds < 2:
        cli.error("--seeds must be at least 2")
    unknown = sorted({m.strip() for m in args.mixes.split(",")} - set(study_mod.MIXES))
    if unknown:
        cli.error(f"unknown mixes {unknown}; expected {sorted(study_mod.MIXES)}")
    smoke = args.smoke
    study = study_mod.Study(
        datasets=("embedded",) if smoke else study_mod.datasets_of(args.datasets),
        mixes=tuple(m.strip() for m in args.mixes.split(",")),
        partitions=tuple(p.strip() for p in args.partitions.split(",")),
        seeds=tuple(range(2 if smoke else args.seeds)),
        **(study_mod.SMOKE if smoke else study_mod.FEDERATION),
    )
    started = time.perf_counter()
    with quiet_logs():
        rows = run_cells(study, budgets[:1] if smoke else budgets, args.cache, args.minutes)
    write_section(section(study, rows, time.perf_counter() - started), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
