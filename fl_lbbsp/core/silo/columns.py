"""Every silo's state as columns: one array per field, one row per silo.

The silo table (:class:`~fl_lbbsp.core.silo.model.SiloTable`) works on these columns for a
whole round at once. Row 0 is the row of a silo that never reported. A missing value is
NaN (a float field) or ``None`` (an object field). The history window and the change
detector's run are ``(rows, W)`` arrays, their entries in the first ``n`` columns, oldest
first. The default estimators (``ema``, ``last``) are a column too; any other estimator is
one object per row.

Reference: the BatchSizeManager's per-worker state, Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

from ..balancer_settings import ModelSettings
from .change import ChangeDetector, Deviation
from .costfit import CostFit
from .estimators import SpeedEstimator
from .reports import SiloReport
from .speed import EMAEstimator, LastValueEstimator
from .state import Observation, SiloModel

__all__ = ["COLUMN_ESTIMATORS", "FIT_FIELDS", "History", "SiloColumns", "SiloModels", "SiloView"]

COLUMN_ESTIMATORS = ("ema", "last")
"""Estimators kept as a column (the others: one object per silo)."""

FIT_FIELDS = ("slope", "intercept", "anchor", "level", "noise", "weight", "low", "high", "knee")
"""The cost fit's fields, each a column ``fit_<name>`` (``fit_slope`` NaN: no fit)."""

_FLOATS = {
    "cap": math.nan, "steps": 1.0, "fixed": math.nan, "boost": 1.0, "shape": math.nan,
    "noise": math.nan, "knee": 0.0, "value": math.nan, "last_size": math.nan,
    **{f"fit_{name}": math.nan for name in FIT_FIELDS},
}  # fmt: skip
"""Each float column and its value in a new row."""


