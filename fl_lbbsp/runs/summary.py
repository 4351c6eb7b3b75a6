"""Summaries of runs, FL and cluster alike: one summary per run (:func:`summarise`: round or
iteration time, T*, idle fraction, messaging, accuracy and emulated time to a target
accuracy), one side-by-side table (:func:`format_table`), the cost lines T* is computed
from, and the comparison plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..clients.emulation import CostModel, SlowdownSchedule
from ..contract import STEP_BATCH_SIZE
from ..core import fit_linear_cost, ideal_round_time, linear_minmax_continuous
from ..strategies.rounds import format_silos, natural_key

__all__ = [
    "CostLine",
    "fit_cost_line",
    "HEATMAP_FROM",
    "comparison_figure",
    "format_table",
    "modelled_cost_line",
    "plot_comparison",
    "run_cost_lines",
    "run_failure",
    "slowdowns_at",
    "summarise",
]

Events = Sequence[dict[str, Any]]


class CostLine:
    """This machine's measured compute cost of a round: ``t = a * B + b`` (seconds).

    Silo i, emulated ``k_i`` times slower, costs ``k_i * (a * B + b)``.
    """

    def __init__(self, a: float, b: float, *, fitted: bool = True) -> None:
        self.a, self.b = a, b
        self.fitted = fitted
        """False when the runs had one batch size only: a line through the origin."""

    def ideal(self, slowdowns: Sequence[float], total: int, *, min_batch_size: int = 1) -> float:
        """Ideal round time with a_i = k_i a, b_i = k_i b.

        ``T* = (X + sum b_i/a_i) / sum 1/a_i`` (shared/DESIGN.md) when every silo's share
        at T* is at least ``min_batch_size``; otherwise the exact min-max with that lower
        bound (a silo cannot run less than one sample per step).
        """
        k = np.asarray(slowdowns, dtype=np.float64)
        a, b = k * self.a, k * self.b
        t_star = ideal_round_time(a, b, total)
        if np.all((t_star - b) / a >= min_batch_size):
            return t_star
        x, _ = linear_minmax_continuous(a, b, float(total), lower=np.full(len(k), min_batch_size))
        return float(np.max(a * x + b))


def _train_events(events: Events) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "train"]


def run_failure(events: Events) -> str | None:
    """Why a run produced no model, in one line; ``None`` if any round was aggregated.

    A run whose every round was skipped (every reply rejected, or too few valid ones)
    has nothing to summarise. The line names the reason the silos' replies were
    rejected, e.g. ``"every silo failed in every round: ImportError: ..."``, or the
    most common reasons when they differ.
    """
    train = _train_events(events)
    if not train:
        return "no round was run"
    if any(e.get("skipped") is None for e in train):
        return None
    reasons = [
        str(r.get("reason", "")).removeprefix("error reply: ")
        for e in train
        for r in e.get("rejected") or ()
    ]
    replied = [e for e in train if e.get("silos")]
    if reasons and not replied:
        counts: dict[str, int] = {}
        for reason in reasons:
            counts[reason] = counts.get(reason, 0) + 1
        ranked = sorted(counts, key=lambda r: -counts[r])
        if len(ranked) == 1:
            return f"every silo failed in every round: {ranked[0]}"
        others = len(ranked) - 1
        return (
            f"every silo failed in every round, most often with: {ranked[0]} "
            f"({counts[ranked[0]]} of {len(reasons)} replies; {others} other reason"
            f"{'s' if others > 1 else ''} in the telemetry)"
        )
    last = str(train[-1].get("skipped"))
    return f"every round was skipped ({len(train)} of {len(train)}), the last because: {last}"


def fit_cost_line(*runs: Events) -> CostLine:
    """Fit the unemulated ``compute-time`` against batch size over every silo and round.

    Every silo runs on this same machine, so their real (unemulated) compute times lie on
    one line. A silo that ran other than the configured tau steps (scheme ``lbbsp-tau``:
    ``samples-processed / step-batch-size`` steps) counts at ``tau / steps`` times its
    time, so that the line is the cost of tau steps at every batch size. Runs where every
    silo used one batch size give ``b = 0`` through the origin (nothing tells the fixed
    cost apart).
    """
    xs, ts = [], []
    for events in runs:
        tau = _local_steps(events)
        for event in _train_events(events):
            for silo in event["silos"].values():
                if "compute-time" in silo and "batch-size" in silo:
                    x = float(silo.get(STEP_BATCH_SIZE, silo["batch-size"]))
                    steps = float(silo.get("samples-processed") or x * (tau or 1)) / x
                    xs.append(x)
                    ts.append(float(silo["compute-time"]) * (tau or steps) / steps)
    fit = fit_linear_cost(xs, ts)
    if fit is None:
        a = float(np.sum(ts) / np.sum(xs))
        return CostLine(a, 0.0, fitted=False)
    return CostLine(*fit)


def _local_steps(events: Events) -> int | None:
    config = next((e for e in events if e.get("event") == "config"), {})
    steps = config.get("local_steps")
    return None if steps is None else int(steps)


def modelled_cost_line(events: Events) -> CostLine | None:
    """The exact cost line of a run whose silos report a cost model's time
    (``cost_model`` ``"m,b"`` in its config): ``t = tau * (m * B + b)``; ``None`` for a
    run of measured times."""
    config = next((e for e in events if e.get("event") == "config"), {})
    text = config.get("cost_model")
    if not text:
        return None
    cost = CostModel.parse(str(text))
    tau = int(config.get("local_steps") or 1)
    return CostLine(tau * cost.per_sample, tau * cost.fixed)


def run_cost_lines(runs: dict[str, Events]) -> tuple[CostLine, dict[str, CostLine]]:
    """The one cost line every run of a comparison is measured against.

    Silos that report a cost model's time (:func:`modelled_cost_line`) give the exact
    line. Otherwise the line is fitted once on the real (unemulated) compute times of
    every scheme's silo-rounds, so that all schemes of one comparison share one T* and
    their ratios compare. Returns the line and, for convenience, the same line under
    every run's name.
    """
    modelled = [modelled_cost_line(events) for events in runs.values()]
    if modelled and all(line is not None for line in modelled):
        line = cast(CostLine, modelled[0])
    else:
        line = fit_cost_line(*runs.values())
    return line, dict.fromkeys(runs, line)


def summarise(
    events: Events,
    *,
    cost: CostLine | None = None,
    target_accuracy: float | None = None,
    steady_from: int = 4,
) -> dict[str, Any]:
    """Summarise one run's telemetry, FL or cluster (told apart by its config event).

    Every run: its scheme, whether its times are emulated (and the capacities), the final
    accuracy, the emulated time to the target accuracy (the sum of the round times up to
    the first evaluation at or above it; cluster runs: 0 if the initial model reaches it)
    and the final batch sizes. FL runs add the steady round time against the ideal T*, the idle
    fraction, the gap to the proportional split, wall-clock figures and one entry per
    round (``rounds``). Cluster runs add the mean iteration time and idle fraction, the
    real messaging overhead per iteration (server wall time beyond the slowest worker's
    busy time), the iterations to the target and the accuracy per evaluation
    (``accuracy``).

    Parameters
    ----------
    events : sequence of dict
        The run's telemetry (config, train and evaluate events).
    cost : CostLine | None (default: None)
        FL runs: measured compute cost line of this machine, for T* (runs compared with
        each other share one, from :func:`run_cost_lines`); ``None``: this run's own.
        Not used for cluster runs.
    target_accuracy : float | None (default: None)
        Accuracy whose first crossing gives ``time_to_target`` (emulated seconds).
    steady_from : int (default: 4)
        FL runs: first round counted as steady state.

    Raises
    ------
    ValueError
        No round was aggregated (:func:`run_failure` says why).
    """
    config = next(e for e in events if e.get("event") == "config")
    # Skipped rounds (no valid reply) have no round time and change no model.
    train = [e for e in _train_events(events) if e.get("round_time") is not None]
    if not train:
        raise ValueError(f"no aggregated round to summarise: {run_failure(events)}")
    accuracy = {e["round"]: e["accuracy"] for e in events if e.get("event") == "evaluate"}
    cluster = _is_cluster(config)
    elapsed = dict(zip([0] + [e["round"] for e in train], _cumulative(train), strict=True))
    # The evaluations that can reach the target: after an aggregated round, and for cluster
    # runs the initial model's too (0 iterations, 0 s).
    reached = [
        r
        for r in sorted(accuracy)
        if r in elapsed
        and (r > 0 or cluster)
        and target_accuracy is not None
        and accuracy[r] >= target_accuracy
    ]
    first = reached[0] if reached else None
    dilation = float(config.get("time_dilation") or 1.0)
    summary = {
        "scheme": config["scheme"],
        "emulated": config.get("speeds") is not None
        or config.get("cost_model") is not None
        or dilation > 1.0,
        "speeds_emulated": config.get("speeds"),
        "final_accuracy": accuracy[max(accuracy)] if accuracy else None,
        "target_accuracy": target_accuracy,
        "time_to_target": None if first is None else elapsed[first],
        "batch_sizes_final": {s: r.get("batch-size") for s, r in train[-1]["silos"].items()},
    }
    if cluster:
        return summary | _cluster_figures(train, accuracy, first)
    if cost is None:
        cost = run_cost_lines({"run": events})[0]
    return summary | _fl_figures(config, train, accuracy, elapsed, cost, steady_from)


def _is_cluster(config: dict[str, Any]) -> bool:
    """A cluster run's config (workers and iterations) rather than an FL run's."""
    return "iterations" in config


def _cumulative(train: list[dict[str, Any]]) -> list[float]:
    """0 and the emulated time elapsed after each aggregated round."""
    return [0.0, *np.cumsum([float(e["round_time"]) for e in train]).tolist()]


def _cluster_figures(
    train: list[dict[str, Any]], accuracy: dict[int, float], first: int | None
) -> dict[str, Any]:
    """A cluster run's iteration time, idle fraction and messaging overhead (real)."""
    iteration = np.array([float(e["round_time"]) for e in train])
    overhead = np.array([e["overhead"] for e in train if e.get("overhead") is not None])
    mean_iteration = float(iteration.mean())
    mean_overhead = float(overhead.mean()) if len(overhead) else None
    return {
        "iterations": len(train),
        "iteration_time_mean": mean_iteration,
        "idle_fraction_mean": float(np.mean([e["idle_fraction"] for e in train])),
        "overhead_mean": mean_overhead,
        "overhead_share": None
        if mean_overhead is None
        else mean_overhead / (mean_iteration + mean_overhead),
        "iterations_to_target": first,
        "accuracy": accuracy,
    }


