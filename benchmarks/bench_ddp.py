"""Benchmark section ``ddp``: plain DDP, LB-BSP on torch.distributed and the Flower cluster
mode side by side (LeNet-5, MNIST), homogeneous and heterogeneous ranks.

Every DDP run is ``examples/ddp_lbbsp.py`` launched with torchrun (gloo, CPU), as a user
would run it: ``--mode ddp`` (equal batches, DDP's mean) or ``--mode lbbsp`` (balanced
batch sizes, weighted gradient). Cases: 2 and 4 homogeneous ranks; 4 ranks with emulated
slowdowns 4:2:1:1 (rank i computes for t of CPU time and waits until k_i t has passed since
its compute started); 2 ranks of which rank
0 shares its CPU core with a CPU-burning process (real heterogeneity: both ranks pinned to
one core each). The Flower cluster mode (``fl_lbbsp.runs.cluster``, every worker in this
process) runs the emulated case with the same data, model, global batch and optimiser.
Each DDP case and scheme runs ``--repeats`` times (default 3), the schemes alternated; the
figures are those of the run of median throughput, the throughput ratio the median of the
pairs'.

Run: ``python benchmarks/bench_ddp.py [--smoke] [--out DIR] [--repeats N]``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, ROOT, dataset, machine, parser
from report import write_section

EXAMPLE = ROOT / "examples" / "ddp_lbbsp.py"
SCHEMES = ("ddp", "lbbsp")
NAMES = {"ddp": "plain DDP", "lbbsp": "LB-BSP (DDP)", "flower": "Flower cluster mode"}


@dataclass(frozen=True)
class Case:
    """One cluster: its ranks and what makes them unequal."""

    key: str
    label: str
    ranks: int
    slowdowns: tuple[float, ...] = ()
    burner: bool = False
    flower: bool = False
    cost_model: str | None = None

    @property
    def emulated(self) -> bool:
        return any(k != 1.0 for k in self.slowdowns)


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full or smoke)."""

    iterations: int
    eval_every: int
    skip: int
    cases: tuple[Case, ...]
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    timeout: float = 900.0
    repeats: int = 3


FULL = Settings(
    iterations=200,
    eval_every=20,
    skip=20,
    cases=(
        Case("homogeneous-2", "homogeneous, 2 ranks", 2),
        Case("homogeneous-4", "homogeneous, 4 ranks", 4),
        Case("heterogeneous-4", "heterogeneous 4:2:1:1 (emulated), 4 ranks", 4,
             slowdowns=(4.0, 2.0, 1.0, 1.0), flower=True),
        Case("cost-model-4", "heterogeneous 4:2:1:1 (emulated cost model), 4 ranks", 4,
             slowdowns=(4.0, 2.0, 1.0, 1.0), cost_model="0.0004,0.002"),
        Case("burner-2", "heterogeneous, real: CPU burner on rank 0's core, 2 ranks", 2,
             burner=True),
    ),
)  # fmt: skip
SMOKE = Settings(
    repeats=1,
    iterations=12,
    eval_every=6,
    skip=2,
    timeout=300.0,
    cases=(
        Case("homogeneous-2", "homogeneous, 2 ranks", 2),
        Case("heterogeneous-2", "heterogeneous 2:1 (emulated), 2 ranks", 2,
             slowdowns=(2.0, 1.0), flower=True),
    ),
)  # fmt: skip


# ---------------------------------------------------------------------------- running
def start_burner(cpu: int) -> subprocess.Popen[bytes]:
    """A process that keeps one CPU core busy (pinned to ``cpu``) until killed."""
    code = (
        "import os\n"
        f"os.sched_setaffinity(0, {{{cpu}}}) if hasattr(os, 'sched_setaffinity') else None\n"
        "while True:\n    pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def run_ddp(case: Case, scheme: str, settings: Settings, spec: str, out: Path) -> dict[str, Any]:
    """One torchrun launch of the example; its rank-0 log."""
    log = out / f"{case.key}-{scheme}.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={case.ranks}", str(EXAMPLE),
        "--mode", scheme, "--dataset", spec, "--iterations", str(settings.iterations),
        "--batch-size", str(settings.batch_size), "--lr", str(settings.lr),
        "--momentum", str(settings.momentum), "--seed", str(settings.seed),
        "--eval-every", str(settings.eval_every), "--json-log", str(log),
    ]  # fmt: skip
    if case.slowdowns:
        command += ["--slowdowns", ",".join(f"{k:g}" for k in case.slowdowns)]
    if case.burner:
        command.append("--pin")
    if case.cost_model is not None:
        command += ["--cost-model", case.cost_model]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    burner = start_burner(0) if case.burner else None
    print(f"{case.key} {scheme}: torchrun, {case.ranks} ranks ...", flush=True)
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, timeout=settings.timeout,
                                capture_output=True, text=True, check=False)  # fmt: skip
    finally:
        if burner is not None:
            burner.kill()
            burner.wait(10)
    if result.returncode != 0 or not log.is_file():
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{case.key} {scheme}: torchrun exited {result.returncode}\n{tail}")
    data: dict[str, Any] = json.loads(log.read_text())
    data["rank_compute"] = [data["compute"]] + [
        json.loads(log.with_name(f"{log.stem}.rank{r}.json").read_text())["compute"]
        for r in range(1, case.ranks)
    ]
    return data


