"""The balancer's parts on their own: the one change detector (and the change-aware EMA
over it, against the EMA's earlier algorithm), the shared slowdown, the allocation
pipeline's steps and reasons (the hold step included), one silo's model over named
fields, and the DDP gate's window tally and automatic k. Times are injected."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core import BatchSizeBalancer, ChangeAwareEMA, Predictor, SiloReport
from fl_lbbsp.core.allocation.pipeline import ALLOCATION_REASONS, hold
from fl_lbbsp.core.settings import BalancingKnobs
from fl_lbbsp.core.silo.detector import new_runs, observe_run
from fl_lbbsp.core.silo.model import ROW, SiloModel
from fl_lbbsp.core.slowdown import shared_slowdown
from fl_lbbsp.distributed.gate import WindowTally, auto_every


def _detect(
    deviations: list[float], *, confirm: int = 2, width: int = 20, floor: float = 0.0
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Each deviation's verdict from the one change detector (a silo's run, a table of
    one row; limit 0.2), and the run after them."""
    run, row = new_runs(1, width), np.zeros(1, dtype=np.intp)
    verdicts = []
    for d in deviations:
        held = abs(d) > 0.2
        entry = (np.array([32.0]), np.array([1.0]), np.array([32.0]), np.array([d]))
        change = observe_run(
            run, row, entry, np.array([held]), limit=0.2, floor=floor, confirm=confirm
        )[0]
        verdicts.append("change" if change else "held" if held else "normal")
    return verdicts, run


# ---------------------------------------------------------------- change detector
@pytest.mark.parametrize(
    ("deviations", "verdicts"),
    [
        ([0.5, 0.0], ["held", "normal"]),  # a spike, then back: nothing confirmed
        ([0.5, 0.5], ["held", "change"]),  # two held to the same side confirm
        ([0.5, -0.5, -0.5], ["held", "held", "change"]),  # the other side restarts the run
        ([0.1, 0.1], ["normal", "normal"]),  # within the limit
    ],
)
def test_the_detector_confirms_a_run_of_held_deviations_to_one_side(
    deviations: list[float], verdicts: list[str]
) -> None:
    # Execute: a run of 2 (no CUSUM test)
    seen, _ = _detect(deviations, width=2)

    # Assert
    assert seen == verdicts


def test_the_detector_keeps_only_the_confirming_observations() -> None:
    # Execute
    verdicts, run = _detect([0.05, 0.6, 0.6])

    # Assert: the two held ones, not the normal one before them
    assert verdicts == ["normal", "held", "change"]
    assert run["dev"][0, : run["n"][0]].tolist() == [0.6, 0.6]


@pytest.mark.parametrize("zero", [0.0, 2.2e-16, -2.2e-16, 1e-12])
def test_a_deviation_at_rounding_of_zero_lies_on_the_level_whichever_its_sign(
    zero: float,
) -> None:
    # Prepare: a step hidden in the noise to one side, broken by the round's median silo
    # (whose deviation is zero in exact arithmetic, its computed sign the CPU's last bit)
    deviations = [-0.18, -0.18, zero, -0.18, -0.18]

    # Execute
    verdicts, run = _detect(deviations, width=20, floor=0.1)

    # Assert: the zero ends the run on either side, so the verdicts and the run left
    # behind do not depend on its sign
    assert verdicts == ["normal", "normal", "normal", "normal", "normal"]
    assert run["dev"][0, : run["n"][0]].tolist() == [-0.18, -0.18]


@pytest.mark.parametrize(("width", "last"), [(20, "change"), (2, "normal")])
def test_the_cusum_test_confirms_a_step_hidden_in_the_noise(width: int, last: str) -> None:
    # Execute: deviations below the single-report limit, all to one side; a run no
    # longer than confirm takes no CUSUM test
    verdicts, _ = _detect([0.18] * 3, width=width, floor=0.1)

    # Assert
    assert verdicts[-1] == last and verdicts[:2] == ["normal", "normal"]


def _old_change_ema(
    speeds: list[float], alpha: float, threshold: float, confirm: int
) -> list[tuple[float | None, list[float]]]:
    """The change-aware EMA's algorithm before it used the shared detector."""
    value: float | None = None
    pending: list[float] = []
    out: list[tuple[float | None, list[float]]] = []
    for v in speeds:
        if value is None:
            value = v
        else:
            deviation = (v - value) / value
            if abs(deviation) <= threshold:
                pending.clear()
                value = alpha * v + (1.0 - alpha) * value
            else:
                if pending and (pending[-1] > value) != (v > value):
                    pending.clear()
                pending.append(v)
                if len(pending) >= confirm:
                    value = math.fsum(pending) / len(pending)
                    pending.clear()
        out.append((value, list(pending)))
    return out


@settings(max_examples=200, deadline=None)
@given(
    speeds=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=30),
    alpha=st.floats(0.05, 1.0),
    threshold=st.floats(0.01, 1.0),
    confirm=st.integers(1, 4),
)
def test_the_change_aware_ema_behaves_as_before_over_the_shared_detector(
    speeds: list[float], alpha: float, threshold: float, confirm: int
) -> None:
    # Prepare
    estimator = Predictor(ChangeAwareEMA(alpha=alpha, threshold=threshold, confirm=confirm))
    expected = _old_change_ema(speeds, alpha, threshold, confirm)

    # Execute
    seen = []
    for v in speeds:
        estimator.update(v)
        seen.append((estimator.predict(), estimator.state()["pending"]))

    # Assert: the same average and the same pending observations after every update
    assert [p for _, p in seen] == [p for _, p in expected]
    assert [v for v, _ in seen] == pytest.approx([v for v, _ in expected], rel=1e-12)