def _fl_figures(
    config: dict[str, Any],
    train: list[dict[str, Any]],
    accuracy: dict[int, float],
    elapsed: dict[int, float],
    cost: CostLine,
    steady_from: int,
) -> dict[str, Any]:
    """An FL run's steady round time against T*, idle fraction, share deviation, wall
    clock and per-round series."""
    total = int(config["batch_size"]) * int(config["silos"])
    steady = [e for e in train if e["round"] >= steady_from] or train
    # T* of each round: capacities may change over the rounds (slowdown schedules).
    ideals = np.array([cost.ideal(slowdowns_at(config, e["round"]), total) for e in steady])
    times = np.array([float(e["round_time"]) for e in steady])
    round_steady = float(np.mean(times))
    walls = [float(e["wall_time"]) for e in steady if e.get("wall_time") is not None]
    wall_steady = float(np.mean(walls)) if walls else None
    rounds = [
        {
            "round": event["round"],
            "round_time": event["round_time"],
            "ideal_round_time": cost.ideal(slowdowns_at(config, event["round"]), total),
            "idle_fraction": event["idle_fraction"],
            "wall_time": event["wall_time"],
            "overhead": event.get("overhead"),
            "elapsed_emulated": elapsed[event["round"]],
            "accuracy": accuracy.get(event["round"]),
            "batch_sizes": {s: r.get("batch-size") for s, r in event["silos"].items()},
            "train_times": {s: r.get("train-time") for s, r in event["silos"].items()},
        }
        for event in train
    ]
    return {
        "share_deviation_steady": _share_deviation(steady),
        "time_dilation": float(config.get("time_dilation") or 1.0),
        "wall_round_time_steady": wall_steady,
        "wall_over_emulated": None if wall_steady is None else wall_steady / round_steady,
        "total_wall_time": float(sum(float(e.get("wall_time") or 0.0) for e in train)),
        "emulate_wait": config.get("emulate_wait", True),
        "cost_model": config.get("cost_model"),
        "round_time_steady": round_steady,
        "ideal_round_time": float(np.mean(ideals)),
        "round_time_over_ideal": float(np.mean(times / ideals)),
        "round_time_steady_median": float(np.median(times)),
        "round_time_median_over_ideal": float(np.median(times / ideals)),
        "idle_fraction_steady": float(np.mean([e["idle_fraction"] for e in steady])),
        "best_accuracy": max(accuracy.values()) if accuracy else None,
        "total_time_emulated": elapsed[train[-1]["round"]],
        "cost_line": {"a": cost.a, "b": cost.b},
        "rounds": rounds,
    }


