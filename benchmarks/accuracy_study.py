"""The accuracy study of the noise budget (issue 29): ``python benchmarks/accuracy_study.py``.

FedAvg, LB-BSP with the noise budget (the default balancer) and LB-BSP with the blanket
floor of earlier versions (``min_batch_fraction`` 1/3, no budget) on the same seeds,
datasets, non-IID partitions and emulated capacity mixes, through the real strategies and
silo app in process (as section ``accuracy``). Per seed and LB-BSP variant, against
FedAvg:

* final accuracy at FedAvg's plateau: the first round P (at least ``2 W``) at which
  FedAvg's mean test accuracy over the last W rounds gains less than ``delta`` points on the
  W rounds before (the last round when it never does: the seed is marked), each scheme's
  mean accuracy over rounds ``P - W + 1 .. P``, the difference in points;
* accuracy at equal emulated time: T the LB-BSP run's emulated time at round P; FedAvg's
  mean accuracy over its W rounds up to the last one ended by T against LB-BSP's over rounds
  ``P - W + 1 .. P``;
* time-to-target speed-up: FedAvg's emulated time to the seed's target (a share of the
  lower of the two best accuracies) over LB-BSP's.

Per cell (dataset x mix x partition) and variant: each figure's mean with a 95% interval
(Student's t over the seeds; the speed-up's on its log), the smallest speed-up, and on how
many seeds LB-BSP's accuracy at equal time is at least FedAvg's. Runs are cached (one JSON
trace each) so that a grid can be run in pieces: ``--cache DIR``; ``--minutes M`` stops
starting runs after M minutes and writes what completed (whole seeds only).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bench_accuracy as ba
from common import MNIST, machine, parser, quiet_logs

from fl_lbbsp.core.allocation.budget import noise_ratio
from fl_lbbsp.runs.fl import SimulationConfig, make_strategy, run
from fl_lbbsp.strategies import LBBSPFedAvg

SECTION = "accuracy-budget"
MIXES: dict[str, tuple[float, ...]] = {
    "wide": (8, 8, 6, 6, 4, 4, 2, 2, 1, 1),
    "5:1": (5, 4, 3, 2, 1),
}
SCHEMES = ("fedavg", "budget", "floor")
VARIANTS = ("budget", "floor")
WINDOW = 5
"""W: rounds a plateau and an accuracy are averaged over."""
DELTA = 0.5
"""Points of mean accuracy a window must gain on the one before for FedAvg to be still
climbing."""
GOAL_DIFF = -0.5
GOAL_SPEEDUP = 1.5
FLOOR = 1.0 / 3.0
FEDERATION: dict[str, Any] = {
    "rounds": 50, "local_steps": 10, "batch_size": 32, "lr": 0.1, "model": "mlp"
}  # fmt: skip
"""The study's federation settings (its command line's defaults), which the trade-off
section shares so that its runs are the study's cached ones."""
SMOKE: dict[str, Any] = {**FEDERATION, "rounds": 4, "local_steps": 2, "batch_size": 8}
"""The same for ``--smoke``."""
BUDGET_AT = "budget@"
"""Scheme-name prefix of LB-BSP at another noise budget: ``budget@2`` runs rho = 2
(``budget_tradeoff.py``)."""


