"""Summaries of runs, FL and cluster alike: one summary per run (:mod:`.summaries`), the
cost lines T* is computed from (:mod:`.costs`), one side-by-side table (:mod:`.table`) and
the comparison plot (:mod:`.plot`)."""

from .costs import CostLine, fit_cost_line, modelled_cost_line, run_cost_lines, slowdowns_at
from .plot import HEATMAP_FROM, comparison_figure, plot_comparison
from .summaries import run_failure, summarise
from .table import format_table

__all__ = [
    "CostLine",
    "HEATMAP_FROM",
    "comparison_figure",
    "fit_cost_line",
    "format_table",
    "modelled_cost_line",
    "plot_comparison",
    "run_cost_lines",
    "run_failure",
    "slowdowns_at",
    "summarise",
]