class SiloColumns:
    """The columns of every silo's state.

    Parameters
    ----------
    settings : ModelSettings
        The silos' settings (the window's length, the estimator).
    """

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.width = settings.history
        self.columnar = settings.estimator in COLUMN_ESTIMATORS
        self.size = 0
        self.floats = {name: np.full(8, value) for name, value in _FLOATS.items()}
        self.reports = np.zeros(8, dtype=np.int64)
        self.restarted = np.zeros(8, dtype=bool)
        self.hist_x, self.hist_t = np.zeros((8, self.width)), np.zeros((8, self.width))
        self.hist_n = np.zeros(8, dtype=np.intp)
        self.run = {name: np.zeros((8, self.width)) for name in ("x", "t", "speed", "dev")}
        self.run_held = np.zeros((8, self.width), dtype=bool)
        self.run_n = np.zeros(8, dtype=np.intp)
        self.last = np.full(8, None, dtype=object)
        """Each silo's last report (a :class:`SiloReport`, or its fields restored)."""
        self.estimators: list[SpeedEstimator | None] = [None] * 8

    def __getitem__(self, name: str) -> np.ndarray:
        return self.floats[name]

    def add(self) -> int:
        """A new row (its index), grown as needed."""
        self.size += 1
        if self.size >= len(self.reports):
            self._grow(2 * len(self.reports))
        if not self.columnar:
            self.estimators[self.size] = self.settings.new_estimator()
        return self.size

    def _grow(self, rows: int) -> None:
        old = len(self.reports)

        def grown(array: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
            out[:old] = array
            return out

        self.floats = {name: grown(a, _FLOATS[name]) for name, a in self.floats.items()}
        self.reports, self.restarted = grown(self.reports, 0), grown(self.restarted, False)
        self.hist_x, self.hist_t = grown(self.hist_x, 0.0), grown(self.hist_t, 0.0)
        self.hist_n, self.run_n = grown(self.hist_n, 0), grown(self.run_n, 0)
        self.run = {name: grown(a, 0.0) for name, a in self.run.items()}
        self.run_held = grown(self.run_held, False)
        self.last = grown(self.last, None)
        self.estimators.extend([None] * (rows - old))

    # ------------------------------------------------------------------ estimator
    def predict(self, index: int) -> float | None:
        """The silo's predicted speed (``None``: none yet)."""
        if self.columnar:
            value = float(self.floats["value"][index])
            return None if math.isnan(value) else value
        estimator = self.estimators[index]
        return None if estimator is None else estimator.predict()

    def predictions(self, rows: np.ndarray) -> np.ndarray:
        """The predicted speeds of ``rows`` (NaN: none yet; row 0: never reported)."""
        if self.columnar:
            out: np.ndarray = self.floats["value"][rows]
            return out
        predicted = [self.predict(i) for i in rows.tolist()]
        return np.array([math.nan if v is None else v for v in predicted], dtype=np.float64)

    def estimator(self, index: int) -> SpeedEstimator:
        """The silo's estimator as an object (a copy for a column)."""
        if not self.columnar:
            estimator = self.estimators[index]
            assert estimator is not None
            return estimator
        value = self.predict(index)
        if self.settings.estimator == "last":
            return LastValueEstimator(value=value)
        return EMAEstimator(alpha=self.settings.alpha, value=value)

    def restart_estimators(self, rows: np.ndarray) -> None:
        """Fresh estimators at ``rows``."""
        if self.columnar:
            self.floats["value"][rows] = math.nan
        else:
            for i in rows.tolist():
                self.estimators[i] = self.settings.new_estimator()

    def update_estimators(
        self, rows: np.ndarray, speeds: np.ndarray, reports: list[SiloReport] | None = None
    ) -> None:
        """Feed one speed to the estimator of each of ``rows`` (its report's machine use,
        if given, to an estimator object)."""
        if self.settings.estimator == "last":
            self.floats["value"][rows] = speeds
        elif self.columnar:
            value, alpha = self.floats["value"], self.settings.alpha
            old = value[rows]
            value[rows] = np.where(np.isnan(old), speeds, alpha * speeds + (1.0 - alpha) * old)
        else:
            for k, (i, speed) in enumerate(zip(rows.tolist(), speeds.tolist(), strict=True)):
                estimator = self.estimators[i]
                assert estimator is not None
                report = None if reports is None else reports[k]
                if report is None:
                    estimator.update(speed)
                else:
                    estimator.update(
                        speed, cpu_percent=report.cpu_percent,
                        memory_percent=report.memory_percent,
                    )  # fmt: skip

    # ------------------------------------------------------------ record form
    def load(self, index: int, model: SiloModel) -> None:
        """Put a silo's record into row ``index``."""
        f = self.floats
        if self.columnar:
            value = model.estimator.predict()
            f["value"][index] = math.nan if value is None else value
        else:
            self.estimators[index] = model.estimator
        history = list(model.history)[-self.width :]
        self.hist_n[index] = len(history)
        for c, (x, t) in enumerate(history):
            self.hist_x[index, c], self.hist_t[index, c] = x, t
        run = model.detector.run[-self.width :]
        self.run_n[index] = len(run)
        for c, e in enumerate(run):
            for name, v in zip(("x", "t", "speed", "dev"), e.to_list()[:4], strict=True):
                self.run[name][index, c] = v
            self.run_held[index, c] = e.held
        cap = model.max_batch_size
        f["cap"][index] = math.nan if cap is None else float(cap)
        f["steps"][index] = model.steps
        f["fixed"][index] = math.nan if model.fixed_time is None else model.fixed_time
        f["boost"][index] = model.boost
        f["shape"][index] = math.nan if model.shape is None else model.shape
        f["noise"][index] = math.nan if model.noise is None else model.noise
        f["knee"][index] = model.knee
        self.reports[index] = model.reports
        self.last[index] = dict(model.last)
        last = model.last.get("batch_size")
        f["last_size"][index] = math.nan if last is None else float(last)
        fit = model.fit
        values = (
            (math.nan,) * len(FIT_FIELDS)
            if fit is None
            else (fit.slope, fit.intercept, fit.anchor, fit.level, fit.noise, fit.weight,
                  *fit.spread, fit.knee)
        )  # fmt: skip
        for name, v in zip(FIT_FIELDS, values, strict=True):
            f[f"fit_{name}"][index] = v

    def record(self, index: int) -> SiloModel:
        """Row ``index`` as a silo's record."""
        f = self.floats
        n, width = int(self.hist_n[index]), self.width
        history = deque(
            (Observation(int(x), float(t)) for x, t in zip(
                self.hist_x[index, :n].tolist(), self.hist_t[index, :n].tolist(), strict=True
            )),
            maxlen=width,
        )  # fmt: skip
        run = [
            Deviation(int(x), t, s, d, bool(h))
            for x, t, s, d, h in zip(
                *(self.run[name][index, : self.run_n[index]].tolist()
                  for name in ("x", "t", "speed", "dev")),
                self.run_held[index, : self.run_n[index]].tolist(),
                strict=True,
            )
        ]  # fmt: skip
        return SiloModel(
            estimator=self.estimator(index),
            history=history,
            detector=ChangeDetector(confirm=self.settings.change_confirm, window=width, run=run),
            max_batch_size=_optional(f["cap"][index], int),
            steps=float(f["steps"][index]),
            fixed_time=_optional(f["fixed"][index], float),
            last=self.last_fields(index),
            reports=int(self.reports[index]),
            shape=_optional(f["shape"][index], float),
            noise=_optional(f["noise"][index], float),
            boost=float(f["boost"][index]),
            fit=self.fit(index),
            knee=float(f["knee"][index]),
            index=index,
        )

    def last_fields(self, index: int) -> dict[str, Any]:
        """The fields of the silo's last report (``{}``: none)."""
        last = self.last[index]
        if isinstance(last, SiloReport):
            return {k: v for k, v in vars(last).items() if v is not None}
        return {} if last is None else dict(last)

    def fit(self, index: int) -> CostFit | None:
        """The silo's last robust fit (``None``: none)."""
        v = [float(self.floats[f"fit_{name}"][index]) for name in FIT_FIELDS]
        if math.isnan(v[0]):
            return None
        return CostFit(
            slope=v[0], intercept=v[1], anchor=v[2], level=v[3], noise=v[4], weight=v[5],
            spread=(v[6], v[7]), knee=v[8],
        )  # fmt: skip


class History(Sequence[Observation]):
    """A silo's history window read from the columns, oldest first."""

    def __init__(self, columns: SiloColumns, index: int) -> None:
        self._columns, self._index = columns, index

    def __len__(self) -> int:
        return int(self._columns.hist_n[self._index])

    @overload
    def __getitem__(self, k: int) -> Observation: ...
    @overload
    def __getitem__(self, k: slice) -> list[Observation]: ...
    def __getitem__(self, k: int | slice) -> Observation | list[Observation]:
        f, i, n = self._columns, self._index, len(self)
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(n))]
        if not -n <= k < n:
            raise IndexError("history index out of range")
        k %= n
        return Observation(int(f.hist_x[i, k]), float(f.hist_t[i, k]))


