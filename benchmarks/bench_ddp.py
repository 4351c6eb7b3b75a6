"""Benchmark section ``ddp``: LB-BSP on torch.distributed against a textbook DDP script
(LeNet-5, MNIST), on equal ranks, beside a real CPU burner, and on emulated unequal ranks.

Every run is a torchrun launch (gloo, CPU, one torch thread per rank) of either
``benchmarks/stock_ddp.py``, the script a user writes from PyTorch's documentation
(``DistributedSampler``, ``DataLoader``, ``DistributedDataParallel(model)`` and its
built-in all-reduce), or ``examples/ddp_lbbsp.py`` (``--mode lbbsp``: balanced batch sizes,
the loss scaled by n B_r / X; ``--mode ddp``: the example's equal split, which can emulate
slowdowns). Cases: 2 and 4 equal ranks and 2 ranks of which rank 0 shares its core with a
CPU-burning process (each rank pinned to one core), LB-BSP against the stock script; 4
ranks with emulated slowdowns 4:2:1:1 (rank i computes for t of CPU time and waits until
k_i t has passed since its compute started), LB-BSP against the example's equal split and
against the stock script on 4 equal ranks (the split's bound: no split of unequal ranks
beats equal fast ones); the same with an emulated cost model; the Flower cluster mode
(``fl_lbbsp.runs.cluster``, every worker in this process) on the emulated case.

The schemes of a case alternate, repeat after repeat (A B, B A, A B, ...), so that load
drift hits both, over an even number of pairs (each scheme runs first as often as
second); a pair is the repeat's two runs, its ratio their throughputs' (samples over
iterations 21-200 over their wall time, the loading of the batches included, an
evaluation not). A short run of each script, discarded, comes before the first case, so
that the first pair does not start cold. The figures give the median pair ratio, the
spread and the medians of the pairs by order, and a table lists every pair with the
iterations LB-BSP ran at unequal sizes and the machine's load average at the time.

Run: ``python benchmarks/bench_ddp.py [--smoke] [--out DIR] [--repeats N] [--cases K,..]``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, dataset, machine, parser
from ddp_figures import (
    NAMES,
    Case,
    case_figures,
    ideal_time,
    median_run,
    pair_rows,
    smallest_batch,
    summarise_ddp,
    summarise_flower,
)
from report import write_section

__all__ = ["FULL", "SMOKE", "Case", "Settings", "ideal_time", "main", "section"]

EXAMPLE = ROOT / "examples" / "ddp_lbbsp.py"
STOCK = ROOT / "benchmarks" / "stock_ddp.py"


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
    timeout: float = 600.0
    repeats: int = 5


FULL = Settings(
    iterations=200,
    eval_every=20,
    skip=20,
    cases=(
        Case("homogeneous-2", "equal, 2 ranks", 2, repeats=12),
        Case("homogeneous-4", "equal, 4 ranks", 4, repeats=6),
        Case("burner-2", "real: CPU burner on rank 0's core, 2 ranks", 2, burner=True,
             repeats=12),
        Case("heterogeneous-4", "heterogeneous 4:2:1:1 (emulated), 4 ranks", 4,
             slowdowns=(4.0, 2.0, 1.0, 1.0), flower=True, bound=True, repeats=6),
        Case("cost-model-4", "heterogeneous 4:2:1:1 (emulated cost model), 4 ranks", 4,
             slowdowns=(4.0, 2.0, 1.0, 1.0), cost_model="0.0004,0.002", repeats=2),
    ),
)  # fmt: skip
SMOKE = Settings(
    repeats=1,
    iterations=12,
    eval_every=6,
    skip=2,
    timeout=300.0,
    cases=(
        Case("homogeneous-2", "equal, 2 ranks", 2),
        Case("heterogeneous-2", "heterogeneous 2:1 (emulated), 2 ranks", 2,
             slowdowns=(2.0, 1.0), flower=True, bound=True),
    ),
)  # fmt: skip


# ---------------------------------------------------------------------------- running
def start_burner(cpu: int) -> subprocess.Popen[bytes]:
    """A process that keeps one CPU core busy (pinned to ``cpu``) until killed, or until
    this process is gone (it outlives no killed benchmark)."""
    code = (
        "import os\n"
        f"os.sched_setaffinity(0, {{{cpu}}}) if hasattr(os, 'sched_setaffinity') else None\n"
        "parent = os.getppid()\n"
        "while os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def command_of(case: Case, scheme: str, settings: Settings, spec: str, log: Path) -> list[str]:
    """The torchrun command of one run: the stock script (``stock``; ``bound``: on as many
    equal ranks, no slowdowns) or the example (``lbbsp``, ``ddp``)."""
    emulated = case.emulated and scheme != "bound"
    eval_every = settings.eval_every if case.emulated else settings.iterations
    common = [
        "--dataset", spec, "--iterations", str(settings.iterations),
        "--batch-size", str(settings.batch_size), "--lr", str(settings.lr),
        "--momentum", str(settings.momentum), "--seed", str(settings.seed),
        "--eval-every", str(eval_every), "--json-log", str(log),
    ]  # fmt: skip
    if case.burner:
        common.append("--pin")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              f"--nproc-per-node={case.ranks}"]  # fmt: skip
    if scheme in ("stock", "bound"):
        return [*launch, str(STOCK), *common]
    command = [*launch, str(EXAMPLE), "--mode", scheme, *common]
    if scheme == "lbbsp":
        command += list(case.lbbsp_args)
    if emulated and case.slowdowns:
        command += ["--slowdowns", ",".join(f"{k:g}" for k in case.slowdowns)]
    if emulated and case.cost_model is not None:
        command += ["--cost-model", case.cost_model]
    return command


def run_ddp(
    case: Case, scheme: str, settings: Settings, spec: str, out: Path, repeat: int = 0
) -> dict[str, Any]:
    """One torchrun launch; its rank-0 log, every rank's compute times (the example's) and
    the 1-minute load average before and after. A launch that fails is run again once,
    from the start (``retries`` in the result): a rank has been seen to abort in gloo's
    teardown ("terminate called without an active exception") after every rank had
    written its log, once in about 40 launches of 4 ranks on a loaded 2-core machine.

    Raises
    ------
    RuntimeError
        When the second launch fails too.
    """
    for attempt in range(2):
        try:
            data = _launch(case, scheme, settings, spec, out, repeat)
        except RuntimeError as err:
            if attempt:
                raise
            print(f"{case.key} {scheme}: the launch failed, run again once:\n"
                  f"{str(err)[-600:]}", flush=True)  # fmt: skip
        else:
            data["retries"] = attempt
            return data
    raise AssertionError("unreachable")


def _launch(
    case: Case, scheme: str, settings: Settings, spec: str, out: Path, repeat: int
) -> dict[str, Any]:
    log = out / f"{case.key}-{scheme}-{repeat + 1}.json"
    log.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    burner = start_burner(0) if case.burner else None
    print(f"{case.key} {scheme}: torchrun, {case.ranks} ranks ...", flush=True)
    load = os.getloadavg()[0]
    try:
        result = subprocess.run(command_of(case, scheme, settings, spec, log), cwd=ROOT,
                                env=env, timeout=settings.timeout, capture_output=True,
                                text=True, check=False)  # fmt: skip
    finally:
        if burner is not None:
            burner.kill()
            burner.wait(10)
    if result.returncode != 0 or not log.is_file():
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{case.key} {scheme}: torchrun exited {result.returncode}\n{tail}")
    data: dict[str, Any] = json.loads(log.read_text())
    data["load"] = [load, os.getloadavg()[0]]
    if "compute" in data:
        data["rank_compute"] = [data["compute"]] + [
            json.loads(log.with_name(f"{log.stem}.rank{r}.json").read_text())["compute"]
            for r in range(1, case.ranks)
        ]
    return data


def warm_up(settings: Settings, spec: str, out: Path) -> None:
    """One short run of each script on 2 ranks, discarded: the section's first pair then
    starts as warm (files, libraries and data in the page cache) as the others."""
    case = Case("warm-up", "warm-up", 2)
    short = replace(settings, iterations=max(2 * settings.skip, 4))
    for scheme in ("stock", "lbbsp"):
        run_ddp(case, scheme, short, spec, out)


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


def run_case(case: Case, settings: Settings, spec: str, out: Path) -> dict[str, dict[str, Any]]:
    """Every repeat of a case's schemes, alternated (A B, B A, ...); each scheme's run of
    median throughput with every repeat's throughput, order and load kept."""
    repeats: dict[str, list[dict[str, Any]]] = {s: [] for s in case.schemes}
    for k in range(case.repeats or settings.repeats):
        order = case.schemes if k % 2 == 0 else tuple(reversed(case.schemes))
        for position, scheme in enumerate(order):
            run = summarise_ddp(run_ddp(case, scheme, settings, spec, out, k), settings.skip)
            run["position"] = position
            repeats[scheme].append(run)
    runs = {s: median_run(repeats[s]) for s in case.schemes}
    if case.flower:
        runs["flower"] = summarise_flower(
            run_flower(case, settings, spec, out), settings.skip,
            smallest_batch(settings.batch_size),
        )  # fmt: skip
    reference = runs[case.reference]
    target = 0.95 * reference["final_accuracy"]
    for s in runs.values():
        s["target"] = target
        s["iterations_to_target"], s["time_to_target"] = _reached(s["evaluations"], target)
    return runs


