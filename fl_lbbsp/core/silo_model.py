"""One silo's model: its speed estimator, history window, cost fit and change detector.

Every report of a silo (batch size x, seconds t) is judged against the silo's own earlier
reports near x (:meth:`SiloModel.near_level`) by the change detector
(:class:`~fl_lbbsp.core.change.ChangeDetector`): a normal report feeds the speed
estimator and the history window; a held one (a possible change) feeds nothing; a
confirmed change restarts the estimator and the window from the reports that confirmed it
(a co-tenant came or went), keeping the fit's shape and noise. After each report the cost
curve ``t = a * max(x, k) + b`` is refitted from the window (:mod:`.costfit`) and the
silo's row of the :class:`SiloTable` is refreshed, so that the allocation only gathers
rows (:mod:`.allocation`).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.2 (per-worker speed prediction), Sec. 3.5 (EMA for
cross-silo FL) and Sec. 4 (the BatchSizeManager's per-worker state); the cost line is
Chen et al., SoCC 2020, Sec. 3.3 and BOA (Yang et al.).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from .balancer_settings import ModelSettings
from .change import ChangeDetector, Deviation, Verdict
from .costfit import CostFit, find_knee, fit_linear_cost, fit_robust_cost, robust_level
from .estimators import SpeedEstimator, estimator_from_state
from .reports import SiloReport
from .slowdown import shared_slowdown

__all__ = ["ROW", "Observation", "SiloModel", "SiloTable"]

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


class Observation(NamedTuple):
    """One report in a silo's history window."""

    batch_size: int
    time: float


