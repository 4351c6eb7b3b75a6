"""Core support for encrypted rounds: a silo's fixed per-round time (``he-time``) in the
linear allocator, and ciphertext-safe weighted sums (weight 1 adds without multiplying)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_lbbsp.core import BatchSizeBalancer, InvalidReportError, SiloReport, weighted_sum
from fl_lbbsp.core.settings import BalancingKnobs

IDS = ["a", "b"]


def _balancer(allocator: str = "linear") -> BatchSizeBalancer:
    return BatchSizeBalancer(initial_batch_size=50, knobs=BalancingKnobs(allocator=allocator))  # type: ignore[arg-type]


def test_linear_allocator_counts_reported_fixed_time_as_intercept() -> None:
    # Prepare: equal speeds (1 s per 100 samples); silo b also spends 0.5 s on encryption
    balancer = _balancer()
    balancer.report("a", SiloReport(batch_size=50, train_time=0.5, fixed_time=0.0))
    balancer.report("b", SiloReport(batch_size=50, train_time=0.5, fixed_time=0.5))

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert: 0.01 * x_a = 0.01 * x_b + 0.5 with x_a + x_b = 100 -> 75 / 25
    assert sizes == {"a": 75, "b": 25}
    assert balancer.predicted_speed("b") == pytest.approx(100.0)  # speed from train time only


def test_without_fixed_time_equal_speeds_split_evenly() -> None:
    # Prepare
    balancer = _balancer()
    for silo in IDS:
        balancer.report(silo, SiloReport(batch_size=50, train_time=0.5))

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert
    assert sizes == {"a": 50, "b": 50}
    assert balancer.fixed_time("a") is None


def test_proportional_allocator_ignores_fixed_time() -> None:
    # Prepare: Alg. 1 uses speeds only
    balancer = _balancer("proportional")
    balancer.report("a", SiloReport(batch_size=50, train_time=0.5, fixed_time=0.0))
    balancer.report("b", SiloReport(batch_size=50, train_time=0.5, fixed_time=0.5))

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert
    assert sizes == {"a": 50, "b": 50}


def test_fixed_time_is_smoothed_like_the_speed_and_survives_serialisation() -> None:
    # Prepare
    balancer = _balancer()
    balancer.report("a", SiloReport(batch_size=50, train_time=0.5, fixed_time=1.0))
    balancer.report("a", SiloReport(batch_size=50, train_time=0.5, fixed_time=2.0))

    # Execute
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Assert: EMA with alpha = 0.2
    assert balancer.fixed_time("a") == pytest.approx(0.2 * 2.0 + 0.8 * 1.0)
    assert restored.fixed_time("a") == pytest.approx(balancer.fixed_time("a"))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1, "0.2"])
def test_unusable_fixed_time_is_rejected_and_leaves_state_unchanged(bad: object) -> None:
    # Prepare
    balancer = _balancer()
    report = SiloReport(batch_size=50, train_time=0.5, fixed_time=bad)  # type: ignore[arg-type]

    # Execute / Assert
    with pytest.raises(InvalidReportError, match="fixed time"):
        balancer.report("a", report)
    assert balancer.predicted_speed("a") is None


class _AddOnly:
    """A value that can be added but refuses multiplication, like a CKKS ciphertext
    with no level left."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __add__(self, other: _AddOnly) -> _AddOnly:
        return _AddOnly(self.value + other.value)

    def __mul__(self, other: float) -> _AddOnly:
        raise AssertionError("multiplied under encryption")


def test_weighted_sum_at_weight_one_only_adds() -> None:
    # Prepare
    values = [_AddOnly(1.0), _AddOnly(2.0), _AddOnly(4.0)]

    # Execute
    total = weighted_sum(values, [1.0, 1.0, 1.0])

    # Assert
    assert total.value == 7.0
    with pytest.raises(AssertionError, match="multiplied"):
        weighted_sum(values, [1.0, 0.5, 1.0])


def test_weighted_sum_still_weights_arrays() -> None:
    # Execute
    total = weighted_sum([np.ones(2), np.full(2, 3.0)], [1.0, 0.5])

    # Assert
    np.testing.assert_allclose(total, [2.5, 2.5])
