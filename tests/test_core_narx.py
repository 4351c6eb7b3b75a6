"""Tests for the NARX speed predictor (trained online with torch, off the critical path)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fl_lbbsp.core import EMA, NARX, BatchSizeBalancer, Last, Predictor, SiloReport
from fl_lbbsp.core.settings import BalancingKnobs

pytest.importorskip("torch")


def _contention_trace(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Speed of a worker whose co-tenant switches on and off (its CPU use shows it), plus
    transient slow iterations (GC, OS jitter) that leave the CPU use as it was."""
    rng = np.random.default_rng(seed)
    busy = np.zeros(n, dtype=bool)
    state = False
    for k in range(n):
        if rng.random() < 0.05:
            state = not state
        busy[k] = state
    cpu = np.where(busy, 95.0, 45.0) + rng.normal(0, 2, n)
    memory = np.full(n, 40.0) + rng.normal(0, 1, n)
    jitter = np.where(rng.random(n) < 0.15, 0.6, 1.0)
    speed = np.where(busy, 50.0, 100.0) * jitter * (1 + rng.normal(0, 0.02, n))
    return speed, cpu, memory


def _narx(**settings: object) -> Predictor:
    return Predictor(NARX(**settings))  # type: ignore[arg-type]


def _trained(predictor: Predictor) -> bool:
    return bool(predictor.columns["network"][0].trained)


def _rmse(estimator: Predictor, speed, cpu, memory, start: int) -> float:  # type: ignore[no-untyped-def]
    errors = []
    for k in range(len(speed)):
        if k >= start:
            errors.append(estimator.predict() - speed[k])
        estimator.update(speed[k], cpu_percent=cpu[k], memory_percent=memory[k])
    return float(np.sqrt(np.mean(np.square(errors))))


def test_before_warmup_narx_is_the_ema() -> None:
    # Prepare
    narx = _narx(warmup=50, background=False)
    ema = Predictor(EMA(alpha=0.2))
    speed, cpu, memory = _contention_trace(40)

    # Execute / Assert
    for k in range(40):
        narx.update(speed[k], cpu_percent=cpu[k], memory_percent=memory[k])
        ema.update(speed[k])
        assert narx.predict() == ema.predict()
    assert not _trained(narx)


def test_narx_beats_ema_when_cpu_explains_the_speed() -> None:
    # Prepare: the co-tenant's CPU use is visible to NARX, not to the EMA
    speed, cpu, memory = _contention_trace(400, seed=1)
    narx = _narx(warmup=150, background=False)

    # Execute
    narx_rmse = _rmse(narx, speed, cpu, memory, start=200)
    ema_rmse = _rmse(Predictor(EMA(alpha=0.2)), speed, cpu, memory, start=200)
    last_rmse = _rmse(Predictor(Last()), speed, cpu, memory, start=200)

    # Assert: robust to the jitter (unlike the last value), quick on the co-tenant
    # (unlike the EMA)
    assert _trained(narx)
    assert narx_rmse < 0.9 * min(ema_rmse, last_rmse)


def test_background_training_gives_the_same_model_as_inline_training() -> None:
    # Prepare
    speed, cpu, memory = _contention_trace(60, seed=2)
    inline = _narx(warmup=30, train_every=100, background=False)
    background = _narx(warmup=30, train_every=100, background=True)

    # Execute
    for k in range(60):
        for estimator in (inline, background):
            estimator.update(speed[k], cpu_percent=cpu[k], memory_percent=memory[k])
    background.columns["network"][0].wait(timeout=60)

    # Assert
    assert _trained(background) and _trained(inline)
    assert background.predict() == pytest.approx(inline.predict(), rel=1e-9)


def test_state_round_trips_through_json() -> None:
    # Prepare
    speed, cpu, memory = _contention_trace(80, seed=3)
    narx = _narx(warmup=40, background=False)
    for k in range(80):
        narx.update(speed[k], cpu_percent=cpu[k], memory_percent=memory[k])

    # Execute
    state = json.loads(json.dumps(narx.state()))
    rebuilt = Predictor.from_state(state)

    # Assert
    assert rebuilt.predict() == narx.predict()
    assert rebuilt.state() == narx.state()


@pytest.mark.parametrize(
    "kwargs",
    [{"warmup": 1}, {"hidden": 0}, {"train_every": True}, {"lr": 0.0}, {"tol": float("nan")}],
    ids=["warmup", "hidden", "train-every", "lr", "tol"],
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        NARX(**kwargs)  # type: ignore[arg-type]


def test_balancer_passes_cpu_and_memory_to_narx() -> None:
    # Prepare
    balancer = BatchSizeBalancer(
        initial_batch_size=32,
        knobs=BalancingKnobs(
            estimator="narx", estimator_options={"warmup": 20, "background": False}
        ),
    )
    speed, cpu, memory = _contention_trace(30, seed=4)

    # Execute
    for k in range(30):
        for silo, factor in (("a", 1.0), ("b", 2.0)):
            balancer.report(
                silo,
                SiloReport(
                    batch_size=32,
                    train_time=32 / (speed[k] * factor),
                    cpu_percent=float(cpu[k]),
                    memory_percent=float(memory[k]),
                ),
            )
    sizes = balancer.allocate(["a", "b"])
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Assert: b is twice as fast; the state (with the trained networks) survives JSON
    assert sizes["b"] > sizes["a"]
    assert sum(sizes.values()) == 64
    assert restored.allocate(["a", "b"]) == sizes
