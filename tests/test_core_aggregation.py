"""Tests for fl_lbbsp.core.aggregation: weighted sums of model updates."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_lbbsp.core import (
    Aggregator,
    GradientStep,
    WeightedMean,
    normalised_weights,
    weighted_average,
    weighted_sum,
)
from fl_lbbsp.core.optim import SGD

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


# ------------------------------------------------------------ streaming aggregators
REAL_DTYPES = (np.float16, np.float32, np.float64)


def _elements(dtype: type[np.floating]) -> st.SearchStrategy[float]:
    width = np.finfo(dtype).bits
    return st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=width)


def _mean_of(updates: list[list[np.ndarray]], weights: list[float]) -> list[np.ndarray]:
    mean = WeightedMean()
    mean.begin(updates[0])
    for update, w in zip(updates, weights, strict=True):
        mean.add(update, weight=w)
    return mean.result()


def test_weighted_mean_and_gradient_step_are_aggregators() -> None:
    # Prepare / Execute / Assert
    assert isinstance(WeightedMean(), Aggregator)
    assert isinstance(GradientStep(lr=0.1), Aggregator)


@settings(max_examples=80, deadline=None)
@given(
    shapes=layer_shapes,
    num_silos=st.integers(1, 6),
    dtype=st.sampled_from(REAL_DTYPES),
    data=st.data(),
)
def test_weighted_mean_matches_numpy_average(
    shapes: list[tuple[int, ...]], num_silos: int, dtype: type[np.floating], data: st.DataObject
) -> None:
    # Prepare
    updates = [
        [data.draw(hnp.arrays(dtype, shape, elements=_elements(dtype))) for shape in shapes]
        for _ in range(num_silos)
    ]
    weights = data.draw(st.lists(weight, min_size=num_silos, max_size=num_silos))

    # Execute
    averaged = _mean_of(updates, weights)

    # Assert: the float64 mean rounded once to the layer's dtype
    assert len(averaged) == len(shapes)
    for k, layer in enumerate(averaged):
        stacked = np.stack([np.asarray(u[k], dtype=np.float64) for u in updates])
        expected = np.average(stacked, axis=0, weights=weights)
        assert layer.shape == shapes[k]
        assert layer.dtype == dtype
        np.testing.assert_allclose(
            layer,
            expected,
            rtol=float(np.finfo(dtype).eps),
            # the mean rounded to the dtype: within half an ulp, an absolute
            # smallest_subnormal / 2 among the subnormals
            atol=max(
                1e-9 * (1 + np.abs(stacked).max(initial=0)),
                float(np.finfo(dtype).smallest_subnormal),
            ),
        )


@settings(max_examples=40, deadline=None)
@given(num_silos=st.integers(2, 6), data=st.data())
def test_weighted_mean_does_not_depend_on_the_order_of_the_replies(
    num_silos: int, data: st.DataObject
) -> None:
    # Prepare
    updates = [
        [data.draw(hnp.arrays(np.float64, (3, 2), elements=element))] for _ in range(num_silos)
    ]
    weights = data.draw(st.lists(weight, min_size=num_silos, max_size=num_silos))
    order = data.draw(st.permutations(range(num_silos)))

    # Execute
    forward = _mean_of(updates, weights)
    shuffled = _mean_of([updates[i] for i in order], [weights[i] for i in order])

    # Assert
    np.testing.assert_allclose(shuffled[0], forward[0], rtol=1e-12, atol=1e-12)


def test_weighted_mean_of_a_thousand_float32_updates_is_exact_to_float32_rounding() -> None:
    # Prepare: where a float32 running sum drifts by up to n * eps
    rng = np.random.default_rng(0)
    updates = [[rng.standard_normal(500).astype(np.float32)] for _ in range(1000)]
    weights = rng.integers(50, 5000, 1000).astype(float).tolist()

    # Execute
    [mean] = _mean_of(updates, weights)

    # Assert: within one float32 ulp of the exact mean
    exact = np.average(
        np.stack([u[0] for u in updates]).astype(np.float64), axis=0, weights=weights
    )
    assert np.abs(mean - exact).max() <= np.spacing(np.abs(exact).astype(np.float32)).max()


def test_weighted_mean_begin_resets_and_results_are_not_aliased() -> None:
    # Prepare
    mean = WeightedMean()
    mean.begin([np.zeros(2, dtype=np.float32)])
    mean.add([np.array([5.0, 5.0], dtype=np.float32)], weight=1.0)
    first = mean.result()

    # Execute: a new round on the same layout, then one on another layout
    mean.begin([np.zeros(2, dtype=np.float32)])
    mean.add([np.array([1.0, 3.0], dtype=np.float32)], weight=2.0)
    second = mean.result()
    mean.add([np.array([3.0, 5.0], dtype=np.float32)], weight=2.0)
    third = mean.result()
    mean.begin([np.zeros((1, 3), dtype=np.float64)])
    count_after_begin = mean.count
    mean.add([np.ones((1, 3))], weight=7.0)
    fourth = mean.result()

    # Assert
    np.testing.assert_array_equal(first[0], [5.0, 5.0])
    np.testing.assert_array_equal(second[0], [1.0, 3.0])
    np.testing.assert_array_equal(third[0], [2.0, 4.0])
    assert count_after_begin == 0 and mean.count == 1
    assert fourth[0].shape == (1, 3) and fourth[0].dtype == np.float64
    np.testing.assert_array_equal(fourth[0], [[1.0, 1.0, 1.0]])


def test_weighted_mean_takes_weights_relative_to_the_first() -> None:
    # Prepare: weights whose sum overflows, and subnormal ones
    updates = [[np.array([1.0])], [np.array([3.0])]]

    # Execute
    huge = _mean_of(updates, [1e308, 1e308])
    tiny = _mean_of(updates, [math.ulp(0.0), 3 * math.ulp(0.0)])

    # Assert
    np.testing.assert_allclose(huge[0], [2.0])
    np.testing.assert_allclose(tiny[0], [2.5])


@pytest.mark.parametrize(
    ("first", "update", "w", "match"),
    [
        (1.0, [np.ones(2)], 0.0, "finite and positive"),
        (1.0, [np.ones(2)], -1.0, "finite and positive"),
        (1.0, [np.ones(2)], math.nan, "finite and positive"),
        (1.0, [np.ones(2)], math.inf, "finite and positive"),
        (1.0, [np.ones(3)], 1.0, "shape"),
        (1.0, [np.ones((2, 1))], 1.0, "shape"),
        (1.0, [np.ones(2), np.ones(2)], 1.0, "layers"),
        (1.0, [np.ones(2, dtype=np.complex128)], 1.0, "dtype"),
        (1e10, [np.ones(2)], 1e-320, "sum of the aggregation weights"),
        (1e-10, [np.ones(2)], 1e300, "sum of the aggregation weights"),
    ],
    ids=[
        "zero-weight", "negative-weight", "nan-weight", "inf-weight", "shape", "reshaped",
        "layer-count", "complex", "weight-ratio-underflows", "weight-ratio-overflows",
    ],
)  # fmt: skip
def test_weighted_mean_rejects_a_bad_reply_and_keeps_its_sum(
    first: float, update: list[np.ndarray], w: float, match: str
) -> None:
    # Prepare: one good reply in
    mean = WeightedMean()
    mean.begin([np.zeros(2)])
    mean.add([np.array([1.0, 2.0])], weight=first)

    # Execute / Assert: the bad one is refused and leaves no trace
    with pytest.raises(ValueError, match=match):
        mean.add(update, weight=w)
    assert mean.count == 1
    np.testing.assert_array_equal(mean.result()[0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("reference", "updates", "match"),
    [
        ([np.zeros(2)], [], "zero updates"),
        ([np.zeros(2)], [[np.array([1.0, math.nan])]], "NaN or inf"),
        ([np.zeros(2)], [[np.array([1.0, math.inf])]], "NaN or inf"),
        ([np.zeros(2)], [[np.array([1e308, 1.0])], [np.array([1e308, 1.0])]], "NaN or inf"),
        ([np.zeros(2, dtype=np.float32)], [[np.array([1e39, 1.0])]], "NaN or inf as float32"),
    ],
    ids=["empty", "nan", "inf", "sum-overflows", "overflows-its-dtype"],
)
def test_weighted_mean_result_refuses_empty_and_non_finite_rounds(
    reference: list[np.ndarray], updates: list[list[np.ndarray]], match: str
) -> None:
    # Prepare
    mean = WeightedMean()
    mean.begin(reference)
    for update in updates:
        mean.add(update, weight=1.0)

    # Execute / Assert
    with pytest.raises(ValueError, match=match), np.errstate(over="ignore", invalid="ignore"):
        mean.result()


def test_weighted_mean_needs_begin() -> None:
    # Execute / Assert
    with pytest.raises(RuntimeError, match="begin"):
        WeightedMean().add([np.ones(1)], weight=1.0)
    with pytest.raises(ValueError, match="zero updates"):
        WeightedMean().result()


# --------------------------------------------------------------------- GradientStep
def test_gradient_step_by_hand() -> None:
    # Prepare: gradients weighted by batch sizes 1 and 3, eta 0.1
    step = GradientStep(lr=0.1)
    params = [np.array([1.0, 2.0], dtype=np.float32), np.array(0.5, dtype=np.float32)]

    # Execute
    step.begin(params)
    step.add([np.array([1.0, 0.0], dtype=np.float32), np.array(2.0, dtype=np.float32)], weight=1)
    step.add([np.array([0.0, 4.0], dtype=np.float32), np.array(6.0, dtype=np.float32)], weight=3)
    new = step.result()

    # Assert: g = ([0.25, 3.0], 5.0); w - 0.1 g; inputs untouched
    assert step.count == 2
    np.testing.assert_allclose(new[0], [0.975, 1.7], rtol=1e-6)
    np.testing.assert_allclose(new[1], 0.0, atol=1e-7)
    assert all(a.dtype == np.float32 for a in new)
    np.testing.assert_array_equal(params[0], [1.0, 2.0])


def test_gradient_step_with_momentum_by_hand() -> None:
    # Prepare: mu 0.5, eta 1
    step = GradientStep(optimizer=SGD(lr=1.0, momentum=0.5))
    weights = [np.array([10.0])]

    # Execute: two iterations, the gradient [2] then [4]
    for g in (2.0, 4.0):
        step.begin(weights)
        step.add([np.array([g])], weight=5)
        weights = step.result()

    # Assert: buf 2, w 8; buf 0.5 * 2 + 4 = 5, w 3
    np.testing.assert_array_equal(weights[0], [3.0])
    np.testing.assert_array_equal(step.optimizer.buffers[0], [5.0])  # type: ignore[index]


def test_gradient_step_is_taken_once_per_iteration() -> None:
    # Prepare
    step = GradientStep(optimizer=SGD(lr=1.0, momentum=0.5))
    step.begin([np.array([1.0])])
    step.add([np.array([1.0])], weight=1)

    # Execute
    first = step.result()
    second = step.result()

    # Assert: the same weights, the momentum stepped once, no more gradients this iteration
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(step.optimizer.buffers[0], [1.0])  # type: ignore[index]
    with pytest.raises(RuntimeError, match="begin"):
        step.add([np.array([1.0])], weight=1)


def test_gradient_step_that_overflows_leaves_the_momentum() -> None:
    # Prepare: a step that takes float32 weights beyond the float32 range
    step = GradientStep(optimizer=SGD(lr=10.0, momentum=0.9))
    weights = [np.ones(2, dtype=np.float32)]
    step.begin(weights)
    step.add([np.full(2, 3e38, dtype=np.float32)], weight=4)

    # Execute
    with pytest.raises(ValueError, match="NaN or inf"):
        step.result()
    step.begin(weights)
    step.add([np.full(2, 0.01, dtype=np.float32)], weight=4)
    after = step.result()

    # Assert: the second iteration is a first momentum step, 1 - 10 * 0.01
    np.testing.assert_allclose(after[0], [0.9, 0.9], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"lr": 0.1, "optimizer": SGD(lr=0.1)}, {"lr": 0.0}, {"lr": math.nan}],
    ids=["neither", "both", "zero-lr", "nan-lr"],
)
def test_gradient_step_needs_one_good_learning_rate(kwargs: dict[str, object]) -> None:
    # Execute / Assert
    with pytest.raises(ValueError):
        GradientStep(**kwargs)  # type: ignore[arg-type]


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize(
    ("aggregation", "momentum"), [("weighted", 0.0), ("weighted", 0.9), ("naive", 0.5)]
)
def test_gradient_step_equals_the_cluster_strategy(aggregation: str, momentum: float) -> None:
    # Prepare: three rounds of three workers with unequal batch sizes
    from conftest import FakeGrid, make_reply
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    from fl_lbbsp.strategies import LBBSPCluster

    nodes = (11, 12, 13)
    rng = np.random.default_rng(3)
    shapes = {"conv": (2, 3), "bias": (3,), "fc": (4, 2)}
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    strategy = LBBSPCluster(
        initial_batch_size=16, lr=0.05, momentum=momentum, aggregation=aggregation,  # type: ignore[arg-type]
        min_train_nodes=3, min_available_nodes=3,
    )  # fmt: skip
    step = GradientStep(optimizer=SGD(lr=0.05, momentum=momentum))
    ours = [weights[k] for k in shapes]

    for server_round, sizes in enumerate([(8, 16, 24), (30, 10, 8), (1, 2, 45)], start=1):
        grads = [
            {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in nodes
        ]
        replies = [
            make_reply(
                RecordDict(
                    {
                        "arrays": ArrayRecord({k: Array(v) for k, v in g.items()}),
                        "metrics": MetricRecord(
                            {
                                "batch-size": n,
                                "num-examples": n,
                                "train-time": 1.0,
                                "samples-processed": n,
                                "cpu-percent": 50.0,
                                "memory-percent": 10.0,
                                "max-batch-size": 0,
                            }  # fmt: skip
                        ),
                        "silo": ConfigRecord({"silo-id": f"w{node}"}),
                    }
                ),
                node_id=node,
            )
            for node, n, g in zip(nodes, sizes, grads, strict=True)
        ]

        # Execute: the strategy's iteration, and ours on the same gradients
        record = ArrayRecord({k: Array(v) for k, v in weights.items()})
        strategy.configure_train(server_round, record, ConfigRecord(), FakeGrid(list(nodes)))
        state = strategy.round  # as if the balancer had sent these sizes
        assert state is not None
        state.instructions = {
            node: replace(state.instructions[node], batch_size=n, share=n)
            for node, n in zip(nodes, sizes, strict=True)
        }
        aggregated, _ = strategy.aggregate_train(server_round, replies)
        step.begin(ours)
        for n, g in zip(sizes, grads, strict=True):
            step.add([g[k] for k in shapes], weight=1.0 if aggregation == "naive" else n)
        ours = step.result()

        # Assert: bit for bit, every round
        assert aggregated is not None
        weights = {k: aggregated[k].numpy() for k in shapes}
        for k, mine in zip(shapes, ours, strict=True):
            np.testing.assert_array_equal(mine, weights[k])
            assert mine.dtype == np.float32
