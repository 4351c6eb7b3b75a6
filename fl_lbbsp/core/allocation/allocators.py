"""Batch-size allocation: split a fixed total X over silos so they finish together.

The problem (Chen et al., IEEE TCC 2021, Eq. 3): minimise ``max_i t_i(x_i)`` subject to
``sum_i x_i = X`` and ``x_min_i <= x_i <= x_max_i``.

* :func:`proportional` is Alg. 1 (line 5): ``x_i = v_i / sum_j v_j * X``.
* :func:`linear_minmax` solves the problem exactly for linear costs
  ``t_i = a_i * x_i + b_i`` with bounds (SoCC 2020 Sec. 3.3; BOA, Yang et al.).

Proportional allocation is the linear case with ``a_i = 1 / v_i`` and ``b_i = 0``, so
both go through the same solver and the same rounding.

The balancer's allocators are objects from one registry, :data:`ALLOCATORS`
(:class:`Allocator`: its settings are its fields): ``linear`` and ``proportional``
(:mod:`.pipeline`), ``iterative`` (Alg. 2, :mod:`.iterative`). Adding one is one class
with ``@register``; a name given as a string (a CLI flag, a run config, a checkpoint) is
looked up once, at that boundary (:class:`~fl_lbbsp.core.settings.Tuning`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..registry import Registry
from .rounding import ArrayLike, IntArray, integer_bounds, round_to_total
from .waterfill import linear_minmax_continuous, positive_finite

if TYPE_CHECKING:
    from ..silo.model import SiloTable

Rounding = Literal["time", "remainder"]

__all__ = [
    "ALLOCATORS",
    "Allocator",
    "Bounds",
    "Decision",
    "Problem",
    "equal_split",
    "ideal_round_time",
    "idle_fraction",
    "linear_minmax",
    "linear_minmax_continuous",
    "proportional",
    "register",
    "registered",
    "split_equally",
]


@dataclass(frozen=True)
class Bounds:
    """Each silo's bounds: ``lower``/``upper`` with the change limits, ``hard_lower``/
    ``hard_upper`` without; ``total`` the total within the hard bounds."""

    lower: np.ndarray
    upper: np.ndarray
    hard_lower: np.ndarray
    hard_upper: np.ndarray
    total: int


@dataclass(frozen=True)
class Decision:
    """Each silo's batch size and the reason it got it
    (:data:`~fl_lbbsp.core.allocation.pipeline.ALLOCATION_REASONS`)."""

    sizes: dict[str, int]
    reasons: dict[str, str]

    @classmethod
    def of(cls, ids: Sequence[str], sizes: np.ndarray, why: Sequence[str] | str) -> Decision:
        """A decision for ``ids`` from an array of sizes and one reason or one each."""
        reasons = [why] * len(ids) if isinstance(why, str) else list(why)
        return cls(
            dict(zip(ids, sizes.tolist(), strict=True)), dict(zip(ids, reasons, strict=True))
        )


class GuardTuning(Protocol):
    """The guards' settings an allocation reads (:class:`~fl_lbbsp.core.settings.Tuning`
    has them; declared here so that the allocation does not depend on the settings)."""

    @property
    def max_change_ratio(self) -> float | None: ...
    @property
    def order_tolerance(self) -> float | None: ...
    @property
    def equal_split_guard(self) -> bool: ...
    @property
    def equal_split_margin(self) -> float: ...


@dataclass(frozen=True)
class Problem:
    """One round's allocation as the pipeline's first steps leave it to the allocator
    (:func:`~fl_lbbsp.core.allocation.pipeline.allocate`): the silos ``ids`` (sorted),
    their models (``table``) and gathered columns (``rows``: ``cap``, ``last``,
    ``slope``, ...), their ``bounds`` and total, the guards' settings (``tuning``), the
    aggregation ``weights`` and gradient ``noise`` (``None``: equal), the noise budget
    ``rho`` (``None``: none) and the allocator's own ``state``
    (:meth:`Allocator.start`)."""

    ids: list[str]
    table: SiloTable
    rows: np.ndarray
    bounds: Bounds
    tuning: GuardTuning
    weights: np.ndarray | None
    noise: np.ndarray | None
    rho: float | None
    state: Any


class Allocator(BaseModel, ABC):
    """A batch-size allocator: its settings are the fields.

    A subclass sets ``name`` (its key in :data:`ALLOCATORS`) and defines
    :meth:`allocate`; one that keeps state between rounds (Alg. 2) also :meth:`start`,
    :meth:`save` and :meth:`load`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: ClassVar[str]
    fits_lines: ClassVar[bool] = False
    """Whether it allocates by the silos' fitted cost lines (then the ``wls`` fit is
    made where ``fit`` asks for it)."""

    @abstractmethod
    def allocate(self, problem: Problem) -> Decision:
        """Every silo's batch size within ``problem.bounds``, summing to its total, and
        the reason for it."""

    def start(self) -> Any:
        """The state it keeps between rounds (``None``: none)."""
        return None

    def save(self, state: Any) -> dict[str, Any] | None:
        """``state`` as JSON, read back by :meth:`load` (``None``: nothing to keep)."""
        return None

    def load(self, saved: dict[str, Any]) -> Any:
        """The state of a :meth:`save`."""
        return self.start()


