"""What a silo reports after a round, and the checks that make a report usable.

A report is one observation of a silo's speed: the batch size it used, the seconds of
compute its local steps took, the samples processed and, where known, its machine's CPU
and memory use and memory cap (x_o). The balancer feeds only valid reports to a silo's
model (:mod:`.silo_model`).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.2 (the per-worker speed observations) and Sec. 4
(the BatchSizeManager's reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["InvalidReportError", "SiloReport", "check_positive_int", "is_real"]


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
        """Raise :class:`InvalidReportError` if the report cannot feed the estimators."""
        _check_count("batch size", self.batch_size)
        if not _finite(self.train_time) or self.train_time <= 0:
            raise InvalidReportError(
                f"train time must be finite and positive, got {self.train_time!r}"
            )
        if self.samples is not None:
            _check_count("samples processed", self.samples)
        if self.max_batch_size is not None:
            _check_count("max batch size", self.max_batch_size)
        if self.fixed_time is not None and (not _finite(self.fixed_time) or self.fixed_time < 0):
            raise InvalidReportError(
                f"fixed time must be finite and non-negative, got {self.fixed_time!r}"
            )
        if not math.isfinite(self.speed):
            raise InvalidReportError(
                f"speed {self.batch_size!r} samples in {self.train_time!r} s is not finite"
            )

    @property
    def speed(self) -> float:
        """Samples processed per second of compute."""
        samples = self.batch_size if self.samples is None else self.samples
        return float(samples) / float(self.train_time)

    @property
    def steps(self) -> float:
        """Local steps implied by the report (samples / batch size)."""
        return 1.0 if self.samples is None else float(self.samples) / float(self.batch_size)


def is_real(value: object) -> bool:
    """Whether ``value`` is a finite real number (not a bool)."""
    return (
        isinstance(value, int | float | np.integer | np.floating)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value))


def _check_count(name: str, value: object) -> None:
    number = float(value) if _finite(value) and not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
    if not (number > 0 and number.is_integer()):
        raise InvalidReportError(f"{name} must be a positive integer, got {value!r}")


def check_positive_int(name: str, value: object) -> None:
    """Check a setting that must be a positive integer.

    Raises
    ------
    ValueError
        If ``value`` is not a positive integer (a bool is not one).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