def _share_deviation(steady: list[dict[str, Any]]) -> float | None:
    """Largest relative gap between a silo's mean steady batch size and its proportional
    share ``X * v_i / sum_j v_j``, with ``v_i`` its mean reported speed over those rounds."""
    silos = sorted({s for e in steady for s in e["silos"]}, key=natural_key)
    sizes, speeds = [], []
    for silo in silos:
        rows = [e["silos"][silo] for e in steady if silo in e["silos"]]
        rows = [r for r in rows if r.get("train-time") and r.get("batch-size")]
        if not rows:
            return None
        sizes.append(np.mean([r["batch-size"] for r in rows]))
        speeds.append(np.mean([r["batch-size"] / r["train-time"] for r in rows]))
    x, v = np.asarray(sizes), np.asarray(speeds)
    share = x.sum() * v / v.sum()
    return float(np.max(np.abs(x - share) / share))


def slowdowns_at(config: dict[str, Any], server_round: int) -> list[float]:
    """Each silo's emulated slowdown in ``server_round``, from a run's config event
    (``speeds``, ``time_dilation`` and, where set, ``slowdown_schedules``)."""
    speeds = config.get("speeds")
    silos = int(config["silos"])
    dilation = float(config.get("time_dilation") or 1.0)
    base = [dilation] * silos if not speeds else [dilation * max(speeds) / s for s in speeds]
    schedules = config.get("slowdown_schedules") or ["1"] * silos
    return [
        k * SlowdownSchedule.parse(text).factor(server_round)
        for k, text in zip(base, schedules, strict=True)
    ]