ALLOCATORS: Registry[Allocator] = Registry("allocator")
"""Every allocator by name."""
register = ALLOCATORS.register
"""Add an allocator class to :data:`ALLOCATORS` under its ``name`` (a decorator)."""
registered = ALLOCATORS.registered
""":func:`register` a class for the duration of a ``with`` block."""


def linear_minmax(
    a: ArrayLike,
    b: ArrayLike,
    total: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    rounding: Rounding = "time",
) -> IntArray:
    """Integer batch sizes minimising the slowest silo's time for linear costs.

    Solves ``min max_i (a_i * x_i + b_i)`` s.t. ``sum x_i = total`` and the bounds
    exactly: over the reals (:func:`linear_minmax_continuous`), then rounded by time
    with :func:`~fl_lbbsp.core.allocation.rounding.round_to_total`, which gives each leftover
    unit to the silo it slows least; the result is the integer min-max, with the total and every
    bound kept. ``rounding="remainder"`` rounds by largest remainder instead, which keeps
    every silo within one sample of its real share at a slightly longer round.

    Parameters
    ----------
    a : sequence of float
        Per-sample cost of each silo, positive.
    b : sequence of float
        Fixed cost of each silo.
    total : int
        Total batch size X.
    lower : sequence of float | None (default: None)
        Per-silo minimum batch size (rounded up); ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo maximum batch size (rounded down); ``None`` means unbounded.
    rounding : {"time", "remainder"} (default: "time")
        How the real solution is made integer (see above).

    Reference: Chen et al., SoCC 2020, Sec. 3.3; Yang et al., BOA.
    """
    if rounding not in ("time", "remainder"):
        raise ValueError(f"unknown rounding {rounding!r}; expected 'time' or 'remainder'")
    lo, hi = integer_bounds(len(np.asarray(a)), lower=lower, upper=upper)
    x, _ = linear_minmax_continuous(a, b, float(total), lower=lo, upper=hi.astype(np.float64))
    by_time = a if rounding == "time" else None
    return round_to_total(x, total, lower=lo, upper=hi, slope=by_time, intercept=b)


def proportional(
    speeds: ArrayLike,
    total: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
) -> IntArray:
    """Batch sizes proportional to predicted speed: ``x_i = v_i / sum_j v_j * X``.

    With bounds, silos held at a bound keep it and the rest is split proportionally,
    which is the min-max solution for costs ``x_i / v_i``; the shares are rounded by
    largest remainder (Alg. 1 line 6), so each is within one sample of ``v_i / sum v * X``.

    Parameters
    ----------
    speeds : sequence of float
        Predicted sample-processing speed of each silo, positive.
    total : int
        Total batch size X.
    lower : sequence of float | None (default: None)
        Per-silo minimum batch size; ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo maximum batch size (memory cap x_o); ``None`` means unbounded.

    Reference: Chen et al., IEEE TCC 2021, Alg. 1.
    """
    v = positive_finite("speeds", speeds)
    return linear_minmax(
        1.0 / v, np.zeros_like(v), total, lower=lower, upper=upper, rounding="remainder"
    )


def equal_split(total: int, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """FedAvg's equal split of ``total`` within the bounds (silos in the order given)."""
    n = len(lower)
    share, extra = divmod(total, n)
    sizes = np.full(n, share, dtype=np.int64)
    sizes[:extra] += 1
    if np.all(sizes >= lower) and np.all(sizes <= upper):
        return sizes
    return proportional(np.ones(n), total, lower=lower, upper=upper)


def split_equally(bounds: Bounds) -> np.ndarray:
    """:func:`equal_split` of ``bounds.total`` within the hard bounds."""
    return equal_split(bounds.total, bounds.hard_lower, bounds.hard_upper)


def ideal_round_time(a: ArrayLike, b: ArrayLike, total: float) -> float:
    """The ideal round time ``T* = (X + sum_i b_i / a_i) / sum_i (1 / a_i)``.

    The best achievable round time for linear costs ``t_i = a_i * x_i + b_i`` with the
    total X fixed (shared/DESIGN.md); with ``b_i = 0`` it is ``X / sum_i v_i``.
    """
    slope = positive_finite("a", a)
    offset = np.asarray(b, dtype=np.float64)
    return float((total + np.sum(offset / slope)) / np.sum(1.0 / slope))


def idle_fraction(times: ArrayLike) -> float:
    """Barrier waste ``1 - mean_i(t_i) / max_i(t_i)``: 0 when all silos finish together."""
    t = positive_finite("times", times)
    return float(1.0 - t.mean() / t.max())