class SiloView:
    """One silo's model read from the table's columns (what the iterative allocator and a
    checkpoint read); :meth:`record` takes the whole of it out."""

    def __init__(self, columns: SiloColumns, index: int) -> None:
        self._columns, self.index = columns, index

    @property
    def reports(self) -> int:
        """Reports taken."""
        return int(self._columns.reports[self.index])

    @property
    def history(self) -> History:
        """The window of recent normal reports, oldest first."""
        return History(self._columns, self.index)

    @property
    def last(self) -> dict[str, Any]:
        """Its last report's fields."""
        return self._columns.last_fields(self.index)

    @property
    def estimator(self) -> SpeedEstimator:
        """Its speed estimator (a copy, for an estimator kept as a column)."""
        return self._columns.estimator(self.index)

    @property
    def fixed_time(self) -> float | None:
        """Smoothed fixed per-round seconds (``he-time``)."""
        value = float(self._columns["fixed"][self.index])
        return None if math.isnan(value) else value

    def record(self) -> SiloModel:
        """The silo's whole state as a record."""
        return self._columns.record(self.index)

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state (the balancer's checkpoint format)."""
        return self.record().state()


class SiloModels(Mapping[str, SiloView]):
    """The silos' models by id (their rows in ``index``), read from the columns."""

    def __init__(self, columns: SiloColumns, index: Mapping[str, int]) -> None:
        self._columns, self._index = columns, index

    def __getitem__(self, silo_id: str) -> SiloView:
        return SiloView(self._columns, self._index[silo_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _optional(value: float, kind: type[int] | type[float]) -> Any:
    return None if math.isnan(value) else kind(value)