@dataclass
class SiloModel:
    """What the balancer knows of one silo.

    Parameters
    ----------
    estimator : SpeedEstimator
        Its speed predictor.
    history : deque of Observation
        The window of recent normal reports, for the cost fit.
    detector : ChangeDetector
        Its change detector (the run of reports deviating to the same side).
    max_batch_size : int | None (default: None)
        Its reported memory cap.
    steps : float (default: 1.0)
        Local steps per round (samples / batch size) of its last report.
    fixed_time : float | None (default: None)
        Smoothed fixed per-round seconds (``he-time``).
    last : dict (default: {})
        Its last report's fields.
    reports : int (default: 0)
        Reports taken.
    shape : float | None (default: None)
        Fixed cost in samples (b / a) of its last fit, once its own batch sizes identified
        it; kept across a change (a co-tenant scales a and b alike).
    noise : float | None (default: None)
        Robust relative residual scale of its last fit with enough reports.
    boost : float (default: 1.0)
        Level ratio of a change confirmed by its last report (widens its change limit).
    fit : CostFit | None (default: None)
        Its last robust fit.
    knee : float (default: 0.0)
        Batch size up to which its time is flat (0: none), kept across a change.
    index : int (default: 0)
        Its row in the :class:`SiloTable`.
    """

    estimator: SpeedEstimator
    history: deque[Observation]
    detector: ChangeDetector
    max_batch_size: int | None = None
    steps: float = 1.0
    fixed_time: float | None = None
    last: dict[str, Any] = field(default_factory=dict)
    reports: int = 0
    shape: float | None = None
    noise: float | None = None
    boost: float = 1.0
    fit: CostFit | None = None
    knee: float = 0.0
    index: int = 0

    @classmethod
    def new(cls, settings: ModelSettings) -> SiloModel:
        """A silo never seen before."""
        return cls(
            estimator=settings.new_estimator(),
            history=deque(maxlen=settings.history),
            detector=ChangeDetector(confirm=settings.change_confirm, window=settings.history),
        )

    def near_level(self, x: int, spread: float) -> float | None:
        """The silo's time at batch size ``x`` from its reports within ``spread`` of it
        (relative), moved along the fitted slope, at least 2 of them, so that an error of
        the line's shape (a fixed cost not identified yet) does not count; ``None``
        without a fit or such reports."""
        fit = self.fit
        if fit is None or len(self.history) < 2:
            return None
        reach = spread * x
        near = [bt + fit.slope * (x - bx) for bx, bt in self.history if abs(bx - x) < reach]
        if len(near) < 2:
            return None
        level = robust_level(near)
        # moved along a steep slope, reports far below x can land at or under zero: no
        # level to judge a time by (the change detection and the common factor take logs)
        return level if math.isfinite(level) and level > 0 else None

    def screen(
        self, x: int, t: float, speed: float, level: float | None, settings: ModelSettings
    ) -> Verdict:
        """Change detection of a report against ``level`` (:meth:`near_level`; ``None``:
        not judged): its log deviation is held beyond ``max(log(1 + change_threshold),
        change_sigmas * noise)``."""
        if settings.change_sigmas is None or level is None:
            self.detector.clear()
            return "normal"
        deviation = math.log(t / level)
        noise = 0.0 if self.noise is None else self.noise
        floor = math.log1p(settings.change_threshold)
        limit = max(floor, settings.change_sigmas * noise)
        entry = Deviation(x, t, speed, deviation, abs(deviation) > limit)
        return self.detector.observe(entry, limit=limit, floor=floor)

    def take(
        self,
        report: SiloReport,
        *,
        scale: float,
        level: float | None,
        restarted: bool,
        settings: ModelSettings,
    ) -> None:
        """Feed a valid report whose time, divided by ``scale`` (the round's shared
        slowdown), is the silo's own; ``restarted``: its estimate was restarted
        (:meth:`restart`), so the next allocation may move it as after a change."""
        x, t = int(report.batch_size), float(report.train_time) / scale
        speed = report.speed * scale
        verdict = self.screen(x, t, speed, level, settings)
        self.reports += 1
        # after a restart, the size its cold report led to was start-up, not capacity
        self.boost = settings.max_boost if restarted else 1.0
        if verdict == "normal":
            self.estimator.update(
                speed, cpu_percent=report.cpu_percent, memory_percent=report.memory_percent
            )
            self.history.append(Observation(x, t))
        elif verdict == "change":
            # speed estimate and window restart from the reports that confirmed it
            confirmed = self.detector.take()
            self.estimator = settings.new_estimator()
            for entry in confirmed:
                self.estimator.update(entry.speed)
            self.history.clear()
            self.history.extend(Observation(e.batch_size, e.time) for e in confirmed)
            level_ratio = math.exp(abs(math.fsum(e.deviation for e in confirmed) / len(confirmed)))
            self.boost = min(level_ratio, settings.max_boost)
        self.steps = report.steps
        if report.max_batch_size is not None:
            self.max_batch_size = int(report.max_batch_size)
        if report.fixed_time is not None:
            new, old, alpha = float(report.fixed_time), self.fixed_time, settings.alpha
            self.fixed_time = new if old is None else alpha * new + (1 - alpha) * old
        self.last = {k: v for k, v in vars(report).items() if v is not None}

    def restart(self, settings: ModelSettings) -> None:
        """Forget what the reports taught the estimate and the window (shape and noise
        are kept), as after a confirmed change."""
        self.estimator = settings.new_estimator()
        self.history.clear()
        self.detector.clear()
        self.boost = 1.0

    def refit(
        self, settings: ModelSettings, pooled_shape: float, *, robust: bool = True
    ) -> tuple[float, float, float]:
        """Refit the cost curve from the window: ``(a, b, knee)`` as the allocation uses
        them (``a`` NaN: no line); ``pooled_shape``: the prior shape while the silo's own
        is not known; ``robust=False``: keep the robust fit (restored from a checkpoint)."""
        a, b, knee = math.nan, 0.0, 0.0
        if not robust and self.fit is not None:
            if settings.fit == "robust":
                a, b, knee = self.fit.slope, self.fit.intercept, self.fit.knee
        elif self.history and (settings.fit == "robust" or settings.change_sigmas is not None):
            xs, ts = zip(*self.history, strict=True)
            # where the silo's time is flat (a knee), then the line above it
            self.knee = find_knee(
                xs,
                ts,
                knee=self.knee,
                noise=self.noise,
                min_relative_spread=settings.min_fit_spread,
            )
            fit = fit_robust_cost(
                xs,
                ts,
                prior_shape=pooled_shape if self.shape is None else self.shape,
                prior_noise=self.noise,
                prior_known=self.shape is not None,
                min_relative_spread=settings.min_fit_spread,
                knee=self.knee,
            )
            self.fit = fit
            if self.shape is not None or fit.weight >= 0.5:
                self.shape = fit.shape  # its own shape, once its batch sizes identified it
            if math.isfinite(fit.noise):
                self.noise = fit.noise
            if settings.fit == "robust":
                a, b, knee = fit.slope, fit.intercept, fit.knee
        else:
            self.fit = None
        if settings.wls and self.history:
            xs, ts = zip(*self.history, strict=True)
            ages = np.arange(len(xs))[::-1]
            line = fit_linear_cost(
                xs,
                ts,
                weights=(1.0 - settings.alpha) ** ages,
                min_relative_spread=settings.min_fit_spread,
            )
            a, b = (math.nan, 0.0) if line is None else line
        return a, b, knee

    def row(self, a: float, b: float, knee: float) -> tuple[float, ...]:
        """Its row of the table (:data:`ROW`) with the cost curve ``a, b, knee``."""
        last = self.last.get("batch_size")
        noise = math.nan if self.noise is None else self.noise
        return (
            math.inf if self.max_batch_size is None else float(self.max_batch_size),
            math.nan if last is None else float(last),
            a,
            b,
            0.0 if self.fixed_time is None else self.fixed_time,
            self.steps,
            self.boost,
            noise / math.sqrt(max(1, len(self.history))),
            knee,
        )

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state (the balancer's checkpoint format)."""
        return {
            "estimator": self.estimator.state(),
            "history": [list(pair) for pair in self.history],
            "max_batch_size": self.max_batch_size,
            "steps": self.steps,
            "fixed_time": self.fixed_time,
            "last": self.last,
            "reports": self.reports,
            "shape": self.shape,
            "noise": self.noise,
            "pending": [entry.to_list() for entry in self.detector.run],
            "boost": self.boost,
            "fit": None if self.fit is None else _fit_state(self.fit),
            "knee": self.knee,
        }

    @classmethod
    def from_state(cls, saved: Mapping[str, Any], settings: ModelSettings) -> SiloModel:
        """Rebuild from :meth:`state`; fields missing from an older state take defaults."""
        history = (Observation(int(x), float(t)) for x, t in saved["history"])
        return cls(
            estimator=estimator_from_state(saved["estimator"]),
            history=deque(history, maxlen=settings.history),
            detector=ChangeDetector(
                confirm=settings.change_confirm,
                window=settings.history,
                run=[Deviation.from_list(p) for p in saved.get("pending", [])],
            ),
            max_batch_size=saved["max_batch_size"],
            steps=float(saved["steps"]),
            fixed_time=saved.get("fixed_time"),
            last=dict(saved.get("last", {})),
            reports=int(saved.get("reports", len(saved["history"]))),
            shape=_optional_float(saved.get("shape")),
            noise=_optional_float(saved.get("noise")),
            boost=float(saved.get("boost", 1.0)),
            fit=None if saved.get("fit") is None else _fit_from_state(saved["fit"]),
            knee=float(saved.get("knee") or 0.0),
        )


class SiloTable:
    """Every silo's model by stable id, and a table of their rows (:data:`ROW`).

    Row 0 is the row of a silo that never reported. The median of the silos' known
    shapes is the prior shape of a silo whose own is not known yet (refreshed by
    :meth:`pool`, before each allocation).

    Parameters
    ----------
    settings : ModelSettings
        The models' settings.
    """

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.models: dict[str, SiloModel] = {}
        self.rows = np.array([_NO_ROW] * 8, dtype=ROW)
        self._index: dict[str, int] = {}
        self._shapes: dict[int, float] = {}
        self.shapes_changed = False
        self.pooled_shape = 0.0
        self._restarted: set[str] = set()  # restarted silos whose next report is not taken

    def take_round(self, reports: Mapping[str, SiloReport], *, shared: bool = False) -> float:
        """Feed valid reports of one round, with (``shared``) the slowdown their silos
        share taken out (:func:`~fl_lbbsp.core.slowdown.shared_slowdown`); return that
        factor (1: none)."""
        models = [self.model(silo) for silo in reports]
        spread, settings = self.settings.min_fit_spread, self.settings
        pairs = list(zip(models, reports.values(), strict=True))
        levels = [m.near_level(r.batch_size, spread) for m, r in pairs]
        scale = 1.0
        if shared:
            lines = [None if m.fit is None else m.fit.slope * r.batch_size + m.fit.intercept
                     for m, r in pairs]  # fmt: skip
            times = [r.train_time for r in reports.values()]
            scale = shared_slowdown(times, levels, lines, threshold=settings.change_threshold)
        for silo, (model, report), level in zip(reports, pairs, levels, strict=True):
            restarted = silo in self._restarted
            self._restarted.discard(silo)
            model.take(report, scale=scale, level=level, restarted=restarted, settings=settings)
            self.refresh(model)
        return scale

    def restart(self, silo_id: str) -> None:
        """Restart a silo's model (:meth:`SiloModel.restart`); its next report may move it
        as far as a confirmed change. A silo not seen yet: nothing."""
        model = self.models.get(silo_id)
        if model is not None:
            model.restart(self.settings)
            self._restarted.add(silo_id)
            self.refresh(model)  # no history: no cost line

    def model(self, silo_id: str) -> SiloModel:
        """The silo's model, made on first sight."""
        if silo_id not in self.models:
            self.register(silo_id, SiloModel.new(self.settings))
        return self.models[silo_id]

    def register(self, silo_id: str, model: SiloModel) -> None:
        """Add a silo and make its row (a restored fit is kept, not refitted)."""
        self.models[silo_id] = model
        model.index = len(self._index) + 1
        self._index[silo_id] = model.index
        if model.shape is not None:
            self._shapes[model.index] = model.shape
            self.shapes_changed = True
        if model.index >= len(self.rows):
            grown = np.array([_NO_ROW] * (2 * len(self.rows)), dtype=ROW)
            grown[: len(self.rows)] = self.rows
            self.rows = grown
        self.refresh(model, refit=model.fit is None)

    def refresh(self, model: SiloModel, *, refit: bool = True) -> None:
        """Refit the silo's cost curve (``refit=False``: keep the restored robust fit)
        and refresh its row."""
        robust = refit or model.fit is None
        a, b, knee = model.refit(self.settings, self.pooled_shape, robust=robust)
        if robust and model.shape is not None and model.fit is not None:
            self._shapes[model.index] = model.shape
            self.shapes_changed = True
        self.rows[model.index] = model.row(a, b, knee)

    def pool(self) -> None:
        """Refresh the pooled shape from the silos' known shapes, if any changed."""
        if self.shapes_changed:
            self.pooled_shape = float(np.median(list(self._shapes.values())))
            self.shapes_changed = False

    def gather(self, ids: Sequence[str]) -> np.ndarray:
        """The rows of ``ids`` (a silo never seen: row 0), as one structured array."""
        index = np.fromiter(map(self._index.get, ids, repeat(0)), np.intp, count=len(ids))
        return self.rows[index]

    def speeds(self, ids: Sequence[str], only: list[int] | None = None) -> np.ndarray | None:
        """Predicted speed of each silo (of those at the indices ``only``, if given); a
        silo without a prediction gets the mean of the others'. ``None`` if no silo has
        one."""
        models = self.models
        if only is not None:
            chosen = [models.get(ids[k]) for k in only]
            some = [None if m is None else m.estimator.predict() for m in chosen]
            if all(v is not None for v in some):  # no mean over the others needed
                return np.array(some, dtype=np.float64)
            speeds = self.speeds(ids)
            return None if speeds is None else speeds[only]
        predicted = [None if m is None else m.estimator.predict() for m in map(models.get, ids)]
        known = [v for v in predicted if v is not None]
        if not known:
            return None
        mean = float(np.mean(known))
        return np.array([mean if v is None else v for v in predicted], dtype=np.float64)

    def cost_line(self, silo_id: str) -> tuple[float, float] | None:
        """The silo's cost line ``(a, b)`` as the allocation uses it (its smoothed fixed
        time in b); ``None`` if it never reported or has no line."""
        model = self.models.get(silo_id)
        row = None if model is None else self.rows[model.index]
        if row is None or math.isnan(row["slope"]):
            return None
        return float(row["slope"]), float(row["intercept"] + row["fixed"])

    def knee(self, silo_id: str) -> float:
        """The silo's knee as the allocation uses it (0: none, or never reported)."""
        model = self.models.get(silo_id)
        return 0.0 if model is None else float(self.rows[model.index]["knee"])

    def warming_up(self) -> dict[str, tuple[int, int]]:
        """Silos whose estimator is still in its warm-up: id -> (reports, warm-up)."""
        out = {}
        for silo, model in self.models.items():
            warmup = getattr(model.estimator, "warmup", None)
            seen = getattr(model.estimator, "observations", None)
            if isinstance(warmup, int) and isinstance(seen, int) and seen < warmup:
                out[silo] = (seen, warmup)
        return out

    def mean_steps(self) -> float:
        """Mean local steps of the silos seen (1 if none)."""
        known = [m.steps for m in self.models.values()]
        return float(np.mean(known)) if known else 1.0


def _fit_state(fit: CostFit) -> dict[str, Any]:
    """A cost fit as JSON (NaN noise as null)."""
    state = asdict(fit)
    state["noise"] = None if math.isnan(fit.noise) else fit.noise
    state["spread"] = list(fit.spread)
    return state


def _fit_from_state(state: Mapping[str, Any]) -> CostFit:
    low, high = state["spread"]
    return CostFit(
        slope=float(state["slope"]),
        intercept=float(state["intercept"]),
        anchor=float(state["anchor"]),
        level=float(state["level"]),
        noise=math.nan if state.get("noise") is None else float(state["noise"]),
        weight=float(state["weight"]),
        spread=(float(low), float(high)),
        knee=float(state.get("knee") or 0.0),
    )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