@dataclass(frozen=True)
class Study:
    """The grid and the federation of the study."""

    datasets: tuple[str, ...]
    mixes: tuple[str, ...]
    partitions: tuple[str, ...]
    seeds: tuple[int, ...]
    rounds: int
    local_steps: int
    batch_size: int
    lr: float
    model: str
    cost_model: str = ba.COST_MODEL
    target_share: float = ba.TARGET_SHARE
    seeds_by_dataset: tuple[tuple[str, int], ...] = ()
    """Seed counts that replace ``seeds`` for some datasets (see :func:`seeds_of`)."""
    floor_seeds: int | None = None
    """The blanket floor (a reference: the design the budget replaced) runs on the first
    this many seeds of each cell only; ``None``: on every seed."""

    def schemes_of(self, seed: int) -> tuple[str, ...]:
        """The schemes run on ``seed``: FedAvg and the budget always, the floor on the
        first ``floor_seeds``."""
        floor = self.floor_seeds is None or seed < self.floor_seeds
        return SCHEMES if floor else tuple(s for s in SCHEMES if s != "floor")

    def seeds_of(self, dataset: str) -> tuple[int, ...]:
        """The seeds run on ``dataset``: ``range(n)`` where ``seeds_by_dataset`` names its
        source (``embedded``, ``mnist``), else ``seeds``."""
        counts = dict(self.seeds_by_dataset)
        n = counts.get(source_name(dataset).lower())
        return self.seeds if n is None else tuple(range(n))

    def config(
        self, scheme: str, dataset: str, mix: str, partition: str, seed: int, out: Path
    ) -> SimulationConfig:
        speeds = MIXES[mix]
        return SimulationConfig(
            scheme="fedavg" if scheme == "fedavg" else "lbbsp",
            seed=seed,
            silos=len(speeds),
            speeds=speeds,
            partition=partition,
            rounds=self.rounds,
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            lr=self.lr,
            dataset=dataset,
            model=self.model,  # type: ignore[arg-type]
            min_batch_fraction=FLOOR if scheme == "floor" else 0.0,
            runtime="inprocess",
            emulate_wait=False,
            cost_model=self.cost_model,
            out=out,
        )


def strategy(scheme: str, config: SimulationConfig) -> LBBSPFedAvg:
    """FedAvg and the budget variant as :func:`make_strategy` builds them; the floor
    variant with the blanket floor and no budget; ``budget@RHO`` the budget variant at
    noise budget RHO."""
    if scheme == "floor":
        changes: dict[str, Any] = {"min_batch_fraction": FLOOR, "noise_budget": None}
    elif scheme.startswith(BUDGET_AT):
        changes = {"noise_budget": float(scheme.removeprefix(BUDGET_AT))}
    else:
        return make_strategy(config)
    return LBBSPFedAvg(
        fraction_evaluate=0.0,
        **{
            **config.strategy_settings(),
            "local_steps": config.local_steps,
            "balance": True,
            "check_times": False,
            **changes,
        },
    )


def cache_path(
    study: Study, scheme: str, dataset: str, mix: str, partition: str, seed: int, cache: Path | None
) -> Path | None:
    """Where one run's trace is cached (``None``: no cache): named by every setting of the
    run, the grid's lists left out."""
    if cache is None:
        return None
    key = {**asdict(study), "datasets": None, "mixes": None, "partitions": None, "seeds": None}
    del key["seeds_by_dataset"], key["floor_seeds"]
    key.update(scheme=scheme, dataset=dataset, mix=mix, partition=partition, seed=seed)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache / f"{scheme}-{digest}.json"


def trace(
    study: Study,
    scheme: str,
    dataset: str,
    mix: str,
    partition: str,
    seed: int,
    cache: Path | None,
) -> tuple[ba.Trace, dict[str, float]]:
    """One run's trace and its silos' dataset sizes (the aggregation weights), from
    ``cache`` when a run of the same settings left them there (``None``: always run)."""
    path = cache_path(study, scheme, dataset, mix, partition, seed, cache)
    if path is not None and path.is_file():
        saved = json.loads(path.read_text())
        return ba.Trace(**saved["trace"]), saved["weights"]
    with tempfile.TemporaryDirectory() as scratch:
        config = study.config(scheme, dataset, mix, partition, seed, Path(scratch))
        events = run(config, strategy=strategy(scheme, config))
    result = ba.trace_of(events)
    weights: dict[str, float] = {}
    for event in events:
        if event.get("event") == "train":
            for silo, row in event["silos"].items():
                if row.get("num-examples"):
                    weights.setdefault(silo, float(row["num-examples"]))
    if cache is None or path is None:
        return result, weights
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trace": asdict(result), "weights": weights}))
    return result, weights


# ------------------------------------------------------------------------- measures
def plateau(accuracy: Sequence[float | None], window: int = WINDOW, delta: float = DELTA) -> int:
    """FedAvg's plateau round (1-based, see the module); the last round if none."""
    acc = [0.0 if a is None else a for a in accuracy]
    for end in range(2 * window, len(acc) + 1):
        now = statistics.fmean(acc[end - window : end])
        before = statistics.fmean(acc[end - 2 * window : end - window])
        if 100.0 * (now - before) < delta:
            return end
    return len(acc)


