"""The side-by-side table of the runs of one comparison, FL or cluster
(:func:`format_table`), from their summaries (:func:`~.summaries.summarise`)."""

from __future__ import annotations

import math
from typing import Any

from ...strategies.rounds import format_silos

__all__ = ["format_table"]


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