def run_flower(case: Case, settings: Settings, spec: str, out: Path) -> list[dict[str, Any]]:
    """The Flower cluster mode (LB-BSP, every worker in this process) on the same case."""
    from fl_lbbsp.runs.cluster import ClusterConfig, run_cluster_in_process

    fastest = max(case.slowdowns)
    config = ClusterConfig(
        scheme="lbbsp",
        workers=case.ranks,
        speeds=tuple(fastest / k for k in case.slowdowns),
        dataset=spec,
        data="full",
        iterations=settings.iterations,
        batch_size=settings.batch_size,
        lr=settings.lr,
        momentum=settings.momentum,
        seed=settings.seed,
        eval_every=settings.eval_every,
        out=out / f"flower-{case.key}",
    )
    print(f"{case.key} flower: in process, {case.ranks} workers ...", flush=True)
    return run_cluster_in_process(config)


# ----------------------------------------------------------------------- summarising
def ideal_time(
    reports: dict[str, list[tuple[int, float]]], total: int, floor: int = 0
) -> float | None:
    """T* = (X + sum b_i / a_i) / sum 1 / a_i from each rank's fitted cost t_i = a_i B + b_i
    (least squares over its (batch size, seconds per iteration) reports; b_i = 0 when its
    batch sizes spread by less than 10%), DESIGN.md "The ideal to measure against".

    ``floor`` > 0: the ideal when no batch may be smaller (the balancer's smallest batch
    size, ``min_batch_fraction`` of B_init): ranks whose ideal batch falls below it get the
    floor, the others split the rest, and T* is the slowest of them all.
    """
    a, b = [], []
    for pairs in reports.values():
        xs = np.array([p[0] for p in pairs], dtype=np.float64)
        ts = np.array([p[1] for p in pairs], dtype=np.float64)
        if len(xs) == 0:
            return None
        if len(set(xs.tolist())) >= 2 and np.ptp(xs) >= 0.1 * xs.mean():
            slope, intercept = np.polyfit(xs, ts, 1)
            if slope > 0 and intercept >= 0:
                a.append(float(slope))
                b.append(float(intercept))
                continue
        a.append(float(np.mean(ts / xs)))
        b.append(0.0)
    slopes, intercepts = np.array(a), np.array(b)
    fixed = np.zeros(len(slopes), dtype=bool)
    while True:
        free = ~fixed
        if not free.any():
            return float(np.max(slopes * floor + intercepts))
        inverse = 1.0 / slopes[free]
        rest = total - floor * int(fixed.sum())
        t_star = float((rest + np.sum(intercepts[free] * inverse)) / np.sum(inverse))
        below = free & ((t_star - intercepts) / slopes < floor)
        if not below.any():
            pinned = slopes[fixed] * floor + intercepts[fixed]
            return max([t_star, *pinned.tolist()])
        fixed |= below


def smallest_batch(initial_batch_size: int) -> int:
    """The default balancer's smallest batch size for B_init (``min_batch_fraction``)."""
    from fl_lbbsp.core.balancer import BatchSizeBalancer

    return BatchSizeBalancer(initial_batch_size=initial_batch_size).floor


def _reached(evaluations: list[tuple[int, float, float]], target: float) -> tuple[Any, Any]:
    for iteration, seconds, accuracy in evaluations:
        if accuracy >= target:
            return iteration, seconds
    return None, None