# ---------------------------------------------------------------- shared slowdown
@pytest.mark.parametrize(
    ("levels", "lines", "factor"),
    [
        ([1.0, 1.0, 1.0, None], [None, None, None, 9.0], 1.5),  # three levels: their median
        ([1.0, None, None], [None, 1.0, 1.0], 1.5),  # lines stand in, beyond the threshold
        ([1.0, None, None], [None, 1.4, 1.4], 1.0),  # lines within the threshold: nothing
        ([1.0, None], [None, 1.0], 1.0),  # fewer than 3 silos to judge by
    ],
)
def test_the_shared_slowdown_is_the_median_deviation(
    levels: list[float | None], lines: list[float | None], factor: float
) -> None:
    # Prepare: every silo reports 1.5 s
    times = [1.5] * len(levels)

    # Execute
    seen = shared_slowdown(times, levels, lines, threshold=0.2)

    # Assert
    assert seen == pytest.approx(factor)


# ---------------------------------------------------------------- the pipeline
def _fed(balancer: BatchSizeBalancer, a: list[float], rounds: int = 4) -> dict[str, int]:
    ids = [f"s{k}" for k in range(len(a))]
    sizes = balancer.allocate(ids)
    for _ in range(rounds):
        reports = {i: SiloReport(batch_size=sizes[i], train_time=a[k] * sizes[i])
                   for k, i in enumerate(ids)}  # fmt: skip
        balancer.report_round(reports)
        sizes = balancer.allocate(ids)
    return sizes


def test_held_sizes_are_kept_and_nothing_else_runs() -> None:
    # Prepare: an iterative balancer (whose step is stateful) after a few rounds
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(allocator="iterative"))
    sizes = _fed(balancer, [0.01, 0.02, 0.04])
    before = balancer.to_json()
    held = {silo: size + 1 for silo, size in sizes.items()}

    # Execute
    given_ = balancer.allocate(list(held), held=held)

    # Assert: the held sizes, reason "held", the state untouched
    assert given_ == held
    assert {why for _, why in balancer.last_allocation.values()} == {"held"}
    assert balancer.to_json() == before


def test_a_hold_without_a_size_for_every_silo_is_refused() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="no size held"):
        hold(["a", "b"], {"a": 3})


@pytest.mark.parametrize(
    ("options", "cap", "reason"),
    [
        ({"max_change_ratio": None}, 40, "memory-cap"),
        ({"max_change_ratio": None, "max_batch_size": 40}, None, "max-batch-size"),
        ({}, None, "change-limit"),
    ],
)
def test_each_silo_carries_the_bound_that_bound_it(
    options: dict[str, object], cap: int | None, reason: str
) -> None:
    # Prepare: silo s0 is 8 times faster than the others
    balancer = BatchSizeBalancer(
        initial_batch_size=32, knobs=BalancingKnobs(noise_budget=None, **options)
    )
    ids = ["s0", "s1", "s2"]
    for silo, a in zip(ids, [0.001, 0.008, 0.008], strict=True):
        balancer.report(silo, SiloReport(batch_size=32, train_time=a * 32, max_batch_size=cap
                                         if silo == "s0" else None))  # fmt: skip

    # Execute
    balancer.allocate(ids)

    # Assert
    assert balancer.last_allocation["s0"][1] == reason
    assert {why for _, why in balancer.last_allocation.values()} <= set(ALLOCATION_REASONS)


# ---------------------------------------------------------------- one silo's model
def test_a_silo_model_round_trips_its_state_over_named_fields() -> None:
    # Prepare
    balancer = BatchSizeBalancer(initial_batch_size=32)
    _fed(balancer, [0.01, 0.02, 0.04], rounds=6)
    model = balancer._silos["s1"]

    # Execute
    copy = SiloModel.model_validate(model.state())

    # Assert: the same state, and the table's row read by field name
    assert copy.state() == model.state()
    assert set(ROW.names or ()) >= {"slope", "intercept", "fixed", "knee", "cap", "last", "boost"}
    line = balancer.cost_line("s1")
    assert line is not None and line[0] == pytest.approx(0.02, rel=0.05)


# ---------------------------------------------------------------- the DDP gate's helpers
def test_the_window_tally_sums_an_iterations_figures() -> None:
    # Prepare
    tally = WindowTally()

    # Execute
    tally.add(0.5, 32, 0.0)
    tally.add(1.5, 16, 2.0)

    # Assert
    assert (tally.time, tally.square, tally.samples, tally.iterations, tally.wall) == (
        2.0, 2.5, 48, 2, 2.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("cost", "wall", "count", "expected"),
    [(0.01, 1.0, 10, 10), (1.0, 1.0, 10, 100), (0.0, 1.0, 10, 7), (0.01, 0.0, 10, 7)],
)
def test_auto_every_keeps_the_exchange_within_its_share(
    cost: float, wall: float, count: int, expected: int
) -> None:
    # Execute
    k = auto_every(cost, wall, count, 0.01, 100, 7)

    # Assert: cost / (share * wall per iteration), at most 100; 7 (the current) if unknown
    assert k == expected