def _fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return pattern.format(value)


_ROWS = (
    # FL runs: emulated round times against T*
    ("mean round time, steady (s)", "round_time_steady", "{:.3f}"),
    # Cluster runs: emulated iteration times, real messaging
    ("iteration time, mean (s)", "iteration_time_mean", "{:.3f}"),
    ("ideal round time T* (s), mean", "ideal_round_time", "{:.3f}"),
    ("round time / T*", "round_time_over_ideal", "{:.3f}"),
    ("median round time / T*", "round_time_median_over_ideal", "{:.3f}"),
    ("idle fraction, steady", "idle_fraction_steady", "{:.1%}"),
    ("idle fraction, mean", "idle_fraction_mean", "{:.1%}"),
    ("messaging per iteration (s)", "overhead_mean", "{:.3f}"),
    ("messaging share", "overhead_share", "{:.1%}"),
    ("max |B - proportional share|", "share_deviation_steady", "{:.1%}"),
    # Every run
    ("final accuracy", "final_accuracy", "{:.4f}"),
    ("iterations to target", "iterations_to_target", "{}"),
    ("time to target accuracy (s)", "time_to_target", "{:.2f}"),
    # FL runs: totals and the wall clock beside the emulated times
    ("total training time (s)", "total_time_emulated", "{:.2f}"),
    ("wall clock: round time, steady (s)", "wall_round_time_steady", "{:.3f}"),
    ("wall clock / emulated round time", "wall_over_emulated", "{:.2f}"),
    ("wall clock: total training (s)", "total_wall_time", "{:.2f}"),
)
"""The table's rows: label, summary key, format. A row is shown when a run has its key."""


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Side-by-side table of the runs of one comparison, FL or cluster: the rows their
    summaries have (:func:`summarise`), then the target accuracy, what was emulated and
    how, and each run's final batch sizes. Times are emulated (what the silos or workers
    report); FL runs show the wall-clock time beside them, cluster runs the real
    messaging overhead."""
    rows = [row for row in _ROWS if any(row[1] in s for s in summaries.values())]
    names = list(summaries)
    width = max(len(r[0]) for r in rows) + 2
    column = max([12, *(len(n) + 2 for n in names)])
    lines = ["".ljust(width) + "".join(n.rjust(column) for n in names)]
    for label, key, pattern in rows:
        cells = "".join(_fmt(summaries[n].get(key), pattern).rjust(column) for n in names)
        lines.append(label.ljust(width) + cells)
    first = next(iter(summaries.values()))
    if first.get("target_accuracy") is not None:
        lines.append(f"target accuracy: {first['target_accuracy']:.4f}")
    lines.extend(_emulation_notes(first, summaries))
    for name, summary in summaries.items():
        sizes = format_silos(summary["batch_sizes_final"])
        lines.append(f"final batch sizes ({name}): {sizes}")
    return "\n".join(lines)


def _emulation_notes(first: dict[str, Any], summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The lines that say which times are emulated and how (from the first run's
    settings: every run of a comparison has the same)."""
    if "iterations" in first:  # cluster runs
        if not first.get("emulated"):
            return []
        return [
            f"iteration times are emulated (worker capacities {first.get('speeds_emulated')});"
            " messaging is real wall time"
        ]
    lines = []
    if first.get("cost_model"):
        wait = "waiting it out" if first.get("emulate_wait", True) else "without waiting"
        lines.append(
            f"times are emulated: silo i reports tau*k_i*(m*B_i+b) with m,b = "
            f"{first['cost_model']} s, {wait}; capacities {first.get('speeds_emulated')}"
        )
    elif any(s.get("emulated") for s in summaries.values()):
        how = (
            "silo i waits until k_i*t has passed since it queued to compute for t"
            if first.get("emulate_wait", True)
            else "silo i reports k_i*t after computing for t, without waiting"
        )
        lines.append(f"times are emulated: silo capacities {first.get('speeds_emulated')} ({how})")
        dilation = float(first.get("time_dilation") or 1.0)
        if dilation > 1.0:
            lines.append(
                f"the fastest silo is emulated {dilation:g}x slower than this machine, so that "
                "the federation's compute fits the compute slots and wall clock follows "
                "emulated time"
            )
    if not first.get("emulate_wait", True):
        lines.append(
            "wall clock: silos did not wait out their slowdowns; it is not the emulated time"
        )
    return lines


