"""A round's reports as columns, checked at once.

:func:`report_columns` reads the fields of many :class:`~fl_lbbsp.core.silo.reports.SiloReport`
into one array each and checks them with array operations; a report whose fields are not
all plain ``int`` / ``float`` (or ``None`` where allowed), or that fails a check, is
judged by :meth:`~fl_lbbsp.core.silo.reports.SiloReport.validate` itself, so that the reports
accepted and the errors raised are exactly the ones ``validate`` gives.

Reference: the BatchSizeManager's per-worker reports, Chen et al., "Accelerating
Distributed Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from .reports import InvalidReportError, SiloReport

__all__ = ["ReportColumns", "report_columns"]

_PLAIN = frozenset({int, float})


class ReportColumns(NamedTuple):
    """The valid reports' fields, one array each (NaN: not given)."""

    position: np.ndarray
    """Position of each valid report in the reports given."""
    batch_size: np.ndarray
    train_time: np.ndarray
    samples: np.ndarray
    max_batch_size: np.ndarray
    fixed_time: np.ndarray


def _column(values: list[object], optional: bool) -> tuple[np.ndarray, bool]:
    """The values as floats (``None``: NaN) and whether they were all plain numbers."""
    if optional:
        nones = values.count(None)
        if nones == len(values):
            return np.full(len(values), np.nan), True
        if nones:
            values = [np.nan if v is None else v for v in values]
    if not set(map(type, values)) <= _PLAIN:
        return np.full(len(values), np.nan), False
    try:
        return np.array(values, dtype=np.float64), True
    except OverflowError:  # an int beyond a float: validate says what it says
        return np.full(len(values), np.nan), False


def _counts(values: np.ndarray) -> np.ndarray:
    """Positive integers (not a count: False)."""
    with np.errstate(invalid="ignore"):
        out: np.ndarray = (values > 0) & (values == np.floor(values)) & np.isfinite(values)
    return out


def report_columns(
    reports: Sequence[SiloReport],
) -> tuple[ReportColumns, dict[int, InvalidReportError]]:
    """The valid reports' fields as columns, and each unusable report's error by its
    position (what :meth:`~fl_lbbsp.core.silo.reports.SiloReport.validate` raises for it)."""
    size, plain = _column(list(map(attrgetter("batch_size"), reports)), False)
    time, ok = _column(list(map(attrgetter("train_time"), reports)), False)
    samples, ok_samples = _column(list(map(attrgetter("samples"), reports)), True)
    cap, ok_cap = _column(list(map(attrgetter("max_batch_size"), reports)), True)
    fixed, ok_fixed = _column(list(map(attrgetter("fixed_time"), reports)), True)
    errors: dict[int, InvalidReportError] = {}
    if plain and ok and ok_samples and ok_cap and ok_fixed:
        with np.errstate(all="ignore"):
            speed = np.where(np.isnan(samples), size, samples) / time
            good = (
                _counts(size)
                & np.isfinite(time)
                & (time > 0)
                & (np.isnan(samples) | _counts(samples))
                & (np.isnan(cap) | _counts(cap))
                & (np.isnan(fixed) | (np.isfinite(fixed) & (fixed >= 0)))
                & np.isfinite(speed)
            )
        suspect = np.flatnonzero(~good).tolist()
    else:
        suspect = list(range(len(reports)))
    for k in suspect:  # judged by validate itself (its exact error)
        try:
            reports[k].validate()
        except InvalidReportError as err:
            errors[k] = err
    if not suspect:
        index = np.arange(len(reports))
        return ReportColumns(index, size, time, samples, cap, fixed), errors
    index = np.array([k for k in range(len(reports)) if k not in errors], dtype=np.intp)
    chosen = [reports[k] for k in index.tolist()]

    def floats(name: str) -> np.ndarray:
        values = [getattr(r, name) for r in chosen]
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    return ReportColumns(
        index, floats("batch_size"), floats("train_time"), floats("samples"),
        floats("max_batch_size"), floats("fixed_time"),
    ), errors  # fmt: skip
