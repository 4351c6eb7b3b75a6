"""Benchmark section ``cluster``: BSP, LB-BSP and LB-BSP with naive aggregation on a
4-worker parameter-server cluster (LeNet-5, MNIST), against the ideal T*.

Four workers of emulated capacities 4:2:1:1 draw i.i.d. batches from the MNIST training
split; one Flower round is one synchronous iteration (``fl_lbbsp.runs.cluster.run_cluster``,
Simulation Engine). Each worker's batch time comes from a GPU-shaped cost model
``t_i(x) = k_i max(C, m x + b)`` (reported, not waited out); messaging is real.

Run: ``python benchmarks/bench_cluster.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import dataset, machine, parser, save_figure
from report import write_section

SCHEMES = ("bsp", "lbbsp", "lbbsp-naive")
NAMES = {"bsp": "BSP", "lbbsp": "LB-BSP", "lbbsp-naive": "LB-BSP, naive aggregation"}


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full or smoke)."""

    iterations: int
    eval_every: int
    skip: int
    in_process: bool
    workers: int = 4
    speeds: tuple[float, ...] = (4.0, 2.0, 1.0, 1.0)
    batch_size: int = 64
    lr: float = 0.03
    momentum: float = 0.9
    cost_model: str = "0.05,0.5,1.0,400"
    data: str = "full"
    seed: int = 0


FULL = Settings(iterations=150, eval_every=5, skip=5, in_process=False)
SMOKE = Settings(iterations=6, eval_every=3, skip=2, in_process=True)


def ideal_iteration_time(
    cost_model: str, slowdowns: Sequence[float], total: int, *, min_batch_size: int = 1
) -> float:
    """T* for the cost model: the smallest iteration time any split of ``total`` samples
    over the workers can reach, each worker taking at least ``min_batch_size``.

    With t_i(x) = k_i max(C, m x + b) and caps x_max, T* is the larger of the linear
    min-max time (``linear_minmax_continuous`` with a_i = k_i m, b_i = k_i b and the
    bounds) and the largest time of a worker's smallest batch: at that T every worker's
    share keeps it at or below T, floor included, and nothing shorter can be.
    """
    from fl_lbbsp.clients.emulation import CostModel
    from fl_lbbsp.core import linear_minmax_continuous

    cost = CostModel.parse(cost_model)
    k = np.asarray(slowdowns, dtype=np.float64)
    upper = np.full(len(k), np.inf if cost.max_batch_size is None else cost.max_batch_size)
    _, linear = linear_minmax_continuous(
        k * cost.per_sample,
        k * cost.fixed,
        float(total),
        lower=np.full(len(k), float(min_batch_size)),
        upper=upper,
    )
    smallest = max(cost.scaled(float(f)).time(min_batch_size) for f in k)
    return max(float(linear), smallest)


def run(settings: Settings, spec: str, out: Path) -> dict[str, list[dict[str, Any]]]:
    """The three schemes' telemetry events."""
    from fl_lbbsp.runs.cluster import ClusterConfig, run_cluster, run_cluster_in_process

    events = {}
    for scheme in SCHEMES:
        config = ClusterConfig(
            scheme=scheme,
            workers=settings.workers,
            speeds=settings.speeds,
            dataset=spec,
            data=settings.data,  # type: ignore[arg-type]
            iterations=settings.iterations,
            batch_size=settings.batch_size,
            lr=settings.lr,
            momentum=settings.momentum,
            seed=settings.seed,
            cost_model=settings.cost_model,
            eval_every=settings.eval_every,
            out=out,
        )
        print(f"{scheme}: {settings.iterations} iterations ...", flush=True)
        events[scheme] = (run_cluster_in_process if settings.in_process else run_cluster)(config)
    return events


def steady(events: list[dict[str, Any]], skip: int) -> dict[str, float]:
    """Mean iteration time and idle fraction over the iterations after the first ``skip``."""
    train = [e for e in events if e.get("event") == "train" and e.get("round_time")]
    later = train[skip:] or train
    return {
        "time": float(np.mean([e["round_time"] for e in later])),
        "idle": float(np.mean([e["idle_fraction"] for e in later])),
    }