HEATMAP_FROM = 9
"""Silos from which the batch sizes are drawn as a heat map (silos x rounds) per scheme
instead of one line per silo."""

_STYLES = {"fedavg": "--", "lbbsp": "-", "lbbsp-tau": "-.", "lbbsp-eta": ":", "partial": "--"}
_MARKERS = {"fedavg": "o", "lbbsp": None, "lbbsp-tau": "s", "lbbsp-eta": "^", "partial": "v"}
_SCHEME_COLOURS = {
    "fedavg": "#000000",
    "lbbsp": "#1f3a93",
    "lbbsp-tau": "#2ca02c",
    "lbbsp-eta": "#9467bd",
    "partial": "#8c564b",
}
_ANNOTATE_CELLS = 400
"""Heat maps with at most this many cells print each cell's batch size."""


def _silo_series(summary: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
    """Rounds and each silo's batch size per round (``None`` where it sent no report)."""
    rounds = summary["rounds"]
    silos = sorted({s for x in rounds for s in x["batch_sizes"]}, key=natural_key)
    return [x["round"] for x in rounds], {
        s: [x["batch_sizes"].get(s) for x in rounds] for s in silos
    }


def _equal_groups(series: dict[str, list[Any]]) -> list[list[str]]:
    """Silos grouped by identical batch-size series (FedAvg: one group of all)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for silo, values in series.items():
        groups.setdefault(tuple(values), []).append(silo)
    return list(groups.values())


def _silo_label(silos: list[str]) -> str:
    if len(silos) == 1:
        return f"silo {silos[0]}"
    if len(silos) <= 3:
        return "silos " + ", ".join(silos)
    return f"silos {silos[0]}..{silos[-1]} ({len(silos)})"


def _ideal_steps(summaries: dict[str, dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """T* per round, once per distinct series (schemes of one comparison share it)."""
    distinct: dict[tuple[float, ...], tuple[list[str], list[int]]] = {}
    for name, summary in summaries.items():
        rounds = summary["rounds"]
        values = tuple(round(float(x["ideal_round_time"]), 9) for x in rounds)
        distinct.setdefault(values, ([], [x["round"] for x in rounds]))[0].append(name)
    out = {}
    for values, (names, r) in distinct.items():
        label = "ideal T*, per round" if len(distinct) == 1 else f"ideal T* ({', '.join(names)})"
        out[label] = (r, list(values))
    return out


def plot_comparison(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Write :func:`comparison_figure` of ``summaries`` to ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = comparison_figure(summaries)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def comparison_figure(summaries: dict[str, dict[str, Any]]) -> Any:
    """Per-silo batch size and round time over rounds; accuracy against emulated time.

    Up to ``HEATMAP_FROM - 1`` silos the batch sizes are lines, one colour per silo and
    one line style per scheme; silos whose series are identical (FedAvg's equal batches)
    share one labelled line. From ``HEATMAP_FROM`` silos on, each scheme gets a heat map
    of batch size over silos x rounds. The round-time panel draws the ideal T* of every
    round (a step line, labelled; it moves when capacities change). Legends sit outside
    the data, below each panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    emulated = " (emulated)" if any(s.get("emulated") for s in summaries.values()) else ""
    names = list(summaries)
    silo_count = max((len(_silo_series(s)[1]) for s in summaries.values()), default=0)
    heatmap = silo_count >= HEATMAP_FROM
    if heatmap:
        mosaic: Any = [
            [f"heat:{n}" for n in names for _ in range(2)],
            ["time"] * len(names) + ["acc"] * len(names),
        ]
        fig, axes = plt.subplot_mosaic(
            mosaic,
            figsize=(max(14.0, 7.0 * len(names)), 6.0 + 0.22 * silo_count),
            height_ratios=[max(2.5, 0.22 * silo_count), 4.0],
            layout="constrained",
        )
    else:
        fig, axes = plt.subplot_mosaic(
            [["batch", "time", "acc"]], figsize=(17, 5.6), layout="constrained"
        )
    # Batch sizes
    if heatmap:
        sizes = [
            [v for values in _silo_series(s)[1].values() for v in values if v is not None]
            for s in summaries.values()
        ]
        flat = [v for group in sizes for v in group] or [0]
        vmin, vmax = min(flat), max(flat)
        for name, summary in summaries.items():
            ax = axes[f"heat:{name}"]
            r, series = _silo_series(summary)
            grid = np.array(
                [[np.nan if v is None else float(v) for v in values] for values in series.values()]
            )
            image = ax.imshow(
                grid,
                aspect="auto",
                interpolation="nearest",
                cmap="viridis",
                vmin=vmin,
                vmax=vmax,
                extent=(r[0] - 0.5, r[-1] + 0.5, len(series) - 0.5, -0.5) if r else None,
            )
            if grid.size <= _ANNOTATE_CELLS:
                middle = (vmin + vmax) / 2
                for row, values in enumerate(grid):
                    for col, value in enumerate(values):
                        if not np.isnan(value):
                            ax.text(
                                r[col],
                                row,
                                f"{value:.0f}",
                                ha="center",
                                va="center",
                                fontsize=6,
                                color="black" if value > middle else "white",
                            )
            step = max(1, len(series) // 20)
            ax.set_yticks(range(0, len(series), step), list(series)[::step], fontsize=7)
            ax.set(title=f"batch size per silo: {name}", xlabel="round", ylabel="silo")
        fig.colorbar(image, ax=[axes[f"heat:{n}"] for n in names], label="batch size B")
    else:
        ax = axes["batch"]
        colours = plt.get_cmap("tab10")
        for name, summary in summaries.items():
            r, series = _silo_series(summary)
            order = list(series)
            for group in _equal_groups(series):
                shared = len(group) > 1
                everyone = len(group) == len(order) > 1
                ax.plot(
                    r,
                    series[group[0]],
                    _STYLES.get(name, "-"),
                    marker=_MARKERS.get(name),
                    markersize=4,
                    color=_SCHEME_COLOURS.get(name, "black")
                    if everyone
                    else colours(order.index(group[0]) % 10),
                    lw=2.4 if shared else 1.5,
                    alpha=0.85,
                    label=f"{name}: {_silo_label(group)}" + (" (equal)" if shared else ""),
                )
        ax.set(title="batch size per silo", xlabel="round", ylabel="B")
        ax.legend(
            fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False
        )
    # Round time against T*
    ax = axes["time"]
    _plot_schemes(ax, summaries, "round", "round_time")
    for label, (r, values) in _ideal_steps(summaries).items():
        ax.step(r, values, where="mid", color="grey", lw=1.2, ls=(0, (4, 2)), label=label)
    ax.set(title=f"round time{emulated}", xlabel="round", ylabel="seconds")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, frameon=False)
    # Accuracy
    ax = axes["acc"]
    _plot_schemes(ax, summaries, "elapsed_emulated", "accuracy")
    ax.set(title="test accuracy", xlabel=f"training time{emulated}, s", ylabel="accuracy")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, frameon=False)
    return fig


def _plot_schemes(ax: Any, summaries: dict[str, dict[str, Any]], x: str, y: str) -> None:
    """One line per scheme of its rounds' ``y`` against ``x`` (rounds without ``y`` left
    out), in the scheme's colour, line style and marker."""
    for name, summary in summaries.items():
        rounds = [r for r in summary["rounds"] if r[y] is not None]
        ax.plot(
            [r[x] for r in rounds],
            [r[y] for r in rounds],
            _STYLES.get(name, "-"),
            marker=_MARKERS.get(name) or ".",
            markersize=4,
            color=_SCHEME_COLOURS.get(name),
            label=name,
        )
