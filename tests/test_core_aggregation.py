"""Tests for fl_lbbsp.core.aggregation: weighted sums of model updates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_lbbsp.core import normalised_weights, weighted_average, weighted_sum

layer_shapes = st.lists(
    hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), min_size=1, max_size=4
)
weight = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
element = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(shapes=layer_shapes, num_silos=st.integers(1, 5), data=st.data())
def test_weighted_average_matches_numpy_average(
    shapes: list[tuple[int, ...]], num_silos: int, data: st.DataObject
) -> None:
    # Prepare
    updates = [
        [data.draw(hnp.arrays(np.float64, shape, elements=element)) for shape in shapes]
        for _ in range(num_silos)
    ]
    weights = data.draw(st.lists(weight, min_size=num_silos, max_size=num_silos))

    # Execute
    averaged = weighted_average(updates, weights)

    # Assert
    assert len(averaged) == len(shapes)
    for k, layer in enumerate(averaged):
        expected = np.average(np.stack([u[k] for u in updates]), axis=0, weights=weights)
        assert layer.shape == shapes[k]
        assert layer.dtype == np.float64
        np.testing.assert_allclose(layer, expected, rtol=1e-6, atol=1e-9)


def test_weighted_average_by_dataset_size_example() -> None:
    # Prepare: FL mode weighs by local dataset size
    updates = [[np.array([1.0, 0.0]), np.array(2.0)], [np.array([3.0, 4.0]), np.array(6.0)]]

    # Execute
    averaged = weighted_average(updates, [100, 300])

    # Assert
    np.testing.assert_allclose(averaged[0], [2.5, 3.0])
    np.testing.assert_allclose(averaged[1], 5.0)


def test_weighted_average_keeps_dtype_of_first_update() -> None:
    # Prepare
    updates = [[np.ones(3, dtype=np.float32)], [np.full(3, 3.0, dtype=np.float32)]]

    # Execute
    averaged = weighted_average(updates, [1.0, 1.0])

    # Assert
    assert averaged[0].dtype == np.float32
    np.testing.assert_allclose(averaged[0], 2.0)


def test_weighted_average_depends_only_on_weight_ratios() -> None:
    # Prepare
    updates = [[np.array([1.0, 2.0])], [np.array([5.0, -2.0])], [np.array([0.0, 0.0])]]

    # Execute
    small = weighted_average(updates, [1.0, 2.0, 3.0])
    large = weighted_average(updates, [1000.0, 2000.0, 3000.0])

    # Assert
    np.testing.assert_allclose(small[0], large[0], rtol=1e-12)


@pytest.mark.parametrize(
    "bad",
    [0.0, -1.0, math.nan, math.inf, -math.inf],
    ids=["zero", "negative", "nan", "inf", "-inf"],
)
def test_weighted_average_rejects_bad_weights(bad: float) -> None:
    # Prepare
    updates = [[np.ones(2)], [np.zeros(2)]]

    # Execute / Assert
    with pytest.raises(ValueError, match="weights"):
        weighted_average(updates, [1.0, bad])


@pytest.mark.parametrize(
    "bad", [0.0, -1.0, math.nan, math.inf], ids=["zero", "negative", "nan", "inf"]
)
def test_normalised_weights_rejects_bad_weights(bad: float) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="finite and positive"):
        normalised_weights([2.0, bad])


@pytest.mark.parametrize(
    "weights",
    [[1e308, 1e308], [math.ulp(0.0), math.ulp(0.0)], []],
    ids=["sum-overflows", "subnormal", "empty"],
)
def test_normalised_weights_never_divide_by_zero_or_infinity(weights: list[float]) -> None:
    # Execute
    try:
        factors = normalised_weights(weights)
    except ValueError as err:
        # Assert: a clear error, or factors that are finite and sum to one
        assert "weights" in str(err) or "zero updates" in str(err)
        return
    assert all(math.isfinite(f) for f in factors)
    assert math.fsum(factors) == pytest.approx(1.0)


def test_normalised_weights_reject_a_sum_beyond_the_float_range() -> None:
    with pytest.raises(ValueError, match="sum of the aggregation weights"):
        normalised_weights([1e308, 1e308])


def test_normalised_weights_sum_to_one() -> None:
    # Prepare / Execute
    factors = normalised_weights([1, 3, 4])

    # Assert
    assert factors == pytest.approx([0.125, 0.375, 0.5])
    assert math.fsum(factors) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("updates", "weights"),
    [
        ([[np.ones(2)], [np.ones(3)]], [1.0, 1.0]),
        ([[np.ones((2, 2))], [np.ones(4)]], [1.0, 1.0]),
        ([[np.ones(2), np.ones(1)], [np.ones(2)]], [1.0, 1.0]),
        ([[np.ones(2)], [np.ones(2)]], [1.0]),
        ([], []),
    ],
    ids=["shape", "reshaped", "layer-count", "weight-count", "empty"],
)
def test_weighted_average_rejects_mismatched_updates(
    updates: list[list[np.ndarray]], weights: list[float]
) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        weighted_average(updates, weights)


class _Ciphertext:
    """Stands in for a CKKS vector: only ``* float`` and ``+`` are defined."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def __mul__(self, factor: float) -> _Ciphertext:
        assert isinstance(factor, float)
        return _Ciphertext([v * factor for v in self.values])

    def __add__(self, other: _Ciphertext) -> _Ciphertext:
        return _Ciphertext([x + y for x, y in zip(self.values, other.values, strict=True)])


def test_weighted_sum_needs_only_scaling_and_addition() -> None:
    # Prepare
    values = [_Ciphertext([1.0, 2.0]), _Ciphertext([10.0, 20.0]), _Ciphertext([0.5, 0.5])]

    # Execute
    total = weighted_sum(values, [2, 0.5, 4])

    # Assert
    assert isinstance(total, _Ciphertext)
    assert total.values == pytest.approx([9.0, 16.0])


def test_weighted_sum_uses_weights_as_given() -> None:
    # Prepare / Execute
    total = weighted_sum([np.array([1.0]), np.array([1.0])], [3.0, 4.0])

    # Assert: not normalised
    np.testing.assert_allclose(total, [7.0])


@pytest.mark.parametrize(
    ("values", "weights"),
    [([], []), ([np.ones(1)], [1.0, 2.0])],
    ids=["empty", "length-mismatch"],
)
def test_weighted_sum_rejects_bad_input(values: list[np.ndarray], weights: list[float]) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        weighted_sum(values, weights)
