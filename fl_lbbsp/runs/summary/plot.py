"""The comparison plot of the runs of one comparison (:func:`comparison_figure`,
:func:`plot_comparison`): batch size per silo, round time against T* and accuracy against
emulated time, from their summaries (:func:`~.summaries.summarise`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...strategies.rounds import natural_key

__all__ = ["HEATMAP_FROM", "comparison_figure", "plot_comparison"]

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
