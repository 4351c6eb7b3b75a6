"""What a silo reports after a round, and the checks that make a report usable.

A report is one observation of a silo's speed: the batch size it used, the seconds of
compute its local steps took, the samples processed and, where known, its machine's CPU
and memory use and memory cap (x_o). The balancer feeds only valid reports to a silo's
model (:mod:`.model`); :func:`report_columns` checks a whole round's reports at once, and
:meth:`SiloReport.validate` is the same checks on a round of one.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.2 (the per-worker speed observations) and Sec. 4
(the BatchSizeManager's reports).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "InvalidReportError",
    "ReportColumns",
    "SiloReport",
    "check_positive_int",
    "report_columns",
]


class InvalidReportError(ValueError):
    """A silo report that cannot be used (non-finite time, zero batch size, ...)."""


@dataclass(frozen=True)
class SiloReport:
    """What a silo tells the server after a round.

    Parameters
    ----------
    batch_size : int
        Batch size the silo actually used.
    train_time : float
        Seconds of compute for the round's local steps (no waiting, no transfer).
    samples : int | None (default: None)
        Samples processed in the round (``batch_size * local_steps``); ``None`` means
        ``batch_size``.
    cpu_percent : float | None (default: None)
        CPU utilisation of the silo's machine during the round.
    memory_percent : float | None (default: None)
        Memory utilisation of the silo's machine.
    max_batch_size : int | None (default: None)
        Largest batch size the silo can hold in memory (x_o).
    fixed_time : float | None (default: None)
        Seconds of per-round work that does not depend on the batch size and is not in
        ``train_time``, e.g. encrypting and decrypting the model (``he-time``). The linear
        allocator adds it to the silo's fixed cost b_i.
    """

    batch_size: int
    train_time: float
    samples: int | None = None
    cpu_percent: float | None = None
    memory_percent: float | None = None
    max_batch_size: int | None = None
    fixed_time: float | None = None

    def validate(self) -> None:
        """Raise :class:`InvalidReportError` if the report cannot feed the estimators
        (the checks of :func:`report_columns`, on a round of one report)."""
        _, errors = report_columns([self])
        if errors:
            raise errors[0]

    @property
    def steps(self) -> float:
        """Local steps implied by the report (samples / batch size)."""
        return 1.0 if self.samples is None else float(self.samples) / float(self.batch_size)


class ReportColumns(NamedTuple):
    """A round's valid reports' fields, one array each (NaN: not given)."""

    position: np.ndarray
    """Position of each valid report in the reports given."""
    batch_size: np.ndarray
    train_time: np.ndarray
    samples: np.ndarray
    max_batch_size: np.ndarray
    fixed_time: np.ndarray


_PLAIN = frozenset({int, float})
_OPTIONAL = frozenset({int, float, type(None)})


def _column(values: list[object], optional: bool) -> tuple[np.ndarray, np.ndarray]:
    """The values as floats (``None``: NaN) and where a value is no number (a bool, a
    string, an int beyond a float; ``None`` where not ``optional``)."""
    kinds = set(map(type, values))
    if kinds <= (_OPTIONAL if optional else _PLAIN):  # plain numbers: one conversion
        try:
            nones = None in values
            plain = [math.nan if v is None else v for v in values] if nones else values
            out = np.array(plain, dtype=np.float64)
            if not optional:
                return out, np.zeros(len(values), dtype=bool)
            # an optional field's NaN is a bad value, not an absent one
            bad = np.isnan(out)
            if nones and bad.any():
                bad &= np.fromiter((v is not None for v in values), bool, len(values))
            return out, bad
        except OverflowError:
            pass
    out, bad = np.full(len(values), np.nan), np.zeros(len(values), dtype=bool)
    for k, v in enumerate(values):
        if v is None:
            bad[k] = not optional
        elif isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool):
            try:
                out[k] = float(v)
            except OverflowError:
                bad[k] = True
            bad[k] |= optional and math.isnan(out[k])
        else:
            bad[k] = True
    return out, bad


def _counts(values: np.ndarray) -> np.ndarray:
    """Positive integers (not a count: False)."""
    with np.errstate(invalid="ignore"):
        out: np.ndarray = (values > 0) & (values == np.floor(values)) & np.isfinite(values)
    return out


def report_columns(
    reports: Sequence[SiloReport],
) -> tuple[ReportColumns, dict[int, InvalidReportError]]:
    """A round's reports checked at once: the valid ones' fields as columns, and each
    unusable report's error by its position (the first check it fails: batch size,
    train time, samples, max batch size, fixed time, speed)."""
    fields = ("batch_size", "train_time", "samples", "max_batch_size", "fixed_time")
    raw = {name: [getattr(r, name) for r in reports] for name in fields}
    size, time, samples, cap, fixed = (
        _column(raw[name], optional=name not in ("batch_size", "train_time")) for name in fields
    )
    with np.errstate(all="ignore"):
        speed = np.where(np.isnan(samples[0]), size[0], samples[0]) / time[0]
        checks = (
            ("batch_size", ~size[1] & _counts(size[0]), "batch size must be a positive integer"),
            ("train_time", ~time[1] & np.isfinite(time[0]) & (time[0] > 0),
             "train time must be finite and positive"),
            ("samples", ~samples[1] & (np.isnan(samples[0]) | _counts(samples[0])),
             "samples processed must be a positive integer"),
            ("max_batch_size", ~cap[1] & (np.isnan(cap[0]) | _counts(cap[0])),
             "max batch size must be a positive integer"),
            ("fixed_time", ~fixed[1] & (np.isnan(fixed[0]) | (fixed[0] >= 0) & (fixed[0] < np.inf)),
             "fixed time must be finite and non-negative"),
        )  # fmt: skip
    good = np.ones(len(reports), dtype=bool)
    errors: dict[int, InvalidReportError] = {}
    for name, ok, message in checks:
        for k in np.flatnonzero(good & ~ok).tolist():
            errors[k] = InvalidReportError(f"{message}, got {raw[name][k]!r}")
        good &= ok
    for k in np.flatnonzero(good & ~np.isfinite(speed)).tolist():
        errors[k] = InvalidReportError(
            f"speed {raw['batch_size'][k]!r} samples in {raw['train_time'][k]!r} s is not finite"
        )
    good &= np.isfinite(speed)
    index = np.flatnonzero(good)
    if index.size == len(reports):
        return ReportColumns(index, size[0], time[0], samples[0], cap[0], fixed[0]), errors
    columns = (size[0], time[0], samples[0], cap[0], fixed[0])
    return ReportColumns(index, *(c[index] for c in columns)), errors


def check_positive_int(name: str, value: object) -> None:
    """Check a setting that must be a positive integer.

    Raises
    ------
    ValueError
        If ``value`` is not a positive integer (a bool is not one).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