def summarise(
    events: dict[str, list[dict[str, Any]]], settings: Settings
) -> tuple[dict[str, dict[str, Any]], float, float]:
    """Per-scheme summaries (``summarise_cluster`` plus steady figures), the target
    accuracy (95% of BSP's final accuracy, as ``fl-lbbsp cluster``) and T*."""
    from fl_lbbsp.clients.emulation import slowdowns_from_speeds
    from fl_lbbsp.runs.summary import summarise as summarise_cluster

    final = [e["accuracy"] for e in events["bsp"] if e.get("event") == "evaluate"]
    target = 0.95 * final[-1]
    slowdowns = slowdowns_from_speeds(settings.speeds, settings.workers)
    t_star = ideal_iteration_time(
        settings.cost_model, slowdowns, settings.workers * settings.batch_size
    )
    summaries = {}
    for scheme, evs in events.items():
        summary = summarise_cluster(evs, target_accuracy=target)
        summary["steady"] = steady(evs, settings.skip)
        summaries[scheme] = summary
    return summaries, target, t_star


def plot(events: dict[str, list[dict[str, Any]]], t_star: float, out: Path) -> str:
    """Test accuracy against emulated time, and the iteration time of each scheme."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for scheme, evs in events.items():
        train = [e for e in evs if e.get("event") == "train" and e.get("round_time")]
        elapsed = np.concatenate([[0.0], np.cumsum([e["round_time"] for e in train])])
        points = [(e["round"], e["accuracy"]) for e in evs if e.get("event") == "evaluate"]
        rounds = [r for r, _ in points if r <= len(train)]
        left.plot(elapsed[rounds], [a for r, a in points if r <= len(train)], label=NAMES[scheme])
        right.plot(
            [e["round"] for e in train], [e["round_time"] for e in train], label=NAMES[scheme]
        )
    right.axhline(t_star, color="gray", ls="--", lw=1, label="ideal T*")
    left.set_xlabel("emulated training time (s)")
    left.set_ylabel("test accuracy")
    left.legend()
    right.set_xlabel("iteration")
    right.set_ylabel("emulated iteration time (s)")
    right.legend()
    fig.suptitle("4 workers, capacities 4:2:1:1 (emulated), LeNet-5")
    return save_figure(fig, out, "cluster.png")


def _figure(
    label: str, value: float | None, fmt: str, goal: dict[str, Any] | None = None, **extra: str
) -> dict[str, Any]:
    return {"label": label, "value": value, "format": fmt, "unit": extra.get("unit", ""),
            "goal": goal, "note": extra.get("note", "")}  # fmt: skip


def section(
    summaries: dict[str, dict[str, Any]],
    target: float,
    t_star: float,
    settings: Settings,
    data: str,
    smoke: bool,
    plot_name: str,
) -> dict[str, Any]:
    """The ``cluster`` section in the benchmark schema."""
    bsp, lb, naive = (summaries[s] for s in SCHEMES)
    speedup = (
        None
        if not bsp["time_to_target"] or not lb["time_to_target"]
        else bsp["time_to_target"] / lb["time_to_target"]
    )
    unreached = "not computed: a scheme did not reach the target accuracy"
    figures = [
        _figure(
            "LB-BSP iteration time / T*",
            lb["steady"]["time"] / t_star,
            ".3f",
            {"op": "<=", "target": 1.05},
            note=f"mean from iteration {settings.skip + 1}; T* = {t_star:.3f} s from the cost "
            "model; the paper: within 5% of the ideal",
        ),
        _figure(
            "LB-BSP idle fraction (barrier waste)",
            lb["steady"]["idle"],
            ".2%",
            {"op": "<", "target": 0.03},
            note="1 - mean_i t_i / max_i t_i, mean over the same iterations; the paper: < 5%",
        ),
        _figure(
            "BSP iteration time / T*",
            bsp["steady"]["time"] / t_star,
            ".3f",
            note=f"BSP's idle fraction {bsp['steady']['idle']:.1%}",
        ),  # fmt: skip
        _figure(
            "time-to-accuracy speed-up of LB-BSP over BSP",
            speedup,
            ".2f",
            unit="x",
            note=f"emulated time to {target:.4f} test accuracy (95% of BSP's final)"
            if speedup is not None
            else unreached,
        ),
        _figure(
            "LB-BSP final accuracy - BSP's",
            100 * (lb["final_accuracy"] - bsp["final_accuracy"]),
            "+.2f",
            {"op": ">=", "target": -1.0},
            unit="points",
            note="weighted aggregation keeps BSP's convergence",
        ),
        _figure(
            "LB-BSP naive aggregation final accuracy - BSP's",
            100 * (naive["final_accuracy"] - bsp["final_accuracy"]),
            "+.2f",
            unit="points",
            note="the plain mean over-weights the small batches (Eq. 6)",
        ),
    ]
    for scheme in SCHEMES:
        s = summaries[scheme]
        figures.append(
            _figure(
                f"iterations to target, {NAMES[scheme]}",
                s["iterations_to_target"],
                "d",
                note=f"evaluated every {settings.eval_every} iterations"
                if s["iterations_to_target"] is not None
                else "target not reached",
            )
        )
    rows = []
    for scheme in SCHEMES:
        s = summaries[scheme]
        sizes = " ".join(f"{w}={b}" for w, b in s["batch_sizes_final"].items())
        rows.append(
            [
                NAMES[scheme],
                f"{s['steady']['time']:.3f}",
                f"{s['steady']['time'] / t_star:.3f}",
                f"{s['steady']['idle']:.1%}",
                "-" if s["overhead_mean"] is None else f"{s['overhead_mean']:.3f}",
                "-" if s["iterations_to_target"] is None else str(s["iterations_to_target"]),
                "-" if s["time_to_target"] is None else f"{s['time_to_target']:.1f}",
                f"{s['final_accuracy']:.4f}",
                sizes,
            ]
        )
    engine = (
        "every worker's ClientApp in the benchmark's process (InProcessGrid), so the messaging "
        "figures are not Flower's"
        if settings.in_process
        else "Flower's Simulation Engine (Ray), one ClientApp per worker"
    )
    setting = (
        f"{'SMOKE RUN (tiny, not a measurement). ' if smoke else ''}"
        f"{settings.workers} workers, LeNet-5 on {data}; every iteration the workers draw one "
        f"i.i.d. global batch of {settings.workers * settings.batch_size} samples from the "
        f'shared training split (`data="{settings.data}"`) and split it by their batch '
        "sizes; the server (parameter server) aggregates the gradients (weighted by batch "
        f"size, or the naive mean) and applies SGD (lr {settings.lr}, momentum "
        f"{settings.momentum}); {settings.iterations} iterations per scheme, seed "
        f"{settings.seed}, test accuracy every {settings.eval_every} iterations, run on "
        f"{engine}. Worker capacities {':'.join(f'{s:g}' for s in settings.speeds)} are "
        "emulated: worker i reports the batch time of the cost model t_i(x) = k_i max(C, m x + b)"
        f" with (m, b, C, x_max) = ({settings.cost_model}) and k_i its slowdown (nothing "
        "waits for it); messaging time is real wall time. LB-BSP: EMA(0.2) speed predictor, "
        f"linear allocator. T* = {t_star:.3f} s from the same cost model. Machine: {machine()}."
    )
    notes = [
        f"Target accuracy {target:.4f} (95% of BSP's final test accuracy, as `fl-lbbsp cluster`).",
        "With the shared training set the workers' batches together are BSP's global batch, "
        "so weighted aggregation computes BSP's exact gradient: the same iterations to the "
        "target, each iteration shorter.",
        "The cost model has no noise, so once the balancer has fitted it (a few iterations) "
        "LB-BSP sits at the integer optimum; the predictors section measures real noise.",
    ]
    return {
        "section": "cluster",
        "title": "Cluster mode: BSP, LB-BSP and naive aggregation, 4 workers on MNIST",
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": f"Per scheme (iteration figures from iteration {settings.skip + 1})",
                "columns": [
                    "scheme",
                    "iteration time (s)",
                    "/ T*",
                    "idle",
                    "messaging per iteration (s, real)",
                    "iterations to target",
                    "emulated time to target (s)",
                    "final accuracy",
                    "final batch sizes",
                ],
                "rows": rows,
            }
        ],
        "plots": [plot_name],
        "notes": notes,
    }


def main() -> int:
    """Run the three schemes, write ``cluster.json`` and the plot."""
    args = parser(__doc__.splitlines()[0]).parse_args()
    settings = SMOKE if args.smoke else FULL
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.WARNING)
    spec, data = dataset()
    with tempfile.TemporaryDirectory() as folder:
        events = run(settings, spec, Path(folder))
    summaries, target, t_star = summarise(events, settings)
    plot_name = plot(events, t_star, args.out)
    path = write_section(
        section(summaries, target, t_star, settings, data, args.smoke, plot_name), args.out
    )
    for scheme in SCHEMES:
        s = summaries[scheme]
        print(
            f"{NAMES[scheme]:>26}: iteration {s['steady']['time']:.3f} s "
            f"({s['steady']['time'] / t_star:.3f} T*), idle {s['steady']['idle']:.1%}, "
            f"final accuracy {s['final_accuracy']:.4f}, "
            f"iterations to target {s['iterations_to_target']}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