def summarise_ddp(log: dict[str, Any], skip: int) -> dict[str, Any]:
    """Throughput, steady iteration time, T*, accuracy trajectory of one DDP run."""
    its = log["iterations"]
    later = its[skip:] or its
    summary = log["summary"]
    reports: dict[str, list[tuple[int, float]]] = {}
    for rebalance in log["rebalances"]:
        for rank, (size, seconds, count) in rebalance["reports"].items():
            reports.setdefault(rank, []).append((size, seconds / count))
    total = sum(its[0]["sizes"])
    floor = smallest_batch(int(log["config"]["batch_size"]))
    per_rank = log["rank_compute"]
    measured = all(t is not None for times in per_rank for t in times)
    slowest = np.max(np.array(per_rank, dtype=np.float64), axis=0) if measured else None
    return {
        "throughput": summary["samples"] / summary["training_time"],
        "iteration_time": float(np.mean([it["wall"] for it in later])),
        "compute_time": None if slowest is None else float(np.mean(slowest[skip:])),
        "t_star": ideal_time(reports, total) if reports else None,
        "t_star_floor": ideal_time(reports, total, floor) if reports else None,
        "evaluations": [(e["iteration"], e["time"], e["accuracy"]) for e in log["evaluations"]],
        "final_accuracy": log["evaluations"][-1]["accuracy"],
        "final_sizes": summary["final_sizes"],
        "overhead": summary["balancer_overhead_per_iteration"],
        "training_time": summary["training_time"],
    }


def summarise_flower(events: list[dict[str, Any]], skip: int, floor: int = 0) -> dict[str, Any]:
    """The same figures for the Flower cluster mode: an iteration is the emulated round
    time (slowest worker) plus the real messaging overhead."""
    train = [e for e in events if e.get("event") == "train" and e.get("round_time")]
    times = np.array([e["round_time"] + (e.get("overhead") or 0.0) for e in train])
    elapsed = np.cumsum(times)
    accuracy = sorted((e["round"], e["accuracy"]) for e in events if e.get("event") == "evaluate")
    samples = sum(e["total_batch_size"] for e in train)
    later = train[skip:] or train
    reports: dict[str, list[tuple[int, float]]] = {}
    for e in later:
        for silo, r in e["silos"].items():
            reports.setdefault(silo, []).append((int(r["batch-size"]), float(r["train-time"])))
    rounds = np.array([e["round_time"] for e in train])
    return {
        "throughput": samples / float(elapsed[-1]),
        "iteration_time": float(np.mean(times[skip:] if len(times) > skip else times)),
        "compute_time": float(np.mean(rounds[skip:] if len(rounds) > skip else rounds)),
        "t_star": ideal_time(reports, int(train[-1]["total_batch_size"])),
        "t_star_floor": ideal_time(reports, int(train[-1]["total_batch_size"]), floor),
        "evaluations": [
            (r, float(elapsed[min(r, len(elapsed)) - 1]), a) for r, a in accuracy if r >= 1
        ],  # fmt: skip
        "final_accuracy": accuracy[-1][1],
        "final_sizes": [train[-1]["silos"][s]["batch-size"] for s in sorted(train[-1]["silos"])],
        "overhead": float(np.mean([e.get("overhead") or 0.0 for e in later])),
        "training_time": float(elapsed[-1]),
    }