def _reached(evaluations: list[tuple[int, float, float]], target: float) -> tuple[Any, Any]:
    for iteration, seconds, accuracy in evaluations:
        if accuracy >= target:
            return iteration, seconds
    return None, None


# ------------------------------------------------------------------------- section
def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def section(
    results: dict[str, dict[str, dict[str, Any]]],
    settings: Settings,
    data: str,
    smoke: bool,
    load: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The ``ddp`` section in the benchmark schema; ``load``: the 1-minute load average at
    the start and the end of the run."""
    figures: list[dict[str, Any]] = []
    rows, pairs = [], []
    for case in settings.cases:
        runs = results[case.key]
        figures += case_figures(case, runs)
        pairs += pair_rows(case, runs)
        for scheme, s in runs.items():
            rows.append([
                case.label, NAMES[scheme], _cell(s["throughput"], ".0f"),
                _cell(s["iteration_time"], ".4f"), _cell(s["compute_time"], ".4f"),
                _cell(s["t_star"], ".4f"), _cell(_ratio(s["compute_time"], s["t_star"]), ".3f"),
                _cell(s["iterations_to_target"], "d"), _cell(s["time_to_target"], ".2f"),
                _cell(s["final_accuracy"], ".4f"), " ".join(map(str, s["final_sizes"])),
                _cell(s["overhead"], ".6f"),
            ])  # fmt: skip
    emulated = [c for c in settings.cases if c.emulated]
    counts = sorted({c.repeats or settings.repeats for c in settings.cases})
    setting = (
        f"{'SMOKE RUN (tiny, not a measurement). ' if smoke else ''}"
        f"LeNet-5 on {data}; per-rank batch {settings.batch_size} (LB-BSP: B_init, the "
        f"global batch {settings.batch_size} x ranks), SGD lr {settings.lr}, momentum "
        f"{settings.momentum}, {settings.iterations} iterations per run, seed "
        f"{settings.seed}; throughput over iterations {settings.skip + 1}-"
        f"{settings.iterations} (the loading of the batches in, evaluations out). "
        f"{'/'.join(map(str, counts))} alternated pairs per case (A B, B A, ...; the table "
        "of schemes shows each scheme's run of median throughput, the table of pairs every "
        "pair), after one discarded short run of each script (no cold first pair). Every "
        "run is a `torchrun --standalone` launch, gloo, 1 torch thread per "
        "rank, every rank on this machine. The reference on real ranks is "
        "`benchmarks/stock_ddp.py`, a textbook DDP script (DistributedSampler, DataLoader, "
        "`DistributedDataParallel(model)` with its built-in all-reduce). LB-BSP is "
        "`examples/ddp_lbbsp.py --mode lbbsp` with the `LBBSPCoordinator` defaults: each "
        "rank's loss scaled by n B_r / X (DDP's own all-reduce then gives the weighted "
        "gradient; exactly 1 on equal sizes), the times exchanged in one all_gather every "
        "10 iterations (up to 40 while the windows show the ranks equal, the first "
        "iteration left out of the first window) that runs in the background of the next "
        "iteration, every rank "
        "deciding alike from the same rows, and the sizes held "
        "unless the predicted gain of a move exceeds 2% and twice the ranks' measured "
        "noise in two windows in a row. "
        + (
            "Emulated cases: rank i computes for t seconds of CPU time and waits until k_i t "
            "has passed since its compute started (a machine k_i times slower, of its own); "
            "the stock script cannot emulate, so LB-BSP is paired with the example's equal "
            "split under the same emulation (`--mode ddp`, DDP's built-in all-reduce), and, "
            "for the split's bound, with the stock script on as many equal ranks in the "
            "same rotation: a split only moves samples, so unequal ranks cannot beat equal "
            "fast ones. "
            + "".join(
                f"In the cost-model case rank i instead waits until k_i (m B + b) has passed "
                f"since its compute started, (m, b) = ({c.cost_model}) s, and reports that. "
                for c in emulated
                if c.cost_model is not None
            )
            if emulated
            else ""
        )
        + "The burner case pins each rank to one core and a CPU-burning process to rank 0's, "
        "for both scripts. Times are wall-clock on a machine shared with other jobs"
        + (
            f" (1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end)"
            if load
            else ""
        )  # fmt: skip
        + ". The Flower cluster mode (LB-BSP, every worker in this process one after the "
        "other) reports the emulated iteration time (slowest worker) plus its real "
        f"messaging. Machine: {machine()}."
    )
    return {
        "section": "ddp",
        "title": "LB-BSP on torch.distributed vs a textbook DDP script",
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": "Per case and scheme, the run of median throughput (iteration times "
                f"from iteration {settings.skip + 1})",
                "columns": [
                    "case",
                    "scheme",
                    "throughput (samples/s)",
                    "iteration time (s)",
                    "slowest rank's compute (s)",
                    "T* (s)",
                    "compute / T*",
                    "iterations to target",
                    "time to target (s)",
                    "final accuracy",
                    "final batch sizes",
                    "exchange cost per iteration (s)",
                ],
                "rows": rows,
            },
            {
                "title": "Every pair: LB-BSP and its reference in the same repeat",
                "columns": [
                    "case",
                    "reference",
                    "pair",
                    "order",
                    "LB-BSP (samples/s)",
                    "reference (samples/s)",
                    "ratio",
                    "ratio of median iterations",
                    "LB-BSP final sizes",
                    "LB-BSP iterations at unequal sizes",
                    "LB-BSP exchange / iteration",
                    "load (1 min)",
                ],
                "rows": pairs,
            },
        ],  # fmt: skip
        "plots": [],
        "notes": [
            "Ratio: LB-BSP's throughput over the reference's in the same pair; the figures "
            "give the median over the pairs, their range, and the medians of the pairs where "
            "LB-BSP ran first and second apart.",
            "LB-BSP iterations at unequal sizes: of the measured iterations, those run at "
            "sizes not all equal (on equal ranks: the moves its hold gate let through).",
            "Exchange cost: what LB-BSP's exchange of times and decision cost per iteration "
            "(for each exchange the shortest time any rank spent in it: the last to arrive "
            "waits for nobody), over the run's mean iteration time.",
            "Target accuracy of a case: 95% of the reference's final test accuracy; time to "
            "target is training wall time at the first evaluation reaching it.",
            "T* of a run: from each rank's (batch size, compute time) reports, fitted as "
            "t = a B + b; the iteration time also holds the all-reduce, the optimiser step "
            "and the loader, which no split removes.",
            "Flower cluster mode: one Flower round per iteration, every worker's ClientApp in "
            "this process, so its compute ran alone and its messaging is the in-process "
            "grid's, not a network's.",
        ],
    }


def main() -> int:
    """Run every case, write ``ddp.json``."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--cases", default="",
                     help="comma-separated case keys to run (default: all); a partial run "
                     "is for comparisons and needs an --out other than the report's")  # fmt: skip
    cli.add_argument("--repeats", type=int, default=None,
                     help="pairs per case (default: each case's; smoke: 1)")  # fmt: skip
    cli.add_argument("--logs", type=Path, default=None,
                     help="keep the runs' logs here (default: a temporary folder)")  # fmt: skip
    cli.add_argument("--batch-size", type=int, default=None,
                     help="per-rank batch (default: 64); like --cases")  # fmt: skip
    cli.add_argument("--lbbsp-args", default="",
                     help="options added to LB-BSP's runs, e.g. '--backoff 1 --no-review' "
                     "(default: none); like --cases")  # fmt: skip
    args = cli.parse_args()
    partial = args.cases or args.batch_size is not None or args.lbbsp_args
    if partial and args.out.resolve() == RESULTS.resolve():
        cli.error("--cases, --batch-size and --lbbsp-args write a partial section: pass --out DIR")
    settings = SMOKE if args.smoke else FULL
    if args.cases:
        keys = [k.strip() for k in args.cases.split(",") if k.strip()]
        unknown = sorted(set(keys) - {c.key for c in settings.cases})
        if unknown:
            cli.error(f"unknown case(s) {unknown}; known: {[c.key for c in settings.cases]}")
        settings = replace(settings, cases=tuple(c for c in settings.cases if c.key in keys))
    if args.batch_size is not None:
        settings = replace(settings, batch_size=args.batch_size)
    if args.lbbsp_args:
        extra = tuple(shlex.split(args.lbbsp_args))
        settings = replace(settings, cases=tuple(replace(c, lbbsp_args=extra)
                                                 for c in settings.cases))  # fmt: skip
    if args.repeats is not None:
        if args.repeats < 1:
            cli.error("--repeats must be >= 1")
        cases = tuple(replace(c, repeats=args.repeats) for c in settings.cases)
        settings = replace(settings, repeats=args.repeats, cases=cases)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.WARNING)
    spec, data = dataset()
    if args.smoke:
        spec, data = "embedded", "the embedded digits (scikit-learn, 1,797 images)"
    results: dict[str, dict[str, dict[str, Any]]] = {}
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        logs = Path(folder) if args.logs is None else args.logs
        logs.mkdir(parents=True, exist_ok=True)
        warm_up(settings, spec, logs)
        for case in settings.cases:
            results[case.key] = run_case(case, settings, spec, logs)
            for scheme, s in results[case.key].items():
                print(f"  {NAMES[scheme]:>44}: {s['throughput']:.0f} samples/s (pairs: "
                      f"{' '.join(f'{t:.0f}' for t in s.get('throughputs', []))}), "
                      f"final accuracy {s['final_accuracy']:.4f}", flush=True)  # fmt: skip
    path = write_section(
        section(results, settings, data, args.smoke, (load_start, os.getloadavg()[0])), args.out
    )
    print(f"wrote {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
