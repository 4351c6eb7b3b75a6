"""Tests for fl_lbbsp.core.silo.estimators: last value, EMA, change-aware EMA (one silo: a
table of one row), state round trip, the registry and a toy estimator added to it."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core import (
    EMA,
    ESTIMATORS,
    BatchSizeBalancer,
    ChangeAwareEMA,
    Last,
    Predictor,
    SiloReport,
    SpeedEstimator,
    parse_estimator,
)
from fl_lbbsp.core.settings import BalancingKnobs
from fl_lbbsp.core.silo.estimators import MachineUse, State, estimator_from_state, registered

speeds = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_ema_follows_recursion_initialised_by_first_value() -> None:
    # Prepare
    estimator = Predictor(EMA(alpha=0.2))
    observed = [10.0, 20.0, 5.0, 5.0, 40.0]

    # Execute
    predictions = []
    for speed in observed:
        estimator.update(speed)
        predictions.append(estimator.predict())

    # Assert
    expected = observed[0]
    assert predictions[0] == pytest.approx(expected)
    for speed, got in zip(observed[1:], predictions[1:], strict=True):
        expected = 0.2 * speed + 0.8 * expected
        assert got == pytest.approx(expected, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    observed=st.lists(speeds, min_size=1, max_size=12),
    alpha=st.floats(min_value=0.01, max_value=1.0),
)
def test_ema_matches_reference_recursion(observed: list[float], alpha: float) -> None:
    # Prepare
    estimator = Predictor(EMA(alpha=alpha))

    # Execute
    for speed in observed:
        estimator.update(speed)

    # Assert
    expected = observed[0]
    for speed in observed[1:]:
        expected = alpha * speed + (1.0 - alpha) * expected
    value = estimator.predict()
    assert value == pytest.approx(expected, rel=1e-9)
    assert value is not None and min(observed) * (1 - 1e-9) <= value <= max(observed) * (1 + 1e-9)


def test_ema_with_alpha_one_is_last_value() -> None:
    # Prepare
    ema = Predictor(EMA(alpha=1.0))
    last = Predictor(Last())

    # Execute
    for speed in [3.0, 7.0, 1.5]:
        ema.update(speed)
        last.update(speed)

    # Assert
    assert ema.predict() == last.predict() == 1.5


def test_predict_is_none_before_any_observation() -> None:
    # Prepare / Execute
    estimators = [EMA(), Last(), ChangeAwareEMA(), parse_estimator("ema"), parse_estimator("last")]

    # Assert
    assert all(Predictor(e).predict() is None for e in estimators)
    assert all(isinstance(e, SpeedEstimator) for e in estimators)


def test_last_value_returns_latest_observation() -> None:
    # Prepare
    estimator = Predictor(Last())

    # Execute / Assert
    for speed in [4.0, 100.0, 0.5]:
        estimator.update(speed)
        assert estimator.predict() == speed


@pytest.mark.parametrize(
    "alpha",
    [0, 0.0, -0.1, 1.5, float("nan"), float("inf"), True, False, "0.5", None],
    ids=["int0", "zero", "negative", "above-one", "nan", "inf", "true", "false", "str", "none"],
)
def test_ema_rejects_alpha_outside_unit_interval(alpha: object) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="alpha") as info:
        EMA(alpha=alpha)  # type: ignore[arg-type]
    assert repr(alpha) in str(info.value)


@pytest.mark.parametrize("alpha", [0, -0.1, 1.5, float("nan"), True])
def test_parse_estimator_rejects_bad_alpha_on_one_line(alpha: object) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="alpha") as info:
        parse_estimator("ema", alpha=alpha)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_parse_estimator_rejects_unknown_name_and_option() -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="'narx-typo'"):
        parse_estimator("narx-typo")
    with pytest.raises(ValueError, match="warmup"):
        parse_estimator("ema", options={"warmup": 4})


@pytest.mark.parametrize(
    "factory",
    [EMA, Last, ChangeAwareEMA],
    ids=["ema", "last", "change-ema"],
)
@pytest.mark.parametrize(
    "speed",
    [0.0, -1.0, -1e-9, float("nan"), float("inf"), float("-inf")],
    ids=["zero", "negative", "tiny-negative", "nan", "inf", "-inf"],
)
def test_update_rejects_non_finite_or_non_positive_speed(factory: type, speed: float) -> None:
    # Prepare
    estimator = Predictor(factory())
    estimator.update(2.0)

    # Execute
    with pytest.raises(ValueError, match="speed"):
        estimator.update(speed)

    # Assert: the rejected observation left the prediction untouched
    assert estimator.predict() == 2.0


@pytest.mark.parametrize("name", ["ema", "last", "change-ema"])
@pytest.mark.parametrize("value", [0.0, -3.0, float("nan"), float("inf")])
def test_a_bad_resume_value_is_refused(name: str, value: float) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="speed"):
        Predictor.from_state({"name": name, "value": value})


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["ema", "last", "change-ema"]),
    alpha=st.floats(min_value=0.01, max_value=1.0),
    observed=st.lists(speeds, max_size=8),
    following=st.lists(speeds, min_size=1, max_size=4),
)
def test_state_round_trip_predicts_the_same(
    name: str, alpha: float, observed: list[float], following: list[float]
) -> None:
    # Prepare
    original = Predictor(parse_estimator(name, alpha=alpha))
    for speed in observed:
        original.update(speed)

    # Execute: through JSON, as the balancer checkpoints it
    restored = Predictor.from_state(json.loads(json.dumps(original.state())))

    # Assert: same prediction now, and after the same further observations
    assert restored.estimator == original.estimator
    assert restored.predict() == original.predict()
    for speed in following:
        original.update(speed)
        restored.update(speed)
        assert restored.predict() == original.predict()


def test_estimator_from_state_rejects_unknown_name() -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="'kalman'"):
        estimator_from_state({"name": "kalman", "value": 1.0})


def test_ema_prediction_is_finite_after_extreme_but_valid_speeds() -> None:
    # Prepare
    estimator = Predictor(EMA(alpha=0.2))

    # Execute
    for speed in [1e-300, 1e300, 1e-300]:
        estimator.update(speed)

    # Assert
    assert math.isfinite(estimator.predict() or math.nan)


def test_core_imports_without_flwr_or_torch() -> None:
    # Prepare
    code = (
        "import sys; import fl_lbbsp.core; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flwr', 'torch', 'tenseal')); "
        "print(','.join(bad))"
    )

    # Execute
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    # Assert
    assert result.stdout.strip() == ""


# ------------------------------------------------------------------ change-aware EMA
def _feed(estimator: Predictor, observed: list[float]) -> list[float | None]:
    predictions = []
    for speed in observed:
        estimator.update(speed)
        predictions.append(estimator.predict())
    return predictions


@settings(max_examples=50, deadline=None)
@given(observed=st.lists(speeds, min_size=1, max_size=12), alpha=st.floats(0.01, 1.0))
def test_change_ema_with_huge_threshold_is_the_ema(observed: list[float], alpha: float) -> None:
    # Prepare
    change = Predictor(ChangeAwareEMA(alpha=alpha, threshold=1e12))
    ema = Predictor(EMA(alpha=alpha))

    # Execute
    got, expected = _feed(change, observed), _feed(ema, observed)

    # Assert
    assert got == pytest.approx(expected, rel=1e-12)


def test_change_ema_restarts_at_a_confirmed_step() -> None:
    # Prepare: a level of 100, then a co-tenant halves the speed
    estimator = Predictor(ChangeAwareEMA(alpha=0.2, threshold=0.2, confirm=2))
    _feed(estimator, [100.0, 102.0, 98.0])
    before = estimator.predict()

    # Execute
    first = _feed(estimator, [50.0])[0]
    second = _feed(estimator, [52.0])[0]

    # Assert: held at the old level until confirmed, then the mean of the new level
    assert first == before
    assert second == pytest.approx(51.0)


def test_change_ema_ignores_a_single_spike() -> None:
    # Prepare
    estimator = Predictor(ChangeAwareEMA(alpha=0.5, threshold=0.2, confirm=2))
    _feed(estimator, [100.0])

    # Execute: a spike, then back to normal
    spike, after = _feed(estimator, [300.0, 100.0])

    # Assert: the spike never entered the average
    assert spike == 100.0 and after == 100.0


def test_change_ema_needs_deviations_on_the_same_side() -> None:
    # Prepare
    estimator = Predictor(ChangeAwareEMA(alpha=0.2, threshold=0.2, confirm=2))
    _feed(estimator, [100.0])

    # Execute: one deviation up, one down: no change of level is confirmed
    predictions = _feed(estimator, [200.0, 40.0])

    # Assert
    assert predictions == [100.0, 100.0]


def test_change_ema_with_confirm_one_restarts_at_once() -> None:
    # Prepare
    estimator = Predictor(ChangeAwareEMA(threshold=0.1, confirm=1))
    _feed(estimator, [100.0])

    # Execute
    predictions = _feed(estimator, [150.0, 152.0])

    # Assert: restart at 150, then the EMA from there
    assert predictions[0] == 150.0
    assert predictions[1] == pytest.approx(0.2 * 152.0 + 0.8 * 150.0)


@settings(max_examples=60, deadline=None)
@given(
    observed=st.lists(speeds, min_size=1, max_size=20),
    threshold=st.floats(0.01, 2.0),
    confirm=st.integers(1, 4),
)
def test_change_ema_prediction_stays_within_observed_range(
    observed: list[float], threshold: float, confirm: int
) -> None:
    # Prepare
    estimator = Predictor(ChangeAwareEMA(threshold=threshold, confirm=confirm))

    # Execute
    predictions = _feed(estimator, observed)

    # Assert: a convex combination of observations, never outside their range
    for k, got in enumerate(predictions):
        seen = observed[: k + 1]
        assert got is not None
        assert min(seen) * (1 - 1e-12) <= got <= max(seen) * (1 + 1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": float("inf")}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"confirm": 0}, "confirm"),
        ({"confirm": 1.5}, "confirm"),
        ({"alpha": 0}, "alpha"),
        ({"value": 1.0, "pending": [1.0, 2.0], "confirm": 2}, "pending"),
        ({"value": 1.0, "pending": [-1.0]}, "speed"),
    ],
    ids=[
        "threshold-zero",
        "threshold-negative",
        "threshold-inf",
        "threshold-bool",
        "confirm-zero",
        "confirm-float",
        "alpha-zero",
        "too-many-pending",
        "bad-pending",
    ],
)
def test_change_ema_rejects_bad_settings(kwargs: dict[str, object], message: str) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match=message):
        Predictor.from_state({"name": "change-ema", **kwargs})


def test_parse_estimator_builds_change_ema_with_options() -> None:
    # Execute
    estimator = parse_estimator("change-ema", alpha=0.3, options={"threshold": 0.5, "confirm": 3})

    # Assert
    assert isinstance(estimator, ChangeAwareEMA)
    assert (estimator.alpha, estimator.threshold, estimator.confirm) == (0.3, 0.5, 3)


def test_state_round_trip_keeps_pending_deviations() -> None:
    # Prepare: one deviation pending
    original = Predictor(ChangeAwareEMA(confirm=2))
    _feed(original, [100.0, 40.0])

    # Execute
    restored = Predictor.from_state(json.loads(json.dumps(original.state())))

    # Assert: the next low observation confirms the change in both
    assert _feed(restored, [42.0]) == _feed(original, [42.0]) == [pytest.approx(41.0)]


# ------------------------------------------------------------------ the registry
class Halved(SpeedEstimator):
    """A toy estimator: half the last speed (one class, one registry entry)."""

    name = "toy-halved"

    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        state["value"][rows] = speeds / 2


def test_a_toy_estimator_added_to_the_registry_drives_a_balancer_end_to_end() -> None:
    # Prepare: three silos of speeds 400, 200, 100
    ids = ["a", "b", "c"]
    times = {"a": 0.08, "b": 0.16, "c": 0.32}
    with registered(Halved):
        knobs = BalancingKnobs(
            estimator=Halved(), allocator="proportional", max_change_ratio=None, noise_budget=None
        )
        balancer = BatchSizeBalancer(initial_batch_size=32, knobs=knobs)

        # Execute: two rounds, a checkpoint round trip, and its name at the boundary
        for _ in range(2):
            balancer.report_round({s: SiloReport(batch_size=32, train_time=times[s]) for s in ids})
        sizes = balancer.allocate(ids)
        restored = BatchSizeBalancer.from_json(balancer.to_json())
        named = BatchSizeBalancer(
            initial_batch_size=32, knobs=BalancingKnobs(estimator="toy-halved")
        )
        assert "toy-halved" in ESTIMATORS

    # Assert: its predictions, the split they give, kept across the round trip; the
    # registry holds it no longer after the block
    assert balancer.predicted_speed("a") == pytest.approx(200.0)
    assert sizes == {"a": 55, "b": 27, "c": 14}
    assert restored.allocate(ids) == sizes and restored.speed_estimator == Halved()
    assert isinstance(named.speed_estimator, Halved)
    assert "toy-halved" not in ESTIMATORS
    with pytest.raises(ValueError, match="toy-halved"):
        parse_estimator("toy-halved")
    with pytest.raises(ValueError, match="toy-halved"):
        BalancingKnobs(estimator="toy-halved")


def test_estimator_options_go_with_a_name_only() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="estimator_options"):
        BalancingKnobs(estimator=EMA(), estimator_options={"x": 1})


@pytest.mark.parametrize(
    ("estimator", "alpha", "options"),
    [
        (EMA(alpha=0.3), 0.2, {"alpha": 0.3}),
        (EMA(), 0.5, {"alpha": 0.2}),
        (EMA(alpha=0.5), 0.5, {}),
        (ChangeAwareEMA(confirm=3), 0.2, {"threshold": 0.2, "confirm": 3}),
        (Last(), 0.2, {}),
    ],
)
def test_an_estimator_object_is_held_as_its_name_and_settings(
    estimator: SpeedEstimator, alpha: float, options: dict[str, object]
) -> None:
    # Execute: the knobs of an estimator object, through a JSON round trip
    knobs = BalancingKnobs(estimator=estimator, alpha=alpha)
    restored = BalancingKnobs.model_validate_json(knobs.model_dump_json())

    # Assert: its name and settings (alpha left out where it is the knob's), and the
    # very estimator again, also after the round trip
    assert (knobs.tuning.estimator, knobs.tuning.estimator_options) == (estimator.name, options)
    assert knobs.tuning.speed_estimator() == estimator == restored.tuning.speed_estimator()
