"""NARX speed predictor: a one-hidden-layer network over the last two values of a
worker's speed, CPU use and memory use, trained online off the critical path.

``v^k = F(v^{k-1}, v^{k-2}, c^{k-1}, c^{k-2}, m^{k-1}, m^{k-2})`` (Eq. 4 with look-back
windows of 2; the CPU and memory of a round are reported with its speed, so the latest
ones known before round k are those of round k-1). Until ``warmup`` observations the
prediction is the EMA; from then on the network is retrained every ``train_every``
observations on the recent history, warm-started from its last weights, with early
stopping (loss improving by less than ``tol`` for ``patience`` epochs in a row), in a
background thread so the server's round is never slowed. Prediction is a numpy forward
pass over the last trained weights, so torch is imported only by the training thread.

Reference: Chen et al., IEEE TCC 2021, Sec. 3.2.2 (Eq. 4, Fig. 3, look-back 2, one hidden
layer) and Chen et al., SoCC 2020, Sec. 4.2 (online training after 500 iterations, EMA
before, early stopping at < 1e-4 for 4 steps, low-priority background training).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from .estimators import EMA, Alpha, MachineUse, SpeedEstimator, State, _none, register

__all__ = ["NARX", "NARXNetwork"]

FloatArray = npt.NDArray[np.float64]

_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """One shared background thread: models of different workers train in turn."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fl-lbbsp-narx")
        return _EXECUTOR


class NARXNetwork:
    """One worker's NARX network of its sample-processing speed (the registry's
    :class:`NARX` keeps one per silo, and the EMA it falls
    back on).

    Parameters
    ----------
    settings : NARX
        The estimator whose fields are the network's settings (warm-up, hidden units,
        training cadence and early stopping), declared and checked there.
    """

    inputs = 6

    def __init__(self, *, settings: NARX) -> None:
        self.settings = settings
        self._series: deque[tuple[float, float, float]] = deque(maxlen=settings.history)
        self.observations = 0
        self._trained_at = 0
        self._weights: dict[str, FloatArray] | None = None
        self._scale = 1.0
        self._lock = threading.Lock()
        self._pending: Future[None] | None = None

    def update(self, speed: float, *, cpu: float | None, memory: float | None) -> None:
        """Record a round's speed, CPU and memory use (percent; ``None`` counts as the
        previous value, or 0), and retrain when due."""
        previous = self._series[-1] if self._series else (speed, 0.0, 0.0)
        cpu = previous[1] if cpu is None else float(cpu)
        memory = previous[2] if memory is None else float(memory)
        with self._lock:
            self._series.append((float(speed), cpu, memory))
            self.observations += 1
        warmup, seen = self.settings.warmup, self.observations
        due = (seen >= warmup and seen - self._trained_at >= self.settings.train_every) or (
            seen == warmup
        )
        if due and (self._pending is None or self._pending.done()):
            self._trained_at = self.observations
            if self.settings.background:
                self._pending = _executor().submit(self._train)
            else:
                self._train()

    def predict(self, fallback: float) -> float:
        """Network prediction once trained, else ``fallback`` (the EMA; NaN: none)."""
        with self._lock:
            weights, scale = self._weights, self._scale
            features = self._features_for_next()
        if weights is None or features is None or math.isnan(fallback):
            return fallback
        value = float(_forward(weights, features[None, :])[0]) * scale
        # A diverged or nonsensical network never replaces the EMA.
        if not math.isfinite(value) or not 0.1 * fallback <= value <= 10.0 * fallback:
            return fallback
        return value

    @property
    def trained(self) -> bool:
        """Whether a trained network is in use."""
        return self._weights is not None

    def wait(self, timeout: float | None = None) -> None:
        """Block until a background training in progress has finished."""
        pending = self._pending
        if pending is not None:
            pending.result(timeout=timeout)

    def _dataset(self) -> tuple[FloatArray, FloatArray, float] | None:
        with self._lock:
            series = np.asarray(self._series, dtype=np.float64)
        if len(series) < 3:
            return None
        scale = float(np.mean(series[:, 0]))
        v, c, m = series[:, 0] / scale, series[:, 1] / 100.0, series[:, 2] / 100.0
        x = np.stack([v[1:-1], v[:-2], c[1:-1], c[:-2], m[1:-1], m[:-2]], axis=1)
        return x, v[2:], scale

    def _features_for_next(self) -> FloatArray | None:
        if len(self._series) < 2:
            return None
        (v1, c1, m1), (v0, c0, m0) = self._series[-1], self._series[-2]
        scale = self._scale
        return np.array([v1 / scale, v0 / scale, c1 / 100, c0 / 100, m1 / 100, m0 / 100])

    def _initial_weights(self) -> dict[str, FloatArray]:
        rng = np.random.default_rng(self.settings.seed)
        hidden = self.settings.hidden
        bound_in = 1.0 / math.sqrt(self.inputs)
        bound_hidden = 1.0 / math.sqrt(hidden)
        return {
            "w1": rng.uniform(-bound_in, bound_in, (hidden, self.inputs)),
            "b1": rng.uniform(-bound_in, bound_in, hidden),
            "w2": rng.uniform(-bound_hidden, bound_hidden, (1, hidden)),
            # Start at "same as the last speed" (normalised speeds are about 1).
            "b2": np.ones(1),
        }

    def _train(self) -> None:
        data = self._dataset()
        if data is None:
            return
        x, y, scale = data
        start = self._weights if self._weights is not None else self._initial_weights()
        weights = _fit(start, x, y, self.settings)
        with self._lock:
            self._weights, self._scale = weights, scale

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state (waits for a training in progress)."""
        self.wait()
        with self._lock:
            return {
                "series": [list(row) for row in self._series],
                "observations": self.observations,
                "trained_at": self._trained_at,
                "scale": self._scale,
                "weights": None
                if self._weights is None
                else {k: v.tolist() for k, v in self._weights.items()},
            }

    def load(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state`."""
        self._series.extend(tuple(float(v) for v in row) for row in state["series"])  # type: ignore[misc]
        self.observations = int(state["observations"])
        self._trained_at = int(state["trained_at"])
        self._scale = float(state["scale"])
        if state.get("weights") is not None:
            self._weights = {
                k: np.asarray(v, dtype=np.float64) for k, v in state["weights"].items()
            }


