"""Every silo's state as columns: one array per field, one row per silo.

The silo table (:class:`~fl_lbbsp.core.silo.model.SiloTable`) works on these columns for a
whole round at once. Row 0 is the row of a silo that never reported. A missing value is
NaN (a float field) or ``None`` (an object field). Each scalar field of the record marked
:class:`~.state.Column` is a column of its name; the record's nested parts keep their own
columns: the last report (``last``, ``last_size``), the cost fit (``fit_<name>``), the
history window and the change detector's run (``(rows, W)`` arrays, their entries in the
first ``n`` columns, oldest first), the speed estimator's
(:meth:`~.estimators.SpeedEstimator.fresh`).

Reference: the BatchSizeManager's per-worker state, Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .costfit import CostFits
from .detector import RUN, new_runs
from .estimators import MachineUse, SpeedEstimator
from .reports import SiloReport
from .state import Column, Observation, SiloModel

__all__ = ["FIT_FIELDS", "SiloColumns", "SiloModels", "SiloView"]

FIT_FIELDS = CostFits._fields
"""The cost fit's fields, each a column ``fit_<name>`` (``fit_slope`` NaN: no fit)."""


class SiloColumns:
    """The columns of every silo's state.

    Parameters
    ----------
    estimator : SpeedEstimator
        The silos' speed estimator.
    width : int
        The history window's length.
    model : type of SiloModel (default: SiloModel)
        The record, whose fields marked :class:`~.state.Column` are columns.
    """

    def __init__(
        self, *, estimator: SpeedEstimator, width: int, model: type[SiloModel] = SiloModel
    ) -> None:
        self.model, self.width, self.estimator = model, width, estimator
        self.size = 0
        self.kinds = {
            name: mark.kind
            for name, field in model.model_fields.items()
            for mark in field.metadata
            if isinstance(mark, Column)
        }
        """Each scalar column of the record and its field's type."""
        self.new: dict[str, Any] = {
            **{name: _nan(model.model_fields[name].default) for name in self.kinds},
            "last_size": math.nan, **{f"fit_{name}": math.nan for name in FIT_FIELDS},
        }  # fmt: skip
        """Each scalar column and its value in a new row."""
        self.scalars = {name: np.full(8, value) for name, value in self.new.items()}
        self.restarted = np.zeros(8, dtype=bool)
        self.hist_x, self.hist_t = np.zeros((8, self.width)), np.zeros((8, self.width))
        self.hist_n = np.zeros(8, dtype=np.intp)
        self.run = new_runs(8, self.width)
        """The change detector's runs (:func:`~.detector.new_runs`)."""
        self.last = np.full(8, None, dtype=object)
        """Each silo's last report (a :class:`SiloReport`, or its fields restored)."""
        self.est = self.estimator.fresh(8)
        """The speed estimator's columns."""

    def __getitem__(self, name: str) -> np.ndarray:
        return self.scalars[name]

    def add(self) -> int:
        """A new row (its index), grown as needed."""
        self.size += 1
        if self.size >= len(self.restarted):
            self._grow(2 * len(self.restarted))
        return self.size

    def _grow(self, rows: int) -> None:
        old = len(self.restarted)

        def grown(array: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
            out[:old] = array
            return out

        self.scalars = {name: grown(a, self.new[name]) for name, a in self.scalars.items()}
        self.restarted = grown(self.restarted, False)
        self.hist_x, self.hist_t = grown(self.hist_x, 0.0), grown(self.hist_t, 0.0)
        self.hist_n = grown(self.hist_n, 0)
        self.run = {name: grown(a, a.dtype.type(0)) for name, a in self.run.items()}
        self.last = grown(self.last, None)
        fresh = self.estimator.fresh(rows - old)
        self.est = {name: np.concatenate([a, fresh[name]]) for name, a in self.est.items()}

    def predictions(self, rows: np.ndarray) -> np.ndarray:
        """The predicted speeds of ``rows`` (NaN: none yet; row 0: never reported)."""
        return self.estimator.predict(self.est, rows)

    def restart_estimators(self, rows: np.ndarray) -> None:
        """Fresh estimators at ``rows``."""
        self.estimator.restart(self.est, rows)

    def update_estimators(
        self, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None = None
    ) -> None:
        """Feed one speed to the estimator of each of ``rows`` (with the machine's use)."""
        self.estimator.update(self.est, rows, speeds, use)

    def load(self, index: int, model: SiloModel) -> None:
        """Put a silo's record into row ``index``."""
        f = self.scalars
        self.estimator.restart(self.est, np.array([index]))
        self.estimator.load(self.est, index, model.estimator.model_dump())
        history = list(model.history)[-self.width :]
        self.hist_n[index] = len(history)
        for c, (x, t) in enumerate(history):
            self.hist_x[index, c], self.hist_t[index, c] = x, t
        run = model.pending[-self.width :]
        self.run["n"][index] = len(run)
        for c, entry in enumerate(run):
            for name, v in zip((*RUN, "held"), entry, strict=True):
                self.run[name][index, c] = v
        for name in self.kinds:
            f[name][index] = _nan(getattr(model, name))
        last = {} if model.last is None else model.last.model_dump(exclude_unset=True)
        self.last[index] = last
        f["last_size"][index] = float(last.get("batch_size", math.nan))
        fit = {} if model.fit is None else model.fit.model_dump()
        fit["low"], fit["high"] = fit.pop("spread", (None, None))
        for name in FIT_FIELDS:
            f[f"fit_{name}"][index] = _nan(fit.get(name))

    def record(self, index: int) -> SiloModel:
        """Row ``index`` as a silo's record (validated as a checkpoint's silo is)."""
        f = self.scalars
        n, run = int(self.hist_n[index]), int(self.run["n"][index])
        window = (self.hist_x[index, :n].tolist(), self.hist_t[index, :n].tolist())
        entries = (self.run[name][index, :run].tolist() for name in (*RUN, "held"))
        history = [[int(x), t] for x, t in zip(*window, strict=True)]
        pending = [[int(x), *rest] for x, *rest in zip(*entries, strict=True)]
        fit = {name: _optional(f[f"fit_{name}"][index], float) for name in FIT_FIELDS}
        fit["spread"] = (fit.pop("low"), fit.pop("high"))
        return self.model.model_validate({
            "estimator": self.estimator.silo_state(self.est, index),
            "history": history,
            "last": self.last_fields(index),
            "pending": pending,
            "fit": None if fit["slope"] is None else fit,
            **{name: _optional(f[name][index], kind) for name, kind in self.kinds.items()},
        })  # fmt: skip

    def last_fields(self, index: int) -> dict[str, Any]:
        """The fields of the silo's last report (``{}``: none)."""
        last = self.last[index]
        if isinstance(last, SiloReport):  # plain numbers (a report may hold numpy's)
            fields = {k: v for k, v in vars(last).items() if v is not None}
            return {k: v.item() if isinstance(v, np.generic) else v for k, v in fields.items()}
        return {} if last is None else dict(last)


class SiloView:
    """One silo's model read from the table's columns: its window and, taken out whole,
    its state."""

    def __init__(self, columns: SiloColumns, index: int) -> None:
        self._columns, self.index = columns, index

    @property
    def history(self) -> list[Observation]:
        """The window of recent normal reports, oldest first."""
        f, i = self._columns, self.index
        n = int(f.hist_n[i])
        window = zip(f.hist_x[i, :n].tolist(), f.hist_t[i, :n].tolist(), strict=True)
        return [Observation(int(x), t) for x, t in window]

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state (the balancer's checkpoint format)."""
        return self._columns.record(self.index).state()


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


def _nan(value: Any) -> Any:
    return math.nan if value is None else value
