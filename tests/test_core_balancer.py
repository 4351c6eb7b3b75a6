"""Tests for fl_lbbsp.core.balancer: the BatchSizeManager keyed by silo id."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core import BatchSizeBalancer, InvalidReportError, SiloReport, ideal_round_time
from fl_lbbsp.core.settings import BalancingKnobs

PAPER_SPEEDS = [16.0, 8.0, 8.0, 4.0, 4.0]
IDS = [f"silo-{i}" for i in range(5)]
# Alg. 1 as the paper states it: proportional, none of the defaults' limits and guards.
PAPER: dict[str, Any] = {
    "allocator": "proportional",
    "max_change_ratio": None,
    "min_batch_fraction": 0.0,
    "noise_budget": None,
    "change_sigmas": None,
    "order_tolerance": None,
    "equal_split_guard": False,
}


def _run_rounds(
    balancer: BatchSizeBalancer,
    per_sample: list[float],
    fixed: float,
    rounds: int,
    scale: float = 0.01,
) -> list[tuple[list[int], float]]:
    """Simulate rounds with cost t_i = scale * (per_sample_i * B_i + fixed).

    Returns the allocation used in each round and that round's time max_i t_i.
    """
    a = np.asarray(per_sample)
    history = []
    for _ in range(rounds):
        sizes = balancer.allocate(IDS)
        x = np.array([sizes[s] for s in IDS])
        times = scale * (a * x + fixed)
        history.append((x.tolist(), float(times.max())))
        for silo, size, t in zip(IDS, x, times, strict=True):
            balancer.report(silo, SiloReport(batch_size=int(size), train_time=float(t)))
    return history


# ----------------------------------------------------------------------------- total and start
def test_first_allocation_is_initial_batch_size_for_everyone() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=32)

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert
    assert sizes == {silo: 32 for silo in IDS}
    assert balancer.total_batch_size(5) == 160
    assert balancer.silo_ids == []


def test_allocate_of_no_silos_is_empty_and_duplicates_collapse() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=8)

    # Execute
    empty = balancer.allocate([])
    deduplicated = balancer.allocate(["a", "b", "a"])

    # Assert
    assert empty == {}
    assert deduplicated == {"a": 8, "b": 8}


@settings(max_examples=40, deadline=None)
@given(
    allocator=st.sampled_from(["proportional", "linear"]),
    estimator=st.sampled_from(["ema", "last"]),
    initial=st.integers(1, 64),
    rounds=st.lists(
        st.lists(
            st.tuples(st.floats(0.01, 100.0), st.floats(0.0, 5.0), st.booleans()),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_total_is_kept_every_round(
    allocator: str,
    estimator: str,
    initial: int,
    rounds: list[list[tuple[float, float, bool]]],
) -> None:
    # Prepare
    balancer = BatchSizeBalancer(
        initial_batch_size=initial, knobs=BalancingKnobs(allocator=allocator, estimator=estimator)
    )

    for silos in rounds:
        ids = [f"s{i}" for i in range(len(silos))]

        # Execute
        sizes = balancer.allocate(ids)

        # Assert
        assert list(sizes) == ids
        assert sum(sizes.values()) == len(ids) * initial
        assert all(size >= 1 for size in sizes.values())
        for silo, (per_sample, fixed, reports) in zip(ids, silos, strict=True):
            if reports:
                t = per_sample * sizes[silo] + fixed
                balancer.report(silo, SiloReport(batch_size=sizes[silo], train_time=t))


# ----------------------------------------------------------------------------- convergence
def test_static_speeds_reach_paper_allocation_after_one_round() -> None:
    # Prepare: t = k * B / v, no fixed cost
    balancer = BatchSizeBalancer(initial_batch_size=32)
    per_sample = [1.0 / v for v in PAPER_SPEEDS]

    # Execute
    history = _run_rounds(balancer, per_sample, fixed=0.0, rounds=8)

    # Assert
    assert history[0][0] == [32] * 5
    assert history[1][0] == [64, 32, 32, 16, 16]
    for sizes, _ in history[1:]:
        assert np.max(np.abs(np.asarray(sizes) - [64, 32, 32, 16, 16])) <= 1
    ideal = ideal_round_time(0.01 * np.asarray(per_sample), np.zeros(5), 160)
    assert history[-1][1] == pytest.approx(ideal)


def test_linear_allocator_reaches_ideal_round_time_with_fixed_cost() -> None:
    # Prepare: t = k * (B / v + b) with a fixed cost b comparable to the per-sample cost
    per_sample = [1.0 / v for v in PAPER_SPEEDS]
    fixed = 2.0
    ideal = ideal_round_time(0.01 * np.asarray(per_sample), np.full(5, 0.01 * fixed), 160)

    # Execute
    linear = _run_rounds(
        BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(allocator="linear")),
        per_sample,
        fixed,
        10,
    )
    prop = _run_rounds(
        BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(**PAPER)),
        per_sample,
        fixed,
        10,
    )

    # Assert: from round 5 on, the robust linear fit (it trusts a silo's own slope once
    # 4 reports give a residual scale, here exact) solves the min-max exactly, up to
    # rounding; before, it moves toward it from the proportional prior
    for _, round_time in linear[4:]:
        assert round_time <= 1.02 * ideal
    assert all(b[1] <= a[1] for a, b in zip(linear, linear[1:], strict=False))
    # The proportional allocator measures speed B / (a B + b), which depends on the batch
    # size itself because of the fixed cost, and its EMA (alpha = 0.2) still lags at round 3.
    assert prop[2][1] > 1.02 * ideal
    assert linear[2][1] < prop[2][1]


# ----------------------------------------------------------------------------- silo membership
@pytest.mark.parametrize("allocator", ["proportional", "linear"])
def test_new_silo_starts_at_mean_speed(allocator: str) -> None:
    # Prepare: two known silos at speeds 10 and 30; a third at speed 20 (the mean)
    balancer = BatchSizeBalancer(initial_batch_size=30, knobs=BalancingKnobs(allocator=allocator))
    balancer.report("slow", SiloReport(batch_size=30, train_time=3.0))
    balancer.report("fast", SiloReport(batch_size=30, train_time=1.0))
    reference = BatchSizeBalancer(initial_batch_size=30, knobs=BalancingKnobs(allocator=allocator))
    reference.report("slow", SiloReport(batch_size=30, train_time=3.0))
    reference.report("fast", SiloReport(batch_size=30, train_time=1.0))
    reference.report("mean", SiloReport(batch_size=30, train_time=1.5))

    # Execute
    sizes = balancer.allocate(["slow", "fast", "new"])
    expected = reference.allocate(["slow", "fast", "mean"])

    # Assert
    assert balancer.predicted_speed("new") is None
    assert list(sizes.values()) == list(expected.values())
    assert sizes == {"slow": 15, "fast": 45, "new": 30}


def test_absent_silo_keeps_its_estimate() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=20, knobs=BalancingKnobs(**PAPER))
    balancer.report("a", SiloReport(batch_size=20, train_time=1.0))
    balancer.report("b", SiloReport(batch_size=20, train_time=2.0))
    speed_before = balancer.predicted_speed("b")

    # Execute: b misses three rounds while a speeds up
    for _ in range(3):
        balancer.allocate(["a"])
        balancer.report("a", SiloReport(batch_size=40, train_time=1.0))
    sizes = balancer.allocate(["a", "b"])

    # Assert
    assert balancer.predicted_speed("b") == speed_before == 10.0
    speed_a = balancer.predicted_speed("a")
    assert speed_a is not None
    assert sizes["b"] == round(40 * 10.0 / (speed_a + 10.0))
    assert sum(sizes.values()) == 40


def test_a_given_total_is_split_over_the_silos_present() -> None:
    # Prepare: a 3:1 speed ratio; the federation's X is 3 * 20 but only a and b are here
    balancer = BatchSizeBalancer(
        initial_batch_size=20, knobs=BalancingKnobs(estimator="last", **PAPER)
    )
    balancer.report("a", SiloReport(batch_size=20, train_time=1.0))
    balancer.report("b", SiloReport(batch_size=20, train_time=3.0))

    # Execute
    sizes = balancer.allocate(["a", "b"], total=60)

    # Assert: the absent silo's share goes to the others, by speed
    assert sizes == {"a": 45, "b": 15}
    assert sum(balancer.allocate(["a", "b"]).values()) == 40  # default: n * B_init
    with pytest.raises(ValueError, match="total"):
        balancer.allocate(["a"], total=0)


def test_silo_reporting_ten_times_faster_gets_bigger_batch() -> None:
    # Prepare: two equal silos
    balancer = BatchSizeBalancer(initial_batch_size=32)
    for silo in ("a", "b"):
        balancer.report(silo, SiloReport(batch_size=32, train_time=1.0))
    before = balancer.allocate(["a", "b"])

    # Execute: a suddenly runs 10x faster
    balancer.report("a", SiloReport(batch_size=32, train_time=0.1))
    balancer.report("b", SiloReport(batch_size=32, train_time=1.0))
    after = balancer.allocate(["a", "b"])

    # Assert
    assert before == {"a": 32, "b": 32}
    assert after["a"] > before["a"]
    assert after["b"] < before["b"]
    assert sum(after.values()) == 64


@pytest.mark.parametrize(("ratio", "expected"), [(2.0, (48, 16)), (1.5, (42, 22)), (None, (56, 8))])
def test_change_limit_bounds_a_silo_claiming_a_hundred_times_its_speed(
    ratio: float | None, expected: tuple[int, int]
) -> None:
    # Prepare: two equal silos, two honest rounds each
    balancer = BatchSizeBalancer(
        initial_batch_size=32,
        knobs=BalancingKnobs(max_change_ratio=ratio, min_batch_fraction=0.25, noise_budget=None),
    )
    for _ in range(2):
        for silo in ("a", "b"):
            balancer.report(silo, SiloReport(batch_size=32, train_time=1.0))

    # Execute: a claims 100x its speed, twice in a row
    sizes = []
    for _ in range(2):
        balancer.report("a", SiloReport(batch_size=32, train_time=0.01))
        balancer.report("b", SiloReport(batch_size=32, train_time=1.0))
        sizes.append(balancer.allocate(["a", "b"]))

    # Assert: no batch moves past the ratio from the 32 last reported (b's lower limit
    # binds a); without a limit, b's floor (B_init / 4) does
    assert (sizes[-1]["a"], sizes[-1]["b"]) == expected
    for got in sizes:
        assert sum(got.values()) == 64
        if ratio is not None:
            assert 32 / ratio <= got["b"] and got["a"] <= 32 * ratio


@pytest.mark.parametrize(("ratio", "expected"), [(1.5, (42, 22)), (2.0, (48, 16)), (4.0, (56, 8))])
def test_first_report_is_bounded_by_the_change_limit_around_b_init(
    ratio: float, expected: tuple[int, int]
) -> None:
    # Prepare: a floor of B_init / 4
    balancer = BatchSizeBalancer(
        initial_batch_size=32,
        knobs=BalancingKnobs(max_change_ratio=ratio, min_batch_fraction=0.25, noise_budget=None),
    )

    # Execute: one report each, a is 7x as fast
    balancer.report("a", SiloReport(batch_size=32, train_time=1.0))
    balancer.report("b", SiloReport(batch_size=32, train_time=7.0))
    sizes = balancer.allocate(["a", "b"])

    # Assert: within [B_init / r, B_init * r] (and the floor B_init / 4), not the 56:8 split
    assert (sizes["a"], sizes["b"]) == expected
    assert 32 / ratio <= sizes["b"] and sizes["a"] <= 32 * ratio


def test_a_silo_that_never_reported_is_bounded_around_b_init() -> None:
    # Prepare: a and b reported, c joins late
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_change_ratio=2.0))
    balancer.report("a", SiloReport(batch_size=32, train_time=0.1))
    balancer.report("b", SiloReport(batch_size=32, train_time=10.0))

    # Execute
    sizes = balancer.allocate(["a", "b", "c"])

    # Assert: every silo within [16, 64] of the 32 it last ran (c: B_init)
    assert all(16 <= size <= 64 for size in sizes.values())
    assert sum(sizes.values()) == 96


def test_change_limit_is_dropped_when_it_makes_the_total_unreachable() -> None:
    # Prepare: both silos reported running only 10 samples per step, twice
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_change_ratio=2.0))
    for _ in range(2):
        for silo in ("a", "b"):
            balancer.report(silo, SiloReport(batch_size=10, train_time=1.0))

    # Execute: within 2x of 10 the total 64 is out of reach
    sizes = balancer.allocate(["a", "b"])

    # Assert: the total wins
    assert sizes == {"a": 32, "b": 32}


def test_memory_cap_wins_over_the_change_limit() -> None:
    # Prepare: a ran 40 per step, then reports a memory cap of 12
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_change_ratio=2.0))
    balancer.report("a", SiloReport(batch_size=40, train_time=1.0))
    balancer.report("b", SiloReport(batch_size=24, train_time=1.0))
    balancer.report("a", SiloReport(batch_size=40, train_time=1.0, max_batch_size=12))
    balancer.report("b", SiloReport(batch_size=24, train_time=1.0))

    # Execute
    sizes = balancer.allocate(["a", "b", "c"])

    # Assert: a is held at its cap although 40 / 2 = 20 would be the change limit
    assert sizes["a"] == 12
    assert sum(sizes.values()) == 96


def test_samples_processed_define_speed() -> None:
    # Prepare: same batch size and time, but a ran twice the local steps
    balancer = BatchSizeBalancer(initial_batch_size=30, knobs=BalancingKnobs(**PAPER))

    # Execute
    balancer.report("a", SiloReport(batch_size=30, train_time=1.0, samples=600))
    balancer.report("b", SiloReport(batch_size=30, train_time=1.0, samples=300))
    sizes = balancer.allocate(["a", "b"])

    # Assert
    assert balancer.predicted_speed("a") == 600.0
    assert sizes == {"a": 40, "b": 20}


# ----------------------------------------------------------------------------- invalid input
@pytest.mark.parametrize(
    ("batch_size", "train_time"),
    [
        (0, 1.0),
        (-1, 1.0),
        (2.5, 1.0),
        (True, 1.0),
        (8, 0.0),
        (8, -1.0),
        (8, math.nan),
        (8, math.inf),
        (8, -math.inf),
    ],
    ids=["batch-0", "batch-neg", "batch-float", "batch-bool", "time-0", "time-neg", "time-nan"]
    + ["time-inf", "time-neg-inf"],
)
def test_invalid_report_raises_and_leaves_state_unchanged(
    batch_size: int, train_time: float
) -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=8)
    balancer.report("a", SiloReport(batch_size=8, train_time=1.0))
    balancer.report("b", SiloReport(batch_size=8, train_time=2.0))
    state_before = balancer.to_json()
    sizes_before = balancer.allocate(["a", "b", "c"])

    # Execute
    with pytest.raises(InvalidReportError):
        balancer.report("a", SiloReport(batch_size=batch_size, train_time=train_time))
    with pytest.raises(InvalidReportError):
        balancer.report("c", SiloReport(batch_size=batch_size, train_time=train_time))

    # Assert
    assert balancer.to_json() == state_before
    assert balancer.silo_ids == ["a", "b"]
    assert balancer.allocate(["a", "b", "c"]) == sizes_before


@pytest.mark.parametrize(
    "report",
    [
        SiloReport(batch_size=8, train_time=1.0, samples=0),
        SiloReport(batch_size=8, train_time=1.0, samples=-8),
        SiloReport(batch_size=8, train_time=1.0, max_batch_size=0),
        SiloReport(batch_size=8, train_time=1.0, max_batch_size=-4),
    ],
    ids=["samples-0", "samples-neg", "cap-0", "cap-neg"],
)
def test_invalid_optional_fields_raise(report: SiloReport) -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=8)

    # Execute / Assert
    with pytest.raises(InvalidReportError):
        balancer.report("a", report)
    assert balancer.silo_ids == []


@pytest.mark.parametrize(
    "report",
    [
        SiloReport(batch_size=8, train_time=1.0, samples=math.nan),  # type: ignore[arg-type]
        SiloReport(batch_size=8, train_time=1e-320),
        SiloReport(batch_size=math.nan, train_time=1.0),  # type: ignore[arg-type]
        SiloReport(batch_size=math.inf, train_time=1.0),  # type: ignore[arg-type]
    ],
    ids=["samples-nan", "speed-overflow", "batch-nan", "batch-inf"],
)
def test_report_with_non_finite_speed_is_invalid_and_harmless(report: SiloReport) -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=8)

    # Execute
    with pytest.raises(InvalidReportError):
        balancer.report("a", report)

    # Assert
    assert balancer.silo_ids == []


# ----------------------------------------------------------------------------- memory caps
def test_cap_below_min_batch_size_does_not_break_allocation() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=8, knobs=BalancingKnobs(min_batch_size=4))
    try:
        balancer.report("a", SiloReport(batch_size=8, train_time=1.0, max_batch_size=2))
    except InvalidReportError:
        return  # rejecting the report up front is acceptable too

    # Execute
    sizes = balancer.allocate(["a", "b"])

    # Assert
    assert sizes["a"] <= 4
    assert sum(sizes.values()) <= 16


def test_reported_memory_cap_bounds_that_silo() -> None:
    # Prepare: silo 0 is the fastest but can hold only 40 samples
    balancer = BatchSizeBalancer(initial_batch_size=32)
    for silo, v in zip(IDS, PAPER_SPEEDS, strict=True):
        cap = 40 if silo == IDS[0] else None
        balancer.report(silo, SiloReport(batch_size=32, train_time=32 / v, max_batch_size=cap))

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert
    assert [sizes[s] for s in IDS] == [40, 40, 40, 20, 20]


def test_balancer_max_batch_size_and_caps_combine() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_batch_size=50))
    for silo, v in zip(IDS, PAPER_SPEEDS, strict=True):
        cap = 24 if silo == IDS[4] else None
        balancer.report(silo, SiloReport(batch_size=32, train_time=32 / v, max_batch_size=cap))

    # Execute
    sizes = balancer.allocate(IDS)

    # Assert
    assert sizes[IDS[0]] <= 50
    assert sizes[IDS[4]] <= 24
    assert sum(sizes.values()) == 160


def test_caps_below_total_give_every_capped_silo_its_cap() -> None:
    # Prepare: caps below the floor (B_init / 3, i.e. 3): the memory caps win
    balancer = BatchSizeBalancer(initial_batch_size=8, knobs=BalancingKnobs(allocator="linear"))
    balancer.report("a", SiloReport(batch_size=8, train_time=1.0, max_batch_size=2))
    balancer.report("b", SiloReport(batch_size=8, train_time=1.0, max_batch_size=3))

    # Execute
    sizes = balancer.allocate(["a", "b"])

    # Assert
    assert sizes == {"a": 2, "b": 3}


# ----------------------------------------------------------------------------- constructor
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"initial_batch_size": 0}, "0"),
        ({"initial_batch_size": -3}, "-3"),
        ({"initial_batch_size": 2.5}, "2.5"),
        ({"initial_batch_size": True}, "True"),
        ({"initial_batch_size": 8, "allocator": "greedy"}, "'greedy'"),
        ({"initial_batch_size": 8, "estimator": "arima"}, "'arima'"),
        ({"initial_batch_size": 8, "alpha": 1.5}, "1.5"),
        ({"initial_batch_size": 8, "min_batch_size": 0}, "0"),
        ({"initial_batch_size": 8, "max_batch_size": 2, "min_batch_size": 4}, "2"),
        ({"initial_batch_size": 8, "history": 0}, "0"),
        ({"initial_batch_size": 8, "min_fit_spread": -0.1}, "-0.1"),
        ({"initial_batch_size": 8, "max_change_ratio": 1.0}, "1.0"),
        ({"initial_batch_size": 8, "max_change_ratio": math.nan}, "nan"),
    ],
    ids=[
        "B-zero",
        "B-negative",
        "B-float",
        "B-bool",
        "allocator",
        "estimator",
        "alpha",
        "min-batch",
        "max<min",
        "history",
        "spread",
        "change-ratio-1",
        "change-ratio-nan",
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, object], named: str) -> None:
    # Prepare / Execute / Assert
    knobs = {k: v for k, v in kwargs.items() if k != "initial_batch_size"}
    with pytest.raises(ValueError) as info:
        BatchSizeBalancer(
            initial_batch_size=kwargs["initial_batch_size"],  # type: ignore[arg-type]
            knobs=BalancingKnobs(**knobs),  # type: ignore[arg-type]
        )
    assert named in str(info.value)


def test_constructor_accepts_numpy_integer() -> None:
    # Prepare / Execute
    balancer = BatchSizeBalancer(initial_batch_size=np.int64(16))  # type: ignore[arg-type]

    # Assert
    assert balancer.allocate(["a", "b"]) == {"a": 16, "b": 16}


# ----------------------------------------------------------------------------- serialisation
@pytest.mark.parametrize("allocator", ["proportional", "linear"])
@pytest.mark.parametrize("estimator", ["ema", "last"])
def test_json_round_trip_keeps_decisions(allocator: str, estimator: str) -> None:
    # Prepare: several rounds with a fixed cost, a memory cap and an absent silo
    balancer = BatchSizeBalancer(
        initial_batch_size=32,
        knobs=BalancingKnobs(allocator=allocator, estimator=estimator, alpha=0.3, history=5),
    )
    _run_rounds(balancer, [1.0 / v for v in PAPER_SPEEDS], fixed=2.0, rounds=7)
    balancer.report("capped", SiloReport(batch_size=32, train_time=0.5, max_batch_size=20))

    # Execute
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Assert: same predictions and allocations, now and after one more identical round
    everyone = [*IDS, "capped", "newcomer"]
    assert restored.to_json() == balancer.to_json()
    assert sorted(restored.silo_ids) == sorted(balancer.silo_ids)
    for silo in everyone:
        assert restored.predicted_speed(silo) == balancer.predicted_speed(silo)
    assert restored.allocate(everyone) == balancer.allocate(everyone)
    for b in (balancer, restored):
        b.report("silo-0", SiloReport(batch_size=50, train_time=0.9))
    assert restored.allocate(everyone) == balancer.allocate(everyone)


@settings(max_examples=30, deadline=None)
@given(
    allocator=st.sampled_from(["proportional", "linear", "iterative"]),
    times=st.lists(st.floats(0.1, 10.0), min_size=2, max_size=6),
    order=st.randoms(use_true_random=False),
)
def test_sizes_do_not_depend_on_the_order_silos_are_listed(
    allocator: str, times: list[float], order
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: every silo reported once, some at equal speeds (ties in the rounding)
    ids = [f"s{i}" for i in range(len(times))]
    balancer = BatchSizeBalancer(initial_batch_size=16, knobs=BalancingKnobs(allocator=allocator))
    for silo, t in zip(ids, times, strict=True):
        balancer.report(silo, SiloReport(batch_size=16, train_time=round(t, 1)))
    shuffled = list(ids)
    order.shuffle(shuffled)
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Execute
    sizes = balancer.allocate(ids)
    again = restored.allocate(shuffled)

    # Assert: the same sizes, listed in the order asked
    assert list(again) == shuffled
    assert again == sizes


def test_balancer_says_which_silos_narx_still_predicts_by_its_ema_warm_up() -> None:
    # Prepare: NARX with a warm-up of 4 reports (trained inline, deterministic)
    balancer = BatchSizeBalancer(
        initial_batch_size=16,
        knobs=BalancingKnobs(
            estimator="narx", estimator_options={"warmup": 4, "background": False}
        ),
    )
    report = SiloReport(batch_size=16, train_time=0.5)

    # Execute
    for _ in range(3):
        balancer.report("a", report)
    balancer.report("b", report)
    early = balancer.warming_up()
    balancer.report("a", report)  # a's 4th report: its network is trained
    later = balancer.warming_up()

    # Assert
    assert early == {"a": (3, 4), "b": (1, 4)}
    assert later == {"b": (1, 4)}


@settings(max_examples=300, deadline=None)
@given(
    rounds=st.lists(
        st.lists(st.tuples(st.integers(1, 200), st.floats(1e-4, 100.0)), min_size=3, max_size=3),
        min_size=2,
        max_size=12,
    )
)
def test_any_positive_reports_are_taken_and_keep_every_prediction_finite(
    rounds: list[list[tuple[int, float]]],
) -> None:
    # Prepare: whatever batch sizes and positive times three silos report, round by round
    # (steep lines learned at one batch size, then reports far below it, ...)
    from fl_lbbsp.core import BatchSizeBalancer, SiloReport

    balancer = BatchSizeBalancer(initial_batch_size=32)

    # Execute
    for reports in rounds:
        round_reports = zip("abc", reports, strict=True)
        balancer.report_round(
            {s: SiloReport(batch_size=b, train_time=t) for s, (b, t) in round_reports}
        )
        sizes = balancer.allocate(list("abc"))

    # Assert
    assert all(math.isfinite(balancer.predicted_speed(s) or math.nan) for s in "abc")
    assert sum(sizes.values()) == 96


def test_iterative_allocator_holds_the_sizes_of_a_restarted_silo_until_it_reports() -> None:
    # Prepare: two silos, the second 3x slower, three rounds of the iterative allocator
    balancer = BatchSizeBalancer(initial_batch_size=30, knobs=BalancingKnobs(allocator="iterative"))
    sizes = balancer.allocate(["fast", "slow"])
    for _ in range(3):
        for silo, per_sample in (("fast", 0.01), ("slow", 0.03)):
            balancer.report(
                silo, SiloReport(batch_size=sizes[silo], train_time=per_sample * sizes[silo])
            )
        sizes = balancer.allocate(["fast", "slow"])
    before = dict(sizes)

    # Execute: both report, then the slow silo's report is found to hold its start-up (a
    # rejoin) and its window is forgotten before the next allocation
    balancer.report("fast", SiloReport(batch_size=before["fast"], train_time=0.45))
    balancer.report("slow", SiloReport(batch_size=before["slow"], train_time=0.45))
    balancer.restart("slow")
    held = balancer.allocate(["fast", "slow"])

    # Assert: no step without the restarted silo's time; the same total
    assert held == before
    assert sum(held.values()) == 60