def _forward(weights: Mapping[str, Any], x: Any, tanh: Any = np.tanh) -> Any:
    """The network's output for the rows of ``x`` (numpy arrays, or torch tensors with
    ``tanh=torch.tanh``)."""
    hidden = tanh(x @ weights["w1"].T + weights["b1"])
    return (hidden @ weights["w2"].T + weights["b2"])[:, 0]


def _fit(
    start: dict[str, FloatArray], x: FloatArray, y: FloatArray, settings: NARX
) -> dict[str, FloatArray]:
    """Full-batch Adam on the mean squared error, with early stopping (torch, lazily)."""
    import torch

    tol, patience = settings.tol, settings.patience
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in start.items()}
    xt = torch.tensor(x, dtype=torch.float64)
    yt = torch.tensor(y, dtype=torch.float64)
    optimizer = torch.optim.Adam(list(params.values()), lr=settings.lr)
    best = math.inf
    stale = 0
    for _ in range(settings.max_epochs):
        optimizer.zero_grad()
        loss = torch.mean((_forward(params, xt, torch.tanh) - yt) ** 2)
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
        if best - loss_value < tol:
            stale += 1
            if stale >= patience:
                break
        else:
            stale = 0
        best = min(best, loss_value)
    return {k: v.detach().numpy().copy() for k, v in params.items()}


@register
class NARX(SpeedEstimator):
    """The NARX predictor of each silo (:class:`NARXNetwork`),
    the EMA (:class:`EMA`, ``alpha``) before its warm-up and wherever the network's
    output is unusable.

    Parameters
    ----------
    alpha : float (default: 0.2)
        The fallback EMA's weight.
    warmup : int (default: 500)
        Observations before the network is first trained and used (the paper's 500); the
        EMA predicts until then.
    hidden : int (default: 2)
        Hidden units; with 6 inputs, 2 give 17 parameters (the paper: "less than 20").
    train_every : int (default: 10)
        Retrain after this many new observations.
    history : int (default: 1000)
        Most recent observations kept for training.
    max_epochs, lr, tol, patience : int, float, float, int (default: 300, 0.01, 1e-4, 4)
        Full-batch Adam epochs at most, its learning rate, and early stopping: the loss
        must improve by ``tol`` within ``patience`` epochs in a row.
    background : bool (default: True)
        Train in a background thread; ``False``: inside the update (deterministic).
    seed : int (default: 0)
        Seed of the initial weights.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.2.2 (Eq. 4, Fig. 3); Chen et al., SoCC
    2020, Sec. 4.2 (online training after a warm-up, EMA before).
    """

    name = "narx"
    uses_machine = True
    alpha: float = Alpha
    warmup: int = Field(default=500, ge=3)
    hidden: int = Field(default=2, ge=1)
    train_every: int = Field(default=10, ge=1)
    history: int = Field(default=1000, ge=3)
    max_epochs: int = Field(default=300, ge=1)
    lr: float = Field(default=0.01, gt=0, allow_inf_nan=False)
    tol: float = Field(default=1e-4, gt=0, allow_inf_nan=False)
    patience: int = Field(default=4, ge=1)
    background: bool = True
    seed: int = 0

    def _network(self) -> NARXNetwork:
        return NARXNetwork(settings=self)

    def fresh(self, rows: int) -> dict[str, np.ndarray]:
        """The EMA and one network per silo."""
        networks = np.empty(rows, dtype=object)
        for i in range(rows):
            networks[i] = self._network()
        return {"value": np.full(rows, np.nan), "network": networks}

    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        """Feed the EMA, and each silo's network its speed and machine use."""
        EMA(alpha=self.alpha).update(state, rows, speeds, use)
        cpu = np.full(len(rows), np.nan) if use is None else use.cpu
        memory = np.full(len(rows), np.nan) if use is None else use.memory
        values = zip(rows.tolist(), speeds.tolist(), cpu.tolist(), memory.tolist(), strict=True)
        for i, speed, c, m in values:
            state["network"][i].update(speed, cpu=_none(c), memory=_none(m))

    def predict(self, state: State, rows: np.ndarray) -> np.ndarray:
        """Each network's prediction, the EMA where it has none or an unusable one."""
        fallback = state["value"][rows]
        networks = state["network"][rows].tolist()
        return np.array([n.predict(f) for n, f in zip(networks, fallback.tolist(), strict=True)])

    def silo_state(self, state: State, row: int) -> dict[str, Any]:
        """The EMA and the network's series and weights."""
        return {**super().silo_state(state, row), **state["network"][row].state()}

    def load(self, state: State, row: int, saved: Mapping[str, Any]) -> None:
        """The EMA and the network."""
        super().load(state, row, saved)
        state["network"][row] = self._network()
        state["network"][row].load(saved)

    def warming_up(self, state: State, row: int) -> tuple[int, int] | None:
        """``(observations, warm-up)`` before the network's first training."""
        seen = state["network"][row].observations
        return (seen, self.warmup) if seen < self.warmup else None
