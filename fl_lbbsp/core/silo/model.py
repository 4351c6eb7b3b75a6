"""The silos' models, as one table: estimator, history window, cost fit, change detector.

Every report of a silo (batch size x, seconds t) is judged against the silo's own earlier
reports near x (:meth:`SiloTable.near_levels`) by the change detector (the run of
deviations of :func:`~fl_lbbsp.core.silo.detector.observe_run`, over columns): a normal
report feeds the speed estimator and the history window; a held one (a possible change)
feeds nothing; a confirmed change restarts the estimator and the window from the reports
that confirmed it (a co-tenant came or went), keeping the fit's shape and noise. After the
reports the cost curves ``t = a * max(x, k) + b`` are refitted from the windows
(:func:`~.costfit.fit_windows`) and the silos' rows of the table (:data:`ROW`) refreshed, so that
the allocation only gathers rows (:mod:`.allocation`). A whole round is one pass of array
operations over the silos' columns (:mod:`.columns`); one silo's state comes out as
a record (:class:`~fl_lbbsp.core.silo.state.SiloModel`, the checkpoint form).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.2 (per-worker speed prediction), Sec. 3.5 (EMA for
cross-silo FL) and Sec. 4 (the BatchSizeManager's per-worker state); the cost line is
Chen et al., SoCC 2020, Sec. 3.3 and BOA (Yang et al.).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Protocol

import numpy as np

from ..slowdown import shared_slowdown
from .columns import FIT_FIELDS, SiloColumns, SiloModels, SiloView
from .costfit import fit_linear_cost, fit_windows
from .detector import near_levels, observe_run, push
from .estimators import EMA, MachineUse, SpeedEstimator
from .reports import ReportColumns, SiloReport
from .state import Observation, SiloModel

__all__ = ["ROW", "Observation", "SiloModel", "SiloTable", "SiloView"]

ROW = np.dtype(
    [
        ("cap", np.float64),  # memory cap (inf: none)
        ("last", np.float64),  # last reported batch size (NaN: none)
        ("slope", np.float64),  # cost line a (NaN: no fit)
        ("intercept", np.float64),  # cost line b
        ("fixed", np.float64),  # smoothed fixed time (he-time; 0: none)
        ("steps", np.float64),  # local steps per round (NaN: never reported)
        ("boost", np.float64),  # change limit's widening after a confirmed change
        ("error", np.float64),  # standard error of the fitted time (NaN: unknown)
        ("knee", np.float64),  # batch size up to which the time is flat (0: none)
    ]
)
"""One silo's row of what the allocation needs, by field name."""

_NO_ROW = (math.inf, math.nan, math.nan, 0.0, 0.0, math.nan, 1.0, math.nan, 0.0)
"""The row of a silo that never reported."""


class ModelTuning(Protocol):
    """The settings the silos' models read (:class:`~fl_lbbsp.core.settings.Tuning` has
    them; declared here so that the silo model does not depend on the settings)."""

    @property
    def alpha(self) -> float: ...
    @property
    def history(self) -> int: ...
    @property
    def min_fit_spread(self) -> float: ...
    @property
    def fit(self) -> str: ...
    @property
    def change_sigmas(self) -> float | None: ...
    @property
    def change_threshold(self) -> float: ...
    @property
    def change_confirm(self) -> int: ...
    @property
    def max_change_ratio(self) -> float | None: ...