# ------------------------------------------------------------------------- section
def _figure(
    label: str, value: float | None, fmt: str, goal: dict[str, Any] | None = None, **extra: str
) -> dict[str, Any]:
    return {"label": label, "value": value, "format": fmt, "unit": extra.get("unit", ""),
            "goal": goal, "note": extra.get("note", "")}  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def case_figures(case: Case, runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures of one case, with the issue's goals."""
    ddp, lb = runs["ddp"], runs["lbbsp"]
    figures = [
        _figure(f"{case.label}: LB-BSP throughput / plain DDP's",
                _median_ratio(lb, ddp), ".3f",
                {"op": ">=", "target": 0.95} if not case.emulated and not case.burner else None,
                unit="x", note=_throughput_note(lb, ddp)),
    ]  # fmt: skip
    if not (case.emulated or case.burner):
        return figures
    hetero_goal = case.emulated
    figures += [
        _figure(f"{case.label}: LB-BSP iteration time / T*",
                _ratio(lb["compute_time"], lb["t_star"]), ".3f",
                {"op": "<=", "target": 1.05} if hetero_goal else None,
                note="the slowest rank's compute time per iteration (what balancing controls) "
                "over T* from each rank's fitted cost line; the paper: within 5% of the ideal"),
        _figure(f"{case.label}: LB-BSP iteration time / T* at the smallest batch",
                _ratio(lb["compute_time"], lb["t_star_floor"]), ".3f",
                note="the same over the ideal when no batch is below the balancer's smallest "
                "batch size (min_batch_fraction of B_init, an accuracy guard): with a large "
                "fixed cost per batch the slowest rank's ideal batch falls below it"),
        _figure(f"{case.label}: LB-BSP wall time per iteration / T*",
                _ratio(lb["iteration_time"], lb["t_star"]), ".3f",
                note="the whole iteration: compute, the all-reduce, the optimiser step, the "
                "loader and the balancer, which no split removes"),
        _figure(f"{case.label}: time-to-accuracy speed-up of LB-BSP over plain DDP",
                _ratio(ddp["time_to_target"], lb["time_to_target"]), ".2f",
                {"op": ">=", "target": 1.8} if hetero_goal else None, unit="x",
                note=f"wall training time to {ddp['target']:.4f} test accuracy (95% of plain "
                "DDP's final)"),
        _figure(f"{case.label}: LB-BSP final accuracy - plain DDP's",
                100 * (lb["final_accuracy"] - ddp["final_accuracy"]), "+.2f",
                {"op": ">=", "target": -0.5} if hetero_goal else None, unit="points",
                note="the same global batch every iteration: the same gradient up to "
                "floating-point order"),
    ]  # fmt: skip
    if "flower" in runs:
        fl = runs["flower"]
        figures.append(
            _figure(f"{case.label}: Flower cluster mode iteration time / LB-BSP on DDP's",
                    _ratio(fl["iteration_time"], lb["iteration_time"]), ".2f", unit="x",
                    note=f"Flower: {fl['overhead']:.3f} s of messaging per iteration")
        )  # fmt: skip
    return figures


def speedup_bounds(
    settings: Settings, results: dict[str, dict[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The most any split could gain over plain DDP in each emulated case: the best
    throughput measured with every rank at the fastest speed (the homogeneous case of as
    many ranks, the better of its schemes: ranks sharing cores are unequal even there, and
    LB-BSP may balance that) over plain DDP's in the case. A split only moves samples
    between ranks, so balanced unequal ranks cannot beat equal fast ones balanced alike:
    where this is below a speed-up goal, the goal asks more than this machine's iteration
    (the all-reduce, the optimiser step and the cores the ranks share) leaves to
    balancing."""
    homogeneous = {c.ranks: c.key for c in settings.cases if not (c.emulated or c.burner)}
    figures = []
    for case in settings.cases:
        if not case.emulated or case.ranks not in homogeneous:
            continue
        fast = max(run["throughput"] for run in results[homogeneous[case.ranks]].values())
        slow = results[case.key]["ddp"]["throughput"]
        figures.append(
            _figure(f"{case.label}: the most any split could gain over plain DDP",
                    _ratio(fast, slow), ".2f", unit="x",
                    note=f"the best of {case.ranks} equal fast ranks, {fast:.0f} samples/s, "
                    f"over plain DDP here, {slow:.0f}: the throughput bound of a perfect split")
        )  # fmt: skip
    return figures


def _median_ratio(lb: dict[str, Any], ddp: dict[str, Any]) -> float | None:
    """Median over the alternated repeats of LB-BSP's throughput / plain DDP's in the same
    pair (the pair shares the load of its minutes)."""
    pairs = zip(lb.get("throughputs", [lb["throughput"]]),
                ddp.get("throughputs", [ddp["throughput"]]), strict=True)  # fmt: skip
    ratios = sorted(r for a, b in pairs if (r := _ratio(a, b)) is not None)
    return ratios[(len(ratios) - 1) // 2] if ratios else None


def _throughput_note(lb: dict[str, Any], ddp: dict[str, Any]) -> str:
    runs = lb.get("throughputs", [lb["throughput"]])
    if len(runs) == 1:
        return f"{lb['throughput']:.0f} vs {ddp['throughput']:.0f} samples/s"
    span = ", ".join(f"{a:.0f} vs {b:.0f}" for a, b in zip(runs, ddp["throughputs"], strict=True))
    return f"median of {len(runs)} alternated pairs; samples/s per pair: {span}"


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def section(
    results: dict[str, dict[str, dict[str, Any]]],
    settings: Settings,
    data: str,
    smoke: bool,
    load: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The ``ddp`` section in the benchmark schema; ``load``: the 1-minute load average at
    the start and the end of the run."""
    figures: list[dict[str, Any]] = speedup_bounds(settings, results)
    rows = []
    for case in settings.cases:
        runs = results[case.key]
        figures += case_figures(case, runs)
        for scheme, s in runs.items():
            rows.append([
                case.label, NAMES[scheme], _cell(s["throughput"], ".0f"),
                _cell(s["iteration_time"], ".4f"), _cell(s["compute_time"], ".4f"),
                _cell(s["t_star"], ".4f"), _cell(_ratio(s["compute_time"], s["t_star"]), ".3f"),
                _cell(_ratio(s["iteration_time"], s["t_star"]), ".3f"),
                _cell(s["iterations_to_target"], "d"), _cell(s["time_to_target"], ".2f"),
                _cell(s["final_accuracy"], ".4f"), " ".join(map(str, s["final_sizes"])),
                _cell(s["overhead"], ".5f"),
            ])  # fmt: skip
    emulated = [c for c in settings.cases if c.emulated]
    setting = (
        f"{'SMOKE RUN (tiny, not a measurement). ' if smoke else ''}"
        f"LeNet-5 on {data}; B_init = {settings.batch_size} per rank (global batch "
        f"{settings.batch_size} x ranks), SGD lr {settings.lr}, momentum {settings.momentum}, "
        f"{settings.iterations} iterations per run, seed {settings.seed}, {settings.repeats} "
        "run(s) per case and scheme, alternated (the table: the run of median throughput), "
        f"test accuracy every "
        f"{settings.eval_every} iterations. Every DDP run is `examples/ddp_lbbsp.py` under "
        "`torchrun --standalone` (gloo, 1 torch thread per rank, every rank on this machine): "
        "plain DDP draws equal batches of the same global batch stream (DistributedSampler's "
        "split); LB-BSP splits the same global batch by the sizes of the default balancer "
        "(`LBBSPCoordinator` defaults: times exchanged every k iterations, k chosen so the "
        "exchange stays under 2% of the wall time; sizes kept while the idle fraction is "
        "within 5%, or while the slowest rank's lead over the others' mean is within 2 "
        "standard errors of the window's per-iteration times) and weights each rank's "
        "gradient by B_i / X in a DDP communication hook. "
        + (
            "Emulated cases: rank i computes for t seconds of CPU time and waits until k_i t "
            "has passed since its compute started (a machine k_i times slower, of its own: "
            "the time it queued for one of the shared cores is in the wait, not multiplied "
            f"by k_i) ({', '.join(c.label for c in emulated if c.cost_model is None)}); "
            "plain DDP then measures compute through the same hook with equal weights (DDP's "
            "mean), to know t. The 4 emulated machines need 1/4 + 1/2 + 1 + 1 = 2.75 of this "
            "machine's cores at T*, more than its 2 (shared with other jobs): there the wall "
            "time is bound by the total CPU work, which no split reduces. "
            + "".join(
                f"In the cost-model case rank i instead waits until k_i (m B + b) has passed "
                f"since its compute started, (m, b) = ({c.cost_model}) s, and reports that: "
                "4 ranks computing at once on 2 cores are CPU-bound whatever the split, "
                "which the modelled times (longer than the real compute) take out. "
                for c in emulated
                if c.cost_model is not None
            )
            if emulated
            else ""
        )
        + "The real case pins each rank to one core and a CPU-burning process to rank 0's. "
        "Times are wall-clock"
        + (
            f" (1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end)"
            if load
            else ""
        )  # fmt: skip
        + ". The Flower "
        "cluster mode (LB-BSP, linear allocator, every worker in this process one after the "
        "other) reports the emulated iteration time (slowest worker) plus its real messaging. "
        f"Machine: {machine()}."
    )
    return {
        "section": "ddp",
        "title": "LB-BSP on torch.distributed vs plain DDP vs the Flower cluster mode",
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": "Per case and scheme (iteration times from iteration "
                f"{settings.skip + 1})",
                "columns": [
                    "case",
                    "scheme",
                    "throughput (samples/s)",
                    "iteration time (s)",
                    "slowest rank's compute (s)",
                    "T* (s)",
                    "compute / T*",
                    "wall / T*",
                    "iterations to target",
                    "time to target (s)",
                    "final accuracy",
                    "final batch sizes",
                    "balancing per iteration (s)",
                ],
                "rows": rows,
            }
        ],  # fmt: skip
        "plots": [],
        "notes": [
            "Target accuracy of a case: 95% of plain DDP's final test accuracy in that case; "
            "time to target is training wall time (evaluation excluded) at the first "
            "evaluation reaching it.",
            "T* of a run: from each rank's (batch size, compute time) reports, fitted as "
            "t = a B + b; the iteration time also holds the all-reduce, the optimiser step "
            "and the balancer, which no split removes.",
            "Balancing per iteration: the all_gather of times, the decision and the broadcast "
            "of sizes, amortised over every iteration.",
            "Flower cluster mode: one Flower round per iteration, every worker's ClientApp in "
            "this process, so its compute ran alone (not beside 3 other ranks) and its "
            "messaging figure is the in-process grid's, not a network's.",
        ],
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput among a scheme's repeats (its figures stay those of one
    run), with every repeat's throughput kept as ``throughputs``."""
    ordered = sorted(runs, key=lambda s: float(s["throughput"]))
    return {**ordered[(len(ordered) - 1) // 2], "throughputs": [s["throughput"] for s in runs]}


def attach_targets(runs: dict[str, dict[str, Any]]) -> None:
    """Target (95% of plain DDP's final accuracy) and each run's time to it."""
    target = 0.95 * runs["ddp"]["final_accuracy"]
    for s in runs.values():
        s["target"] = target
        s["iterations_to_target"], s["time_to_target"] = _reached(s["evaluations"], target)


def main() -> int:
    """Run every case, write ``ddp.json``."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--cases", default="",
                     help="comma-separated case keys to run (default: all); a partial run "
                     "is for comparisons and needs an --out other than the report's")  # fmt: skip
    cli.add_argument("--repeats", type=int, default=None,
                     help="runs per case and scheme, alternated; figures from the run of "
                     "median throughput (default: 3; smoke: 1)")  # fmt: skip
    cli.add_argument("--batch-size", type=int, default=None,
                     help="B_init per rank (default: the settings', 64); like --cases")  # fmt: skip
    args = cli.parse_args()
    if (args.cases or args.batch_size is not None) and args.out.resolve() == RESULTS.resolve():
        cli.error("--cases and --batch-size write a partial section: pass --out DIR")
    settings = SMOKE if args.smoke else FULL
    if args.cases:
        keys = [k.strip() for k in args.cases.split(",") if k.strip()]
        unknown = sorted(set(keys) - {c.key for c in settings.cases})
        if unknown:
            cli.error(f"unknown case(s) {unknown}; known: {[c.key for c in settings.cases]}")
        settings = replace(settings, cases=tuple(c for c in settings.cases if c.key in keys))
    if args.batch_size is not None:
        settings = replace(settings, batch_size=args.batch_size)
    if args.repeats is not None:
        if args.repeats < 1:
            cli.error("--repeats must be >= 1")
        settings = replace(settings, repeats=args.repeats)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.WARNING)
    spec, data = dataset()
    if args.smoke:
        spec, data = "embedded", "the embedded digits (scikit-learn, 1,797 images)"
    results: dict[str, dict[str, dict[str, Any]]] = {}
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for case in settings.cases:
            # the schemes alternate, repeat after repeat, so that load drift hits both
            repeats: dict[str, list[dict[str, Any]]] = {s: [] for s in SCHEMES}
            for _ in range(settings.repeats):
                for s in SCHEMES:
                    repeats[s].append(
                        summarise_ddp(run_ddp(case, s, settings, spec, out), settings.skip)
                    )
            runs = {s: median_run(repeats[s]) for s in SCHEMES}
            if case.flower:
                runs["flower"] = summarise_flower(
                    run_flower(case, settings, spec, out), settings.skip,
                    smallest_batch(settings.batch_size),
                )  # fmt: skip
            attach_targets(runs)
            results[case.key] = runs
            for scheme, s in runs.items():
                print(f"  {NAMES[scheme]:>20}: {s['throughput']:.0f} samples/s, iteration "
                      f"{s['iteration_time']:.4f} s (T* {_cell(s['t_star'], '.4f')}), time to "
                      f"target {_cell(s['time_to_target'], '.2f')} s, final accuracy "
                      f"{s['final_accuracy']:.4f}", flush=True)  # fmt: skip
    path = write_section(
        section(results, settings, data, args.smoke, (load_start, os.getloadavg()[0])), args.out
    )
    print(f"wrote {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