def window_mean(accuracy: Sequence[float | None], end: int, window: int = WINDOW) -> float:
    """Mean accuracy of rounds ``end - window + 1 .. end`` (1-based)."""
    values = [a for a in accuracy[max(0, end - window) : end] if a is not None]
    return statistics.fmean(values) if values else math.nan


def rounds_by(elapsed: Sequence[float], seconds: float) -> int:
    """Rounds completed within ``seconds`` of emulated time."""
    return sum(1 for t in elapsed if t <= seconds * (1 + 1e-12))


def compare(
    fedavg: ba.Trace,
    lbbsp: ba.Trace,
    *,
    target_share: float,
    weights: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Per-seed figures of one LB-BSP variant against FedAvg (see the module);
    ``weights``: the silos' dataset sizes, for the update's noise as the budget weighs it."""
    end = min(plateau(fedavg.accuracy), len(lbbsp.accuracy))
    climbing = end == len(fedavg.accuracy) and plateau(fedavg.accuracy) == len(fedavg.accuracy)
    final_f, final_l = window_mean(fedavg.accuracy, end), window_mean(lbbsp.accuracy, end)
    seconds = lbbsp.elapsed[end - 1]
    fed_end = rounds_by(fedavg.elapsed, seconds)
    at_time_f = window_mean(fedavg.accuracy, fed_end) if fed_end else 0.0
    same = ba.compare_seed(fedavg, lbbsp, target_share=target_share)
    return {
        "plateau": end,
        "climbing": climbing,
        "fedavg_final": final_f,
        "lbbsp_final": final_l,
        "diff": 100.0 * (final_l - final_f),
        "equal_time_seconds": seconds,
        "equal_time_fedavg_rounds": fed_end,
        "equal_time_diff": 100.0 * (final_l - at_time_f),
        "speedup": same["speedup"],
        "noise_ratio": same["noise_ratio"],
        "weighted_noise_ratio": _weighted_noise(lbbsp, weights),
        "min_batch_size": same["lbbsp_min_batch_size"],
    }


def _weighted_noise(lbbsp: ba.Trace, weights: Mapping[str, float] | None) -> float | None:
    """The update's noise over the equal split's with the dataset-size weights, at the
    steady batch sizes (what the budget bounds)."""
    sizes = ba.steady_batch_sizes(lbbsp.batch_sizes) if lbbsp.batch_sizes else {}
    if not sizes or not weights or set(sizes) - set(weights):
        return None
    silos = list(sizes)
    return noise_ratio([sizes[s] for s in silos], weights=[weights[s] for s in silos])


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per cell and variant: means with 95% intervals over the seeds."""
    diffs = [r["diff"] for r in rows]
    times = [r["equal_time_diff"] for r in rows]
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    out: dict[str, Any] = {"seeds": len(rows), "climbing": sum(r["climbing"] for r in rows)}
    for name, values in (("diff", diffs), ("equal_time", times)):
        mean, low, high = ba.mean_ci(values) if values else (math.nan,) * 3
        out.update({f"{name}_mean": mean, f"{name}_low": low, f"{name}_high": high})
    if speedups:
        mean, low, high = ba.mean_ci([math.log(s) for s in speedups])
        out.update(
            speedup_geo=math.exp(mean), speedup_low=math.exp(low), speedup_high=math.exp(high)
        )
    out["speedup_min"] = min(speedups) if len(speedups) == len(rows) and rows else None
    out["equal_time_seeds_ok"] = sum(t >= 0 for t in times)
    for key in ("noise_ratio", "weighted_noise_ratio"):
        noise = [r[key] for r in rows if r[key] is not None]
        out[key] = max(noise) if noise else None
    sizes = [r["min_batch_size"] for r in rows if r["min_batch_size"] is not None]
    out["min_batch_size"] = min(sizes) if sizes else None
    return out


# ------------------------------------------------------------------------------- runs
def run_grid(
    study: Study,
    cache: Path | None,
    minutes: float | None,
    *,
    cached_only: bool = False,
    jobs: int = 1,
) -> dict[str, dict[int, Any]]:
    """Every cell, seed and scheme (cached), cell by cell, until ``minutes``; with
    ``cached_only`` only the seeds whose every run is in ``cache`` (nothing is run).

    ``jobs`` > 1: that many worker processes run the seeds side by side (each run's times
    are emulated and a seed's runs are reproducible, so which process runs a seed does not
    change its figures); the rows come
    back in the same order, and ``minutes`` stops the starting of seeds.
    """
    deadline = math.inf if minutes is None else time.monotonic() + 60.0 * minutes
    tasks: list[tuple[str, str, str, str, int]] = []
    # Cell by cell, every seed of one before the next: a cut grid has whole cells.
    for mix in study.mixes:
        for dataset in study.datasets:
            for partition in study.partitions:
                cell = f"{source_name(dataset)} | {mix} | {partition}"
                for seed in study.seeds_of(dataset):
                    if cached_only and not all(
                        (p := cache_path(study, s, dataset, mix, partition, seed, cache))
                        and p.is_file()
                        for s in study.schemes_of(seed)
                    ):
                        continue
                    tasks.append((cell, dataset, mix, partition, seed))
    rows: dict[str, dict[int, Any]] = {}

    def record(task: tuple[str, str, str, str, int], runs: Mapping[str, Any], took: float) -> None:
        cell, seed = task[0], task[4]
        rows.setdefault(cell, {})[seed] = {
            v: compare(
                runs["fedavg"][0], runs[v][0], target_share=study.target_share, weights=runs[v][1]
            )
            for v in VARIANTS
            if v in runs
        }
        print(f"study: {cell} seed {seed} done ({took:.0f} s)", file=sys.stderr, flush=True)

    if jobs <= 1 or cached_only:  # nothing to run: no workers
        for task in tasks:
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            record(task, _seed_runs(study, cache, task), time.perf_counter() - started)
        return rows
    context = multiprocessing.get_context("spawn")  # no torch state forked into a worker
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        pending: deque[tuple[tuple[str, str, str, str, int], Future[Any], float]] = deque()
        queued = iter(tasks)
        for task in queued:  # keep every worker busy, no more, so the deadline can cut
            pending.append((task, pool.submit(_seed_runs, study, cache, task), time.perf_counter()))
            if len(pending) >= jobs:
                break
        while pending:
            task, future, started = pending.popleft()
            record(task, future.result(), time.perf_counter() - started)
            following = next(queued, None) if time.monotonic() <= deadline else None
            if following is not None:
                pending.append(
                    (
                        following,
                        pool.submit(_seed_runs, study, cache, following),
                        time.perf_counter(),
                    )
                )
    return rows


def _seed_runs(
    study: Study, cache: Path | None, task: tuple[str, str, str, str, int]
) -> dict[str, tuple[ba.Trace, dict[str, float]]]:
    """Every scheme's run of one seed (see :func:`trace`); module-level for the workers."""
    _, dataset, mix, partition, seed = task
    with quiet_logs():
        return {
            s: trace(study, s, dataset, mix, partition, seed, cache) for s in study.schemes_of(seed)
        }


def source_name(dataset: str) -> str:
    """A data source as the tables name it (``MNIST`` for any ``mnist:PATH``)."""
    return "MNIST" if dataset.startswith("mnist") else dataset


def number(value: float | None, spec: str) -> str:
    """A table cell: ``value`` in ``spec``, ``-`` when unknown or not finite (an interval
    of one seed)."""
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _ci(s: Mapping[str, Any], name: str) -> str:
    return (
        f"{number(s[f'{name}_mean'], '+.2f')} [{number(s[f'{name}_low'], '+.2f')}, "
        f"{number(s[f'{name}_high'], '+.2f')}]"
    )


def section(
    study: Study,
    rows: Mapping[str, Mapping[int, Any]],
    seconds: float,
    name: str = SECTION,
) -> dict[str, Any]:
    """The section JSON (the schema of benchmarks/report.py)."""
    summary = {
        cell: {v: summarise([per[v] for per in seeds.values() if v in per]) for v in VARIANTS}
        for cell, seeds in rows.items()
    }
    figures, table, per_seed = [], [], []
    for cell, by in summary.items():
        b, f = by["budget"], by["floor"]
        figures.append({
            "label": f"LB-BSP - FedAvg at FedAvg's plateau, 95% lower bound, {cell}",
            "value": b["diff_low"] if math.isfinite(b["diff_low"]) else None,
            "format": "+.2f", "unit": "points", "goal": {"op": ">=", "target": GOAL_DIFF},
            "note": f"mean {_ci(b, 'diff')} over {b['seeds']} seeds; blanket floor "
            f"{_ci(f, 'diff')}; seeds whose FedAvg did not plateau: {b['climbing']}",
        })  # fmt: skip
        figures.append({
            "label": f"Time-to-target speed-up, min over seeds, {cell}",
            "value": b["speedup_min"], "format": ".2f", "unit": "x",
            "goal": {"op": ">=", "target": GOAL_SPEEDUP},
            "note": f"geometric mean {number(b.get('speedup_geo'), '.2f')} [95% "
            f"{number(b.get('speedup_low'), '.2f')}, {number(b.get('speedup_high'), '.2f')}]; "
            "blanket "
            f"floor min {number(f['speedup_min'], '.2f')}, geometric mean "
            f"{number(f.get('speedup_geo'), '.2f')}",
        })  # fmt: skip
        figures.append({
            "label": f"Seeds where LB-BSP's accuracy at equal emulated time >= FedAvg's, {cell}",
            "value": float(b["equal_time_seeds_ok"]), "format": "g", "unit": "seeds",
            "goal": {"op": ">=", "target": float(b["seeds"])},
            "note": f"LB-BSP - FedAvg at equal time {_ci(b, 'equal_time')} points; blanket "
            f"floor {_ci(f, 'equal_time')} ({f['equal_time_seeds_ok']} of {f['seeds']} seeds)",
        })  # fmt: skip
        for variant, s in by.items():
            table.append([
                cell, variant, str(s["seeds"]), _ci(s, "diff"), _ci(s, "equal_time"),
                f"{s['equal_time_seeds_ok']} of {s['seeds']}",
                f"{number(s.get('speedup_geo'), '.2f')} [{number(s.get('speedup_low'), '.2f')}, "
                f"{number(s.get('speedup_high'), '.2f')}]",
                number(s["speedup_min"], ".2f"), number(s["weighted_noise_ratio"], ".2f"),
                number(s["noise_ratio"], ".2f"),
                number(s["min_batch_size"], "g"), str(s["climbing"]),
            ])  # fmt: skip
        for seed, per in rows[cell].items():
            for variant in (v for v in VARIANTS if v in per):
                r = per[variant]
                per_seed.append([
                    cell, str(seed), variant, str(r["plateau"]), f"{r['fedavg_final']:.3f}",
                    f"{r['lbbsp_final']:.3f}", f"{r['diff']:+.2f}",
                    f"{r['equal_time_diff']:+.2f}", number(r["speedup"], ".2f"),
                    number(r["noise_ratio"], ".2f"),
                ])  # fmt: skip
    setting = (
        f"{study.model} on {', '.join(source_name(d) for d in study.datasets)}; mixes "
        + "; ".join(f"{m} ({':'.join(f'{v:g}' for v in MIXES[m])})" for m in study.mixes)
        + f"; partitions {', '.join(study.partitions)}; seeds {_seed_text(study)} (those "
        f"completed are in the tables); tau = {study.local_steps}, B_init = "
        f"{study.batch_size}, eta = {study.lr:g}, up to {study.rounds} rounds; capacities "
        f"emulated by the cost model {study.cost_model} (seconds per sample and step of the "
        f"fastest silo) scaled by each silo's slowdown; silos in process, times emulated. "
        f"LB-BSP (budget): the default balancer (noise budget sqrt 2, weights the dataset "
        f"sizes). Floor: min_batch_fraction 1/3, no budget"
        + ("" if study.floor_seeds is None else f", on the first {study.floor_seeds} seeds")
        + f". Plateau: window {WINDOW} rounds, "
        f"gain < {DELTA} points. {seconds:.0f} s on {machine()}."
    )
    if study.seeds_by_dataset:
        setting += f" {SEEDS_PRINCIPLE}"
    return {
        "section": name,
        "title": "Accuracy under the noise budget: LB-BSP against FedAvg, beside the floor"
        + ("" if name == SECTION else f" ({study.rounds} rounds)"),
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": "Per cell and LB-BSP variant: means over seeds [95% CI]",
                "columns": [
                    "cell",
                    "variant",
                    "seeds",
                    "LB-BSP - FedAvg at plateau (pts)",
                    "at equal emulated time (pts)",
                    "seeds >= FedAvg at equal time",
                    "speed-up to target, geo mean [95% CI]",
                    "min speed-up",
                    "max update noise vs FedAvg (dataset weights)",
                    "max update noise vs FedAvg (equal weights)",
                    "min steady B",
                    "seeds FedAvg still climbing",
                ],
                "rows": table,
            },
            {
                "title": "Per seed",
                "columns": [
                    "cell",
                    "seed",
                    "variant",
                    "plateau round",
                    "FedAvg acc",
                    "LB-BSP acc",
                    "diff (pts)",
                    "diff at equal time (pts)",
                    "speed-up",
                    "noise vs FedAvg",
                ],
                "rows": per_seed,
            },
        ],  # fmt: skip
        "notes": [
            "Accuracies are central test accuracies after each round (the held-out split of "
            "each seed); differences are per seed, then averaged; 95% intervals are "
            "Student's t over the seeds (the speed-up's on its logarithm).",
        ],
        "summary": summary,
        "runs": {cell: {str(seed): per for seed, per in by.items()} for cell, by in rows.items()},
    }