class SiloTable:
    """Every silo's model by stable id, as columns, and a table of their rows (:data:`ROW`).

    Row 0 is the row of a silo that never reported. The median of the silos' known
    shapes is the prior shape of a silo whose own is not known yet (refreshed by
    :meth:`pool`, before each allocation).

    Parameters
    ----------
    settings : ModelTuning
        The models' settings (the window, the fits, the change detection).
    estimator : SpeedEstimator
        The speed estimator (the one ``settings`` name).
    wls : bool
        Whether the weighted least-squares line is also made (the linear allocator with
        ``fit="wls"``; ``alpha`` is its decay).
    """

    def __init__(self, settings: ModelTuning, *, estimator: SpeedEstimator, wls: bool) -> None:
        self.settings, self.wls = settings, wls
        self.max_boost = (settings.max_change_ratio or 1.0) ** 2
        """The most a confirmed change (or a restart) widens the change limit by."""
        self.columns = SiloColumns(estimator=estimator, width=settings.history)
        self.rows = np.array([_NO_ROW] * 8, dtype=ROW)
        self._index: dict[str, int] = {}
        self.models = SiloModels(self.columns, self._index)
        """Each silo's model by id, read from the columns (:class:`SiloView`)."""
        self.shapes_changed = False
        self.pooled_shape = 0.0

    def take_columns(
        self, silos: Sequence[str], reports: Sequence[SiloReport], columns: ReportColumns,
        *, shared: bool = False,
    ) -> float:  # fmt: skip
        """Feed valid reports of one round, their fields already ``columns``
        (:func:`~fl_lbbsp.core.silo.reports.report_columns`), with (``shared``) the
        slowdown their silos share taken out
        (:func:`~fl_lbbsp.core.slowdown.shared_slowdown`); return that factor (1: none)."""
        if not silos:
            return 1.0
        rows = np.fromiter(map(self._index.get, silos, repeat(0)), np.intp, count=len(silos))
        if not rows.all():  # a silo never seen: rows made in order
            rows = np.fromiter(map(self.index, silos), np.intp, count=len(silos))
        size, time, samples = columns.batch_size, columns.train_time, columns.samples
        levels = self.near_levels(rows, size)
        scale = 1.0
        if shared:
            scale = _round_slowdown(
                self.columns, rows, (size, time, levels), self.settings.change_threshold
            )
        speed = np.where(np.isnan(samples), size, samples) / time
        self._take(rows, size, time / scale, speed * scale, levels, reports)
        _take_fields(self.columns, rows, reports, columns, self.settings.alpha)
        self.refresh(rows)
        return scale

    def near_levels(self, rows: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Each silo's time at batch size ``size`` from its own earlier reports near it
        (:func:`~fl_lbbsp.core.silo.detector.near_levels`); NaN: none."""
        f = self.columns
        return near_levels(
            (f.hist_x, f.hist_t, f.hist_n), f["fit_slope"][rows], rows, size,
            spread=self.settings.min_fit_spread,
        )  # fmt: skip

    def _take(
        self, rows: np.ndarray, x: np.ndarray, t: np.ndarray, speed: np.ndarray,
        level: np.ndarray, reports: Sequence[SiloReport],
    ) -> None:  # fmt: skip
        """Screen the reports (change detection) and feed the normal ones to the silos'
        estimators and windows; a confirmed change restarts them from its reports."""
        f, settings = self.columns, self.settings
        judged = ~np.isnan(level) if settings.change_sigmas is not None else np.zeros(
            len(rows), dtype=bool
        )  # fmt: skip
        f.run["n"][rows[~judged]] = 0
        normal = ~judged
        change = np.zeros(len(rows), dtype=bool)
        if judged.any():
            j = np.flatnonzero(judged)
            deviation = np.log(t[j] / level[j])
            noise = np.nan_to_num(f["noise"][rows[j]], nan=0.0)
            floor = math.log1p(settings.change_threshold)
            limit = np.maximum(floor, settings.change_sigmas * noise)
            held = np.abs(deviation) > limit
            confirmed = observe_run(
                f.run, rows[j], (x[j], t[j], speed[j], deviation), held, limit=limit, floor=floor,
                confirm=settings.change_confirm,
            )  # fmt: skip
            normal[j] = ~confirmed & ~held
            change[j] = confirmed
        f["reports"][rows] += 1
        # after a restart, the size its cold report led to was start-up, not capacity
        f["boost"][rows] = np.where(f.restarted[rows], self.max_boost, 1.0)
        f.restarted[rows] = False
        k = np.flatnonzero(normal)
        use = None
        if f.estimator.uses_machine:
            chosen = [reports[i] for i in k.tolist()]
            use = MachineUse(_floats(chosen, "cpu_percent"), _floats(chosen, "memory_percent"))
        f.update_estimators(rows[k], speed[k], use)
        f.hist_n[rows[k]] = push((f.hist_x, f.hist_t), f.hist_n[rows[k]], rows[k], (x[k], t[k]))
        if change.any():
            self._take_changes(rows[change])

    def _take_changes(self, rows: np.ndarray) -> None:
        """Restart the estimator and the window of each of ``rows`` from the reports that
        confirmed its change, widen its change limit by the change's size, empty its
        run."""
        f, run = self.columns, self.columns.run
        for i in rows.tolist():
            n = int(run["n"][i])
            one = np.array([i])
            f.restart_estimators(one)
            for speed in run["speed"][i, :n].tolist():  # oldest first
                f.update_estimators(one, np.array([speed]))
            f.hist_x[i, :n], f.hist_t[i, :n] = run["x"][i, :n], run["t"][i, :n]
            f.hist_n[i] = n
            level_ratio = math.exp(abs(float(run["dev"][i, :n].sum()) / n))
            f["boost"][i] = min(level_ratio, self.max_boost)
            run["n"][i] = 0

    def restart(self, silo_id: str) -> None:
        """Forget what a silo's reports taught its estimate and window, as after a
        confirmed change (shape and noise kept); its next report may move it as far as a
        confirmed change. A silo not seen yet: nothing."""
        i = self._index.get(silo_id)
        if i is not None:
            f, rows = self.columns, np.array([i])
            f.restart_estimators(rows)
            f.hist_n[i] = f.run["n"][i] = 0
            f["boost"][i] = 1.0
            f.restarted[i] = True
            self.refresh(rows)  # no history: no cost line

    def index(self, silo_id: str) -> int:
        """The silo's row, made on first sight."""
        i = self._index.get(silo_id)
        if i is None:
            i = self._index[silo_id] = self.columns.add()
            self._grow_rows()
        return i

    def register(self, silo_id: str, model: SiloModel) -> None:
        """Add a silo from its record and make its row (a restored fit is kept, not
        refitted)."""
        i = self.index(silo_id)
        self.columns.load(i, model)
        if model.shape is not None:
            self.shapes_changed = True
        self.refresh(np.array([i]), refit=model.fit is None)

    def _grow_rows(self) -> None:
        if self.columns.size >= len(self.rows):
            grown = np.array([_NO_ROW] * (2 * len(self.rows)), dtype=ROW)
            grown[: len(self.rows)] = self.rows
            self.rows = grown

    def refresh(self, rows: np.ndarray, *, refit: bool = True) -> None:
        """Refit the silos' cost curves from their windows (``refit=False``: keep their
        restored robust fits) and refresh their rows."""
        f, settings = self.columns, self.settings
        n = f.hist_n[rows]
        a, b, knee = np.full(len(rows), np.nan), np.zeros(len(rows)), np.zeros(len(rows))
        robust = settings.fit == "robust"
        if not refit:
            if robust:
                a, b, knee = f["fit_slope"][rows], f["fit_intercept"][rows], f["fit_knee"][rows]
        elif robust or settings.change_sigmas is not None:
            fitted = rows[n > 0]
            if fitted.size < rows.size:
                for name in FIT_FIELDS:
                    f[f"fit_{name}"][rows[n == 0]] = np.nan
            if fitted.size:
                self._refit(fitted)
                if robust:
                    a, b, knee = (f[f"fit_{name}"][rows] for name in ("slope", "intercept", "knee"))
                    knee = np.nan_to_num(knee, nan=0.0)
                    b = np.nan_to_num(b, nan=0.0)
        else:
            for name in FIT_FIELDS:
                f[f"fit_{name}"][rows] = np.nan
        if self.wls:
            a = a.copy()
            for k, i in enumerate(rows.tolist()):
                if f.hist_n[i]:
                    line = _wls(f, i, self.settings)
                    a[k], b[k] = (math.nan, 0.0) if line is None else line
        _write_rows(f, self.rows, rows, (a, b, knee))

    def _refit(self, rows: np.ndarray) -> None:
        """The robust fit and the knee of ``rows`` (each with a window)."""
        f, spread = self.columns, self.settings.min_fit_spread
        n = f.hist_n[rows]
        width = int(n.max())  # the longest window: the columns beyond it are empty
        x, t = f.hist_x[rows, :width], f.hist_t[rows, :width]
        shape, noise = f["shape"][rows], f["noise"][rows]
        known = ~np.isnan(shape)
        fit = fit_windows(
            x, t, n, knee=f["knee"][rows], noise=noise,
            prior_shape=np.where(known, shape, self.pooled_shape), prior_known=known,
            min_relative_spread=spread,
        )  # fmt: skip
        f["knee"][rows] = fit.knee
        for name, values in zip(FIT_FIELDS, fit, strict=True):
            f[f"fit_{name}"][rows] = values
        # its own shape, once its batch sizes identified it
        own = known | (fit.weight >= 0.5)
        f["shape"][rows] = np.where(own, fit.intercept / fit.slope, shape)
        f["noise"][rows] = np.where(np.isfinite(fit.noise), fit.noise, noise)
        if own.any():
            self.shapes_changed = True

    def pool(self) -> None:
        """Refresh the pooled shape from the silos' known shapes, if any changed."""
        if self.shapes_changed:
            shapes = self.columns["shape"][1 : self.columns.size + 1]
            self.pooled_shape = float(np.median(shapes[~np.isnan(shapes)]))
            self.shapes_changed = False

    def gather(self, ids: Sequence[str]) -> np.ndarray:
        """The rows of ``ids`` (a silo never seen: row 0), as one structured array."""
        index = np.fromiter(map(self._index.get, ids, repeat(0)), np.intp, count=len(ids))
        # the rows as a float table (every field a float64): one gather, not one per record
        table = self.rows.view(np.float64).reshape(len(self.rows), ROW.itemsize // 8)
        gathered: np.ndarray = np.take(table, index, axis=0).view(ROW).reshape(len(ids))
        return gathered

    def speeds(self, ids: Sequence[str], only: list[int] | None = None) -> np.ndarray | None:
        """Predicted speed of each silo (of those at the indices ``only``, if given); a
        silo without a prediction gets the mean of the others'. ``None`` if no silo has
        one."""
        f = self.columns
        rows = np.fromiter(map(self._index.get, ids, repeat(0)), np.intp, count=len(ids))
        if only is not None:
            some = f.predictions(rows[only])
            if not np.isnan(some).any():  # no mean over the others needed
                return some
            speeds = self.speeds(ids)
            return None if speeds is None else speeds[only]
        predicted = f.predictions(rows)
        known = ~np.isnan(predicted)
        if not known.any():
            return None
        return np.where(known, predicted, float(np.mean(predicted[known])))

    def cost_line(self, silo_id: str) -> tuple[float, float] | None:
        """The silo's cost line ``(a, b)`` as the allocation uses it (its smoothed fixed
        time in b); ``None`` if it never reported or has no line."""
        i = self._index.get(silo_id)
        row = None if i is None else self.rows[i]
        if row is None or math.isnan(row["slope"]):
            return None
        return float(row["slope"]), float(row["intercept"] + row["fixed"])

    def knee(self, silo_id: str) -> float:
        """The silo's knee as the allocation uses it (0: none, or never reported)."""
        i = self._index.get(silo_id)
        return 0.0 if i is None else float(self.rows[i]["knee"])

    def predict(self, silo_id: str) -> float | None:
        """The silo's predicted speed (``None``: never reported)."""
        i = self._index.get(silo_id)
        value = math.nan if i is None else float(self.columns.predictions(np.array([i]))[0])
        return None if math.isnan(value) else value

    def fixed_time(self, silo_id: str) -> float | None:
        """The silo's smoothed fixed time (``None``: never reported)."""
        i = self._index.get(silo_id)
        value = math.nan if i is None else float(self.columns["fixed_time"][i])
        return None if math.isnan(value) else value

    def report_counts(self, ids: Sequence[str]) -> dict[str, int]:
        """Reports taken by each silo of ``ids`` seen so far (in the order of ``ids``)."""
        seen = [i for i in ids if i in self._index]
        rows = np.fromiter(map(self._index.__getitem__, seen), np.intp, count=len(seen))
        return dict(zip(seen, self.columns["reports"][rows].tolist(), strict=True))

    def window_sizes(self, ids: Sequence[str]) -> dict[str, int]:
        """Reports in each silo's history window (0 after a restart, until it reports)."""
        rows = np.fromiter(map(self._index.__getitem__, ids), np.intp, count=len(ids))
        return dict(zip(ids, self.columns.hist_n[rows].tolist(), strict=True))

    def newest(self, ids: Sequence[str], field: str) -> dict[str, Any]:
        """Each silo's newest time in its window (``field`` ``"time"``; IndexError on an
        empty window) or a field of its last report (``None``: not given)."""
        f = self.columns
        rows = np.fromiter(map(self._index.__getitem__, ids), np.intp, count=len(ids))
        if field == "time":
            n = f.hist_n[rows]
            if (n == 0).any():
                raise IndexError("history index out of range")
            return dict(zip(ids, f.hist_t[rows, n - 1].tolist(), strict=True))
        return {i: _field(f.last[k], field) for i, k in zip(ids, rows.tolist(), strict=True)}

    def warming_up(self) -> dict[str, tuple[int, int]]:
        """Silos whose estimator is still in its warm-up: id -> (reports, warm-up)."""
        f = self.columns
        warming = {silo: f.estimator.warming_up(f.est, i) for silo, i in self._index.items()}
        return {silo: w for silo, w in warming.items() if w is not None}

    def mean_steps(self) -> float:
        """Mean local steps of the silos seen (1 if none)."""
        size = self.columns.size
        return float(np.mean(self.columns["steps"][1 : size + 1])) if size else 1.0


def _round_slowdown(
    f: SiloColumns, rows: np.ndarray, round_: tuple[np.ndarray, np.ndarray, np.ndarray],
    threshold: float,
) -> float:  # fmt: skip
    """:func:`~fl_lbbsp.core.slowdown.shared_slowdown` of a round ``(size, time, levels)``
    of ``rows`` (their fitted lines standing in where a level is missing)."""
    size, time, levels = round_
    lines = f["fit_slope"][rows] * size + f["fit_intercept"][rows]
    return shared_slowdown(time.tolist(), _nones(levels), _nones(lines), threshold=threshold)


def _take_fields(
    f: SiloColumns, rows: np.ndarray, reports: Sequence[SiloReport], columns: ReportColumns,
    alpha: float,
) -> None:  # fmt: skip
    """The reports' own fields: local steps, memory cap, fixed time, last report."""
    size, samples = columns.batch_size, columns.samples
    f["steps"][rows] = np.where(np.isnan(samples), 1.0, samples / size)
    cap = columns.max_batch_size
    f["max_batch_size"][rows] = np.where(np.isnan(cap), f["max_batch_size"][rows], cap)
    new = columns.fixed_time
    given = ~np.isnan(new)
    EMA(alpha=alpha).update({"value": f["fixed_time"]}, rows[given], new[given], None)
    f.last[rows] = np.fromiter(reports, dtype=object, count=len(reports))
    f["last_size"][rows] = size


def _wls(f: SiloColumns, i: int, settings: ModelTuning) -> tuple[float, float] | None:
    """The weighted least-squares line of row ``i``'s window (older reports weigh less)."""
    n = int(f.hist_n[i])
    ages = np.arange(n)[::-1]
    return fit_linear_cost(
        f.hist_x[i, :n], f.hist_t[i, :n], weights=(1.0 - settings.alpha) ** ages,
        min_relative_spread=settings.min_fit_spread,
    )  # fmt: skip


def _write_rows(
    f: SiloColumns, out: np.ndarray, rows: np.ndarray,
    curve: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:  # fmt: skip
    """Refresh ``rows`` of the table (:data:`ROW`) from the columns, with the cost curve
    ``(a, b, knee)``."""
    cap = f["max_batch_size"][rows]
    out["cap"][rows] = np.where(np.isnan(cap), np.inf, cap)
    out["last"][rows] = f["last_size"][rows]
    out["slope"][rows], out["intercept"][rows], out["knee"][rows] = curve
    out["fixed"][rows] = np.nan_to_num(f["fixed_time"][rows], nan=0.0)
    out["steps"][rows], out["boost"][rows] = f["steps"][rows], f["boost"][rows]
    out["error"][rows] = f["noise"][rows] / np.sqrt(np.maximum(1, f.hist_n[rows]))


def _field(last: object, name: str) -> Any:
    """A field of a last report (a :class:`SiloReport`, or its fields restored)."""
    return last.get(name) if isinstance(last, dict) else getattr(last, name, None)


def _floats(reports: Sequence[SiloReport], name: str) -> np.ndarray:
    """A field of each report as floats (NaN: not given)."""
    values = (getattr(r, name) for r in reports)
    return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)


def _nones(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values.tolist()]
