"""The noise budget's bisection on Python floats against the same bisection over arrays."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lbbsp.core.allocation import waterfill
from fl_lbbsp.core.allocation.budget import BudgetProblem, budgeted_minmax_continuous
from fl_lbbsp.core.allocation.waterfill import SCALAR_SILOS, least_round_time


def _problem(seed: int) -> dict[str, np.ndarray | float]:
    """A bisection's inputs: a few silos, hinge costs spread wide, bounds (some caps
    infinite, some lower bounds 0), a budget between the least noise and the equal
    split's."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, SCALAR_SILOS + 1))
    a = rng.uniform(0.001, 0.1, n) * rng.uniform(1, 16, n)
    b = rng.uniform(0, 0.5, n) * (rng.random() < 0.6)
    c = rng.uniform(0.1, 4.0, n) ** 2
    total = float(rng.integers(n, 64 * n + 1))
    lo = np.floor(rng.uniform(0, 1, n) * total / n / 2) * (rng.random(n) < 0.7)
    hi = np.ceil(np.maximum(rng.uniform(1, 4, n) * total / n, lo + 1))
    hi[rng.random(n) < 0.3] = np.inf
    hi[0] = max(hi[0], total)  # the total within the bounds
    budget = float(np.sum(c) * n / total * rng.uniform(0.6, 2.0))
    low = float(np.max(a * lo + b))
    return {"a": a, "b": b, "c": c, "total": total, "lo": lo, "hi": hi, "budget": budget,
            "low": low, "high": low + float(rng.uniform(0.01, 10.0))}  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_the_bisection_on_floats_finds_the_round_time_the_arrays_find(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare
    p = _problem(seed)
    inputs = {
        "q": np.sqrt(p["c"]), "lo": p["lo"], "hi": p["hi"], "a": p["a"], "b": p["b"],
        "c": p["c"], "total": p["total"], "budget": p["budget"],
    }  # fmt: skip
    interval = (float(p["low"]), float(p["high"]))

    # Execute
    on_floats = least_round_time(interval, **inputs)  # type: ignore[arg-type]
    monkeypatch.setattr(waterfill, "SCALAR_SILOS", 0)
    on_arrays = least_round_time(interval, **inputs)  # type: ignore[arg-type]

    # Assert
    assert on_floats == on_arrays


@pytest.mark.parametrize("seed", range(20))
def test_a_binding_budget_gives_the_same_shares_either_way(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: speeds spread 16x, no lower bound: the budget binds
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, SCALAR_SILOS + 1))
    problem = BudgetProblem(
        a=0.01 * rng.permutation(16.0 ** np.linspace(0, 1, n)), b=rng.uniform(0, 0.2, n),
        total=32.0 * n, weights=rng.uniform(1, 2, n), rho=float(rng.uniform(1.0, 1.2)),
    )  # fmt: skip

    # Execute
    on_floats = budgeted_minmax_continuous(problem)
    monkeypatch.setattr(waterfill, "SCALAR_SILOS", 0)
    on_arrays = budgeted_minmax_continuous(problem)

    # Assert
    assert on_floats[3]  # the budget binds: the bisection ran
    assert np.array_equal(on_floats[0], on_arrays[0])
    assert on_floats[1:] == on_arrays[1:]


@pytest.mark.parametrize("count", range(1, SCALAR_SILOS + 1))
def test_numpy_adds_as_few_numbers_as_the_float_path_does_left_to_right(count: int) -> None:
    # Prepare: a large value first and ones after it, whose sum depends on the order of
    # the additions (each 1 alone is lost against 1e16, 2 are not)
    values = np.array([1e16] + [1.0] * (count - 1))
    shares = np.tile(values, (3, 1))

    # Execute
    left_to_right = float(values[0])
    for v in values[1:].tolist():
        left_to_right += v

    # Assert: numpy's sum of a vector, and of each row of a table, is that one
    assert float(values.sum()) == left_to_right == waterfill._sum(values.tolist())
    assert shares.sum(axis=1).tolist() == [left_to_right] * 3