SEEDS_PRINCIPLE = (
    "More seeds where an evaluation is coarser: the embedded set's test split holds 359 "
    "images against MNIST's 2,000, so one evaluation's binomial standard deviation at 90% "
    "accuracy is 1.6 points against 0.7; equal interval widths would ask about 5 times the "
    "seeds (the counts run are in the seeds above)."
)


def _seed_text(study: Study) -> str:
    def span(seeds: Sequence[int]) -> str:
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(list(seeds))

    text = span(study.seeds)
    extra = [f"{d}: {span(tuple(range(n)))}" for d, n in study.seeds_by_dataset]
    return text + (f" ({'; '.join(extra)})" if extra else "")


def keep_cells(data: dict[str, Any], earlier: Mapping[str, Any], source: str) -> list[str]:
    """Add to ``data`` (a section of this run) the cells of ``earlier`` (a section of the
    same study from an earlier run) that this run did not run: their figures, table rows,
    per-seed rows and summary, and a line in the setting naming them and ``source``.
    Returns the cells kept."""
    ran = set(data["summary"])
    kept = [cell for cell in earlier.get("summary", {}) if cell not in ran]
    if not kept:
        return []
    for cell in kept:
        data["figures"].extend(f for f in earlier["figures"] if f["label"].endswith(f", {cell}"))
        for mine, theirs in zip(data["tables"], earlier["tables"], strict=True):
            mine["rows"].extend(r for r in theirs["rows"] if r[0] == cell)
        data["summary"][cell] = earlier["summary"][cell]
        if cell in earlier.get("runs", {}):
            data["runs"][cell] = earlier["runs"][cell]
    data["setting"] += (
        f" Cells kept from an earlier run of this study ({source}), not rerun here: "
        f"{', '.join(kept)}; that run's setting: {earlier['setting']}"
    )
    return kept


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (an interval of one seed) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run (or resume) the study and write ``accuracy-budget.json``."""
    cli = parser("The accuracy study of the noise budget")
    cli.add_argument("--datasets", default="embedded,mnist", help="embedded, mnist")
    cli.add_argument("--mixes", default="wide,5:1", help=f"in order, of {sorted(MIXES)}")
    cli.add_argument("--partitions", default="labels:2,dirichlet:0.3")
    cli.add_argument("--seeds", type=int, default=8)
    cli.add_argument(
        "--seeds-for",
        default="embedded=24",
        help="seed counts per dataset that replace --seeds, e.g. embedded=24 (the default: "
        "more seeds where the test split is smaller; '' for none)",
    )
    cli.add_argument(
        "--floor-seeds",
        type=int,
        default=8,
        help="run the blanket floor (the reference) on the first this many seeds of a cell "
        "only (default 8; 0: every seed)",
    )
    cli.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="an earlier accuracy-budget.json: its cells that this run does not run are "
        "copied into this one's section, named as kept in its setting",
    )
    cli.add_argument(
        "--rounds",
        type=int,
        default=FEDERATION["rounds"],
        help="the horizon: FedAvg's plateau or this many",
    )
    cli.add_argument("--local-steps", type=int, default=FEDERATION["local_steps"])
    cli.add_argument("--batch-size", type=int, default=FEDERATION["batch_size"])
    cli.add_argument("--lr", type=float, default=FEDERATION["lr"])
    cli.add_argument("--model", default=FEDERATION["model"], choices=["mlp", "lenet5"])
    cli.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="folder of run traces to reuse and add to (default: none; a trace does not "
        "record the code that made it, so reuse one only for the same commit)",
    )
    cli.add_argument("--minutes", type=float, default=None, help="stop starting runs after")
    cli.add_argument(
        "--cached-only",
        action="store_true",
        help="run nothing: the section from the seeds whose runs are all in --cache",
    )
    cli.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes running seeds side by side (default 1: in this process). "
        "It helps only where a run leaves CPUs idle: on 2 cores, 4 seeds took 36-38 s with "
        "2 workers against 24-31 s in one process",
    )
    cli.add_argument(
        "--name", default=SECTION, help=f"section id, and file name (default {SECTION})"
    )
    args = cli.parse_args(argv)
    datasets = datasets_of(args.datasets)
    smoke = args.smoke
    counts = _counts(cli, args.seeds_for)
    study = Study(
        datasets=("embedded",) if smoke else datasets,
        mixes=tuple(m.strip() for m in args.mixes.split(",")),
        partitions=tuple(p.strip() for p in args.partitions.split(",")),
        seeds=tuple(range(2 if smoke else args.seeds)),
        rounds=SMOKE["rounds"] if smoke else args.rounds,
        local_steps=SMOKE["local_steps"] if smoke else args.local_steps,
        batch_size=SMOKE["batch_size"] if smoke else args.batch_size,
        lr=args.lr,
        model=args.model,
        seeds_by_dataset=() if smoke else counts,
        floor_seeds=None if smoke or args.floor_seeds <= 0 else args.floor_seeds,
    )
    unknown = sorted(set(study.mixes) - set(MIXES))
    if unknown:
        cli.error(f"unknown mixes {unknown}; expected {sorted(MIXES)}")
    started = time.perf_counter()
    if args.cached_only and args.cache is None:
        cli.error("--cached-only needs --cache")
    if args.jobs < 1:
        cli.error("--jobs must be at least 1")
    rows = run_grid(study, args.cache, args.minutes, cached_only=args.cached_only, jobs=args.jobs)
    data = section(study, rows, time.perf_counter() - started, args.name)
    if args.keep is not None:
        keep_cells(data, json.loads(args.keep.read_text()), str(args.keep))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    path.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")
    for row in data["tables"][0]["rows"]:
        print(" | ".join(row))
    print(path)
    return 0


def datasets_of(text: str) -> tuple[str, ...]:
    """The data sources of ``--datasets`` (comma-separated; ``mnist``: the shared set)."""
    return tuple(
        f"mnist:{MNIST.resolve()}" if d.strip() == "mnist" else d.strip() for d in text.split(",")
    )


def _counts(cli: Any, text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, count = item.partition("=")
        if (
            name.strip().lower() not in ("embedded", "mnist")
            or not count.isdigit()
            or int(count) < 2
        ):
            cli.error(f"--seeds-for wants embedded|mnist=count (count >= 2), got {item!r}")
        out.append((name.strip().lower(), int(count)))
    return tuple(out)


if __name__ == "__main__":
    raise SystemExit(main())
