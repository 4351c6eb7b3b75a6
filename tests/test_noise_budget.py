"""The noise budget and the cost curves that bend (fl_lbbsp.core.allocation.budget, .costfit, the
balancer's allocation, the emulated CostModel's knee). No timing: every time is injected."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fl_lbbsp.clients.emulation import CostModel
from fl_lbbsp.core import BatchSizeBalancer, SiloReport, ideal_round_time, linear_minmax
from fl_lbbsp.core.allocation.budget import (
    REASONS,
    BudgetProblem,
    budgeted_ideal_time,
    budgeted_minmax,
    budgeted_minmax_continuous,
    hinge_times,
    noise_ratio,
)
from fl_lbbsp.core.allocation.pipeline import ALLOCATION_REASONS
from fl_lbbsp.core.settings import NOISE_BUDGET, BalancingConfig, BalancingKnobs
from fl_lbbsp.core.silo.costfit import find_knee, fit_robust_cost


@st.composite
def problems(draw: st.DrawFn, max_silos: int = 7) -> dict[str, object]:
    """Capacities 1-16, fixed costs, knees, weights, B_init: one federation."""
    n = draw(st.integers(2, max_silos))
    capacity = np.array(draw(st.lists(st.floats(1.0, 16.0), min_size=n, max_size=n)))
    fixed = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    b_init = draw(st.integers(4, 64))
    a = 0.01 / capacity
    knee = np.array(draw(st.lists(st.sampled_from([0, 0, 8, 32, 96]), min_size=n, max_size=n)))
    weights = np.array(draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n)))
    return {
        "a": a,
        "b": fixed * a * b_init,
        "knee": knee.astype(float),
        "weights": weights,
        "total": n * b_init,
    }


budgets = st.sampled_from([1.0, 1.1, math.sqrt(2.0), 2.0, 4.0])


# ------------------------------------------------------------------- the invariants
@settings(max_examples=150, deadline=None)
@given(problem=problems(), rho=budgets)
def test_the_budget_is_respected(problem: dict[str, object], rho: float) -> None:
    # Execute
    result = budgeted_minmax(
        problem["a"], problem["b"], problem["total"], knee=problem["knee"],
        lower=np.ones(len(problem["a"])), weights=problem["weights"], rho=rho,
    )  # fmt: skip

    # Assert: the total, the floor, the budget (the equal split always meets it)
    assert result.sizes.sum() == problem["total"]
    assert result.sizes.min() >= 1
    assert result.feasible
    assert noise_ratio(result.sizes, weights=problem["weights"]) <= rho * (1 + 1e-9)
    assert result.noise_ratio == pytest.approx(
        noise_ratio(result.sizes, weights=problem["weights"])
    )
    assert set(result.reasons) <= set(REASONS) and len(result.reasons) == len(result.sizes)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 12),
    b_init=st.integers(1, 100),
    capacity=st.floats(0.1, 100.0),
    fixed=st.floats(0.0, 5.0),
    knee=st.sampled_from([0.0, 16.0, 200.0]),
)
def test_rho_one_gives_the_equal_split_on_equal_speeds_and_weights(
    n: int, b_init: int, capacity: float, fixed: float, knee: float
) -> None:
    # Execute
    result = budgeted_minmax(
        np.full(n, 1.0 / capacity), np.full(n, fixed), n * b_init, knee=np.full(n, knee), rho=1.0
    )

    # Assert
    assert result.sizes.tolist() == [b_init] * n
    assert result.noise_ratio == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(capacity=st.lists(st.floats(1.0, 16.0), min_size=2, max_size=8), b_init=st.integers(4, 64))
def test_rho_one_gives_the_equal_split_on_any_speeds_with_equal_weights(
    capacity: list[float], b_init: int
) -> None:
    # Prepare: the equal split is the only split as little noisy as itself
    n = len(capacity)

    # Execute
    result = budgeted_minmax(0.01 / np.array(capacity), np.zeros(n), n * b_init, rho=1.0)

    # Assert
    assert result.sizes.tolist() == [b_init] * n


@settings(max_examples=100, deadline=None)
@given(problem=problems(), rhos=st.lists(budgets, min_size=2, max_size=2, unique=True))
def test_round_time_is_monotone_non_increasing_in_rho(
    problem: dict[str, object], rhos: list[float]
) -> None:
    # Prepare
    low, high = sorted(rhos)
    args = (problem["a"], problem["b"], problem["total"])
    common = {"knee": problem["knee"], "weights": problem["weights"]}

    # Execute
    given = {"a": args[0], "b": args[1], "total": args[2], **common}
    t_low = budgeted_minmax_continuous(BudgetProblem(rho=low, **given))[1]
    t_high = budgeted_minmax_continuous(BudgetProblem(rho=high, **given))[1]
    t_none = budgeted_minmax_continuous(BudgetProblem(rho=None, **given))[1]
    int_low = budgeted_minmax(*args, rho=low, **common).round_time
    int_high = budgeted_minmax(*args, rho=high, **common).round_time

    # Assert: exactly for the real optimum; within one sample's time once rounded
    assert t_none <= t_high * (1 + 1e-9) and t_high <= t_low * (1 + 1e-9)
    assert int_high <= int_low + float(np.max(problem["a"])) * (1 + 1e-9)


@settings(max_examples=120, deadline=None)
@given(problem=problems(), rho=st.one_of(st.none(), budgets))
@example(  # a tie in time: silo 4 at 7 (flat below its knee of 8) carries less noise
    problem={
        "a": np.full(5, 0.01), "b": np.zeros(5), "knee": np.array([0.0, 0, 0, 0, 8]),
        "weights": np.array([2.0, 3, 4, 4, 4]), "total": 25,
    },
    rho=1.0,
)  # fmt: skip
def test_no_silo_below_its_knee_unless_forced(
    problem: dict[str, object], rho: float | None
) -> None:
    # Prepare
    a, b, knee, total = problem["a"], problem["b"], problem["knee"], problem["total"]
    common = {"weights": problem["weights"], "rho": rho}

    # Execute
    chosen = budgeted_minmax(a, b, total, knee=knee, **common)
    sizes = chosen.sizes

    # Assert: a silo below its knee only where X cannot hold every knee, or where holding
    # them would cost something: a longer round (the budget then needs the noise of a
    # smaller batch), or, in whole samples, as long a round with more noise (below its
    # knee a silo's time is flat, so a tie in time is broken by the noise alone)
    below = sizes < knee
    if below.any() and knee.sum() <= total:
        held = budgeted_minmax_continuous(
            BudgetProblem(a=a, b=b, total=total, knee=knee, lower=knee, **common)
        )
        free = budgeted_minmax_continuous(BudgetProblem(a=a, b=b, total=total, knee=knee, **common))
        assert rho is not None
        if held[4] and held[1] <= free[1] * (1 + 1e-9):
            whole = budgeted_minmax(a, b, total, knee=knee, lower=knee, **common)
            assert whole.feasible
            assert whole.round_time > chosen.round_time * (1 + 1e-9) or noise_ratio(
                whole.sizes, weights=problem["weights"]
            ) > noise_ratio(chosen.sizes, weights=problem["weights"]) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.lists(st.floats(1.0, 16.0), min_size=2, max_size=3),
    fixed=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
    b_init=st.integers(2, 10),
    rho=budgets,
)
def test_the_integer_allocation_is_near_the_brute_force_optimum(
    capacity: list[float], fixed: list[float], b_init: int, rho: float
) -> None:
    # Prepare: every integer split of a small total
    n = len(capacity)
    a = 0.01 / np.array(capacity)
    b = np.array(fixed[:n]) * a * b_init
    total = n * b_init
    best = math.inf
    for head in itertools.product(range(1, total), repeat=n - 1):
        x = np.array([*head, total - sum(head)])
        if x[-1] >= 1 and noise_ratio(x) <= rho * (1 + 1e-9):
            best = min(best, float(np.max(a * x + b)))

    # Execute
    result = budgeted_minmax(a, b, total, lower=np.ones(n), rho=rho)

    # Assert: never better than the best integer split (it is one); within a sample of it
    assert best - 1e-12 <= result.round_time <= best + float(np.max(a)) + 1e-12


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_without_budget_and_knees_it_is_the_linear_minmax(problem: dict[str, object]) -> None:
    # Prepare
    a, b, total = problem["a"], problem["b"], problem["total"]

    # Execute
    ours = budgeted_minmax(a, b, total)
    lines = linear_minmax(a, b, total)

    # Assert: the same round time; T* is the closed form where no share is negative
    assert ours.round_time == pytest.approx(float(np.max(a * lines + b)), rel=1e-9)
    closed = ideal_round_time(a, b, total)
    if np.all(closed >= b):
        assert budgeted_ideal_time(a, b, total) == pytest.approx(closed)


def test_a_silo_holding_more_data_gets_a_larger_batch_for_the_same_noise() -> None:
    # Prepare: a fast and a slow silo (4:1); the slow one holds 3/4 or 1/4 of the data
    a = np.array([0.01 / 4, 0.01])

    # Execute
    heavy = budgeted_minmax(a, np.zeros(2), 64, weights=[1.0, 3.0], rho=1.2).sizes
    light = budgeted_minmax(a, np.zeros(2), 64, weights=[3.0, 1.0], rho=1.2).sizes

    # Assert
    assert heavy[1] > light[1]


def test_the_wide_mix_reasons_name_the_budget_and_the_round_time() -> None:
    # Prepare: capacities 8,8,6,6,4,4,2,2,1,1
    capacity = np.array([8, 8, 6, 6, 4, 4, 2, 2, 1, 1], dtype=float)

    # Execute
    result = budgeted_minmax(0.01 / capacity, np.zeros(10), 480, rho=1.2)

    # Assert: the slowest finish at the round time, the fastest are held by the budget
    assert result.binds and result.feasible
    assert result.reasons[-1] == "round-time"
    assert result.reasons[0] == "noise-budget"


def test_an_unreachable_budget_gives_the_least_noisy_split_within_the_bounds() -> None:
    # Prepare: a memory cap of 8 on one of two silos, X = 64: the equal split is out
    a = np.array([0.01, 0.01])

    # Execute
    result = budgeted_minmax(a, np.zeros(2), 64, upper=[np.inf, 8], rho=1.0)

    # Assert
    assert result.sizes.tolist() == [56, 8]
    assert not result.feasible
    assert set(result.reasons) == {"infeasible"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rho": 0.0}, "rho"),
        ({"rho": math.inf}, "rho"),
        ({"weights": [1.0, -1.0]}, "weights"),
        ({"noise": [1.0, math.nan]}, "noise"),
        ({"knee": [1.0, -1.0]}, "knee"),
        ({"lower": [40, 40]}, "outside"),
    ],
)
def test_bad_inputs_are_refused(kwargs: dict[str, object], match: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=match):
        budgeted_minmax([0.01, 0.02], [0.0, 0.0], 64, **kwargs)  # type: ignore[arg-type]


def test_hinge_times_are_flat_below_the_knee() -> None:
    # Execute
    times = hinge_times([0.5, 0.5], [1.0, 1.0], [4.0, 0.0], [2.0, 2.0])

    # Assert
    assert times.tolist() == [3.0, 2.0]


# ---------------------------------------------------------------------- the knee fit
def _gpu(x: float) -> float:
    return 0.01 * max(x, 64.0) + 0.1


@pytest.mark.parametrize(
    ("xs", "knee"),
    [
        ([32, 32, 20, 20, 40, 48], 48.0),  # flat all along: the largest seen
        ([32, 32, 20, 20, 48, 96, 128], 48.0),  # rising beyond 64
        ([32, 32], 0.0),  # one batch size: nothing known
    ],
)
def test_find_knee_on_a_noise_free_gpu_curve(xs: list[int], knee: float) -> None:
    # Execute / Assert
    assert find_knee(xs, [_gpu(x) for x in xs], noise=0.0) == knee


def test_find_knee_sees_no_knee_on_a_line_with_a_large_fixed_cost() -> None:
    # Prepare: b / a = 48 samples; the smallest batch's per-sample share is 17%
    xs = [48, 48, 30, 20, 14, 10]

    # Execute / Assert
    assert find_knee(xs, [0.01 * x + 0.48 for x in xs], noise=0.0) == 0.0


def test_find_knee_keeps_its_knee_without_evidence_and_drops_a_contradicted_one() -> None:
    # Execute / Assert: one batch size says nothing; a clear rise below the knee drops it
    assert find_knee([64, 64, 64], [1.0, 1.0, 1.0], knee=64.0, noise=0.0) == 64.0
    assert find_knee([14, 40], [0.14, 0.40], knee=64.0, noise=0.0) == 0.0


def test_find_knee_needs_more_than_jitter_to_call_a_curve_flat() -> None:
    # Prepare: a proportional line at two batch sizes, 10% jitter, 3 reports each
    rng = np.random.default_rng(3)
    xs = [20] * 3 + [24] * 3
    ts = [0.01 * x * math.exp(0.1 * rng.standard_normal()) for x in xs]

    # Execute / Assert
    assert find_knee(xs, ts, noise=0.1) == 0.0


def test_robust_fit_with_a_knee_fits_the_line_above_it() -> None:
    # Prepare: flat up to 64, 0.01 s per sample beyond
    xs = [20, 32, 48, 64, 96, 128]

    # Execute
    fit = fit_robust_cost(xs, [_gpu(x) for x in xs], knee=64.0)

    # Assert
    assert fit.slope == pytest.approx(0.01)
    assert fit.predict(10) == pytest.approx(_gpu(64)) and fit.predict(128) == pytest.approx(1.38)


@pytest.mark.parametrize(("x", "t", "kwargs"), [([1, 2], [1, 2], {"knee": -1.0})])
def test_knee_inputs_are_checked(x: list[float], t: list[float], kwargs: dict) -> None:  # type: ignore[type-arg]
    # Execute / Assert
    with pytest.raises(ValueError, match="knee"):
        fit_robust_cost(x, t, **kwargs)
    with pytest.raises(ValueError, match="knee"):
        find_knee(x, t, **kwargs)


# ------------------------------------------------------------------------ the balancer
def _feed(balancer: BatchSizeBalancer, times: dict[str, float], sizes: dict[str, int]) -> None:
    balancer.report_round({s: SiloReport(batch_size=sizes[s], train_time=times[s]) for s in sizes})


def test_the_balancer_keeps_the_budget_with_the_servers_weights() -> None:
    # Prepare: 10 silos 8,8,6,6,4,4,2,2,1,1, noise-free lines; the slowest two hold most data
    capacity = np.array([8, 8, 6, 6, 4, 4, 2, 2, 1, 1], dtype=float)
    ids = [f"s{i}" for i in range(10)]
    weights = dict(zip(ids, [1, 1, 1, 1, 1, 1, 1, 1, 5, 5], strict=True))
    balancer = BatchSizeBalancer(initial_batch_size=48)

    # Execute
    for _ in range(10):
        sizes = balancer.allocate(ids, weights=weights)
        times = {s: 0.01 * sizes[s] / c for s, c in zip(ids, capacity, strict=True)}
        _feed(balancer, times, sizes)
    x = np.array([sizes[s] for s in ids])

    # Assert
    assert noise_ratio(x, weights=list(weights.values())) <= NOISE_BUDGET * (1 + 1e-9)
    assert {why for _, why in balancer.last_allocation.values()} <= set(ALLOCATION_REASONS)
    assert balancer.last_allocation["s9"][1] == "round-time"


def test_the_balancer_without_budget_for_gradients_weighted_by_batch_size() -> None:
    # Prepare: two silos 8:1 (noise-free)
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_change_ratio=None))
    for _ in range(4):
        sizes = balancer.allocate(["a", "b"], budget=False)
        _feed(balancer, {"a": 0.01 * sizes["a"] / 8, "b": 0.01 * sizes["b"]}, sizes)

    # Execute
    sizes = balancer.allocate(["a", "b"], budget=False)

    # Assert: the min-max split of the lines, no budget
    assert (sizes["a"], sizes["b"]) == (57, 7)


def test_a_flat_silo_is_moved_back_to_its_knee_and_kept_there() -> None:
    # Prepare: g is a GPU flat up to 64 (CostModel knee=64), at B_init twice as slow as
    # the CPU c (proportional): the balancer first shrinks g, for no time
    gpu = CostModel.parse("0.01,0.0,knee=64")
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(noise_budget=None))
    sizes = balancer.allocate(["c", "g"])

    # Execute
    seen = []
    for _ in range(12):
        _feed(balancer, {"c": 0.01 * sizes["c"], "g": gpu.time(sizes["g"])}, sizes)
        sizes = balancer.allocate(["c", "g"])
        seen.append(sizes["g"])

    # Assert: once its flat part is seen, g is back at the largest batch size it was seen
    # flat at (B_init) and stays there: smaller batches gained it nothing
    assert min(seen) < 32
    assert balancer.knee("g") == 32
    assert seen[-4:] == [32] * 4
    assert balancer.last_allocation["g"] == (32, "knee")


def test_the_noise_budget_and_knee_survive_a_checkpoint() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(noise_budget=1.5))
    for x, t in ((32, 0.64), (20, 0.64), (40, 0.64), (24, 0.64), (36, 0.64)):
        _feed(balancer, {"g": t, "c": 0.02 * 32}, {"g": x, "c": 32})

    # Execute
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Assert
    assert restored.noise_budget == 1.5
    assert restored.knee("g") == balancer.knee("g") > 0
    assert restored.allocate(["c", "g"]) == balancer.allocate(["c", "g"])


@pytest.mark.parametrize("value", [0.5, 0.0, math.nan, math.inf, 2e6])
def test_settings_refuse_a_budget_below_fedavgs_noise(value: float) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="noise_budget"):
        BalancingConfig(initial_batch_size=32, local_steps=1, lr=0.1, noise_budget=value)
    with pytest.raises(ValueError, match="noise_budget"):
        BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(noise_budget=value))


def test_settings_accept_no_budget_and_default_to_sqrt_two() -> None:
    # Execute
    default = BalancingConfig(initial_batch_size=32, local_steps=1, lr=0.1)
    off = BalancingConfig(initial_batch_size=32, local_steps=1, lr=0.1, noise_budget=None)

    # Assert
    assert default.noise_budget == pytest.approx(math.sqrt(2.0))
    assert off.noise_budget is None


@pytest.mark.parametrize(
    ("weights", "match"), [({"a": -1.0}, "weights"), ({"a": math.inf}, "weights")]
)
def test_allocate_refuses_bad_weights(weights: dict[str, float], match: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=match):
        BatchSizeBalancer(initial_batch_size=32).allocate(["a", "b"], weights=weights)


# ----------------------------------------------------------------- the cost model knee
@pytest.mark.parametrize(
    ("text", "small", "large"),
    [
        ("0.01,0.1,knee=64", 0.74, 1.38),
        ("0.01,0.1,0.74", 0.74, 1.38),  # the floor C = m * 64 + b: the same curve
        ("0.01,b=0.1,knee=64,x_max=256", 0.74, 1.38),
    ],
)
def test_cost_model_flat_up_to_its_knee(text: str, small: float, large: float) -> None:
    # Execute
    model = CostModel.parse(text)

    # Assert
    assert model.time(16) == pytest.approx(small)
    assert model.time(128) == pytest.approx(large)


@pytest.mark.parametrize(
    "text", ["0.01,knee=2,0.1", "0.01,size=3", "0.01,knee=x", "0.01,b=1,b=2", "0.01,knee=-1"]
)
def test_cost_model_refuses_bad_named_parts(text: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="cost model|knee"):
        CostModel.parse(text)


def test_cost_model_four_number_form_still_parses() -> None:
    # Execute
    model = CostModel.parse("0.001,0.002,0.05,256")

    # Assert
    assert (model.floor, model.max_batch_size, model.knee) == (0.05, 256, 0)
