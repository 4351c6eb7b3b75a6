"""Tests for Alg. 2 (iterative leader/straggler tuning) on the GPU-shaped cost model."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.clients.emulation import CostModel, OutOfMemoryError
from fl_lbbsp.core import BatchSizeBalancer, SiloReport
from fl_lbbsp.core.allocation.iterative import IterativeAllocator
from fl_lbbsp.core.settings import BalancingKnobs

BASE = CostModel(per_sample=0.002, fixed=0.02, floor=0.05, max_batch_size=400)
CAPACITIES = {"w0": 1.0, "w1": 2.0, "w2": 4.0, "w3": 4.0}  # slowdown factors: 4:2:1:1


def _iterate(
    allocator: IterativeAllocator,
    models: dict[str, CostModel],
    iterations: int,
    *,
    change: tuple[int, str, CostModel] | None = None,
) -> list[tuple[dict[str, int], float, str]]:
    """Run Alg. 2 against cost models; (sizes, max/min time, phase) per iteration."""
    trace = []
    for it in range(1, iterations + 1):
        if change is not None and it == change[0]:
            models = {**models, change[1]: change[2]}
        sizes = dict(allocator.sizes)
        times = {w: models[w].time(sizes[w]) for w in models}
        trace.append((sizes, max(times.values()) / min(times.values()), allocator.phase))
        allocator.update(times)
    return trace


def _moved(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(abs(after[w] - before[w]) for w in before) // 2


def test_alg2_reaches_balance_within_60_iterations_and_then_holds_still() -> None:
    # Prepare: 4 workers of capacities 4:2:1:1, all starting at 64
    models = {w: BASE.scaled(k) for w, k in CAPACITIES.items()}
    allocator = IterativeAllocator(refast_ratio=None)  # the paper's Alg. 2 exactly
    allocator.reset({w: 64 for w in models})

    # Execute
    trace = _iterate(allocator, models, 160)

    # Assert: settled at <= 1.10 in the fine phase within 60 iterations and from then
    # on; the fine phase moves at most 1 sample per iteration
    first = next(
        k for k, (_, ratio, phase) in enumerate(trace) if ratio <= 1.10 and phase == "fine"
    )
    assert first < 60
    assert all(ratio <= 1.10 for _, ratio, _ in trace[first:])
    assert all(sum(sizes.values()) == 256 for sizes, _, _ in trace)
    for (before, _, phase), (after, _, _) in zip(trace, trace[1:], strict=False):
        if phase == "fine":
            assert _moved(before, after) <= 1
    assert trace[-1][2] == "fine"


@pytest.mark.parametrize("refast_ratio", [1.5, None])
def test_alg2_finds_a_new_equilibrium_after_a_capacity_change(refast_ratio: float | None) -> None:
    # Prepare: settle first
    models = {w: BASE.scaled(k) for w, k in CAPACITIES.items()}
    allocator = IterativeAllocator(refast_ratio=refast_ratio)
    allocator.reset({w: 64 for w in models})
    _iterate(allocator, models, 80)
    settled = dict(allocator.sizes)

    # Execute: w1 becomes 3x slower (k = 2 -> 6)
    trace = _iterate(allocator, models, 400, change=(1, "w1", BASE.scaled(6.0)))

    # Assert: balanced again, with w1's batch cut and the total kept
    final_sizes, final_ratio, _ = trace[-1]
    assert trace[0][1] > 2.5
    assert final_ratio <= 1.10
    assert final_sizes["w1"] < settled["w1"] / 2
    assert sum(final_sizes.values()) == 256
    if refast_ratio is not None:
        recovered = next(k for k, (_, ratio, _) in enumerate(trace) if ratio <= 1.10)
        assert recovered <= 60


def test_straggler_at_or_below_the_step_is_named_and_kept(caplog) -> None:
    # Prepare: w1 is hopelessly slow with 5 samples, step 5
    allocator = IterativeAllocator()
    allocator.reset({"w0": 59, "w1": 5})

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        for _ in range(6):
            sizes = allocator.update({"w0": 0.1, "w1": 10.0})

    # Assert: nothing moves, one warning naming w1
    assert sizes == {"w0": 59, "w1": 5}
    warnings = [r for r in caplog.records if "w1" in r.getMessage()]
    assert len(warnings) == 1
    assert "remove" in warnings[0].getMessage()
    assert allocator.removable == "w1"


def test_worker_short_of_memory_is_never_the_leader() -> None:
    # Prepare: w0 is fastest but at 97% memory; w1 is next
    allocator = IterativeAllocator(window=1)
    allocator.reset({"w0": 40, "w1": 40, "w2": 40})

    # Execute
    sizes = allocator.update(
        {"w0": 0.1, "w1": 0.2, "w2": 0.9}, memory={"w0": 97.0, "w1": 50.0, "w2": 50.0}
    )

    # Assert
    assert sizes == {"w0": 40, "w1": 45, "w2": 35}


def test_worker_at_its_cap_is_never_the_leader() -> None:
    allocator = IterativeAllocator(window=1)
    allocator.reset({"w0": 40, "w1": 40, "w2": 40})

    sizes = allocator.update({"w0": 0.1, "w1": 0.2, "w2": 0.9}, upper={"w0": 42})

    assert sizes == {"w0": 40, "w1": 45, "w2": 35}


def test_update_rejects_times_of_other_workers() -> None:
    allocator = IterativeAllocator()
    allocator.reset({"a": 10, "b": 10})
    with pytest.raises(ValueError, match="allocation is for"):
        allocator.update({"a": 1.0, "c": 1.0})


@pytest.mark.parametrize(
    "kwargs",
    [{"step": 0}, {"window": -1}, {"fine_window": 2.5}, {"memory_limit": 0}, {"refast_ratio": 1}],
    ids=["step", "window", "fine-window", "memory", "refast"],
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        IterativeAllocator(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    factors=st.lists(st.floats(1.0, 8.0), min_size=2, max_size=6),
    start=st.integers(8, 80),
)
def test_total_and_minimum_hold_on_any_cost_models(factors: list[float], start: int) -> None:
    # Prepare
    models = {f"w{k}": BASE.model_copy(update={"max_batch_size": None}).scaled(f)
              for k, f in enumerate(factors)}  # fmt: skip
    allocator = IterativeAllocator()
    allocator.reset({w: start for w in models})

    # Execute
    trace = _iterate(allocator, models, 60)

    # Assert
    for sizes, _, _ in trace:
        assert sum(sizes.values()) == start * len(factors)
        assert min(sizes.values()) >= 1


def test_state_round_trips_through_json() -> None:
    # Prepare
    models = {w: BASE.scaled(k) for w, k in CAPACITIES.items()}
    allocator = IterativeAllocator()
    allocator.reset({w: 64 for w in models})
    _iterate(allocator, models, 30)

    # Execute
    restored = IterativeAllocator.from_state(json.loads(json.dumps(allocator.state())))

    # Assert: the same decisions from here on
    assert restored.state() == allocator.state()
    assert _iterate(restored, models, 20) == _iterate(allocator, models, 20)


def test_state_keeps_the_straggler_that_cannot_give_more() -> None:
    # Prepare: w1 is the straggler with a batch at the step (already warned about)
    allocator = IterativeAllocator()
    allocator.reset({"w0": 59, "w1": 5})
    allocator.update({"w0": 0.1, "w1": 10.0})

    # Execute
    restored = IterativeAllocator.from_state(json.loads(json.dumps(allocator.state())))

    # Assert: a restored allocator does not warn about it again
    assert allocator.removable == restored.removable == "w1"


def test_balancer_runs_alg2_once_per_round_of_fresh_reports() -> None:
    # Prepare
    models = {w: BASE.scaled(k) for w, k in CAPACITIES.items()}
    balancer = BatchSizeBalancer(
        initial_batch_size=64,
        knobs=BalancingKnobs(allocator="iterative", allocator_options={"window": 1}),
    )
    ids = list(models)
    first = balancer.allocate(ids)
    for w in ids:
        balancer.report(w, SiloReport(batch_size=64, train_time=models[w].time(64)))

    # Execute: the first reports warm-start from the speed-proportional split, then
    # one Alg. 2 step per round; asking twice in a round changes nothing
    second = balancer.allocate(ids)
    assert balancer.allocate(ids) == second
    for w in ids:
        balancer.report(w, SiloReport(batch_size=second[w], train_time=models[w].time(second[w])))
    third = balancer.allocate(ids)
    restored = BatchSizeBalancer.from_json(balancer.to_json())

    # Assert
    assert first == {w: 64 for w in ids}
    assert sum(second.values()) == sum(third.values()) == 256
    assert second["w0"] > second["w1"] > second["w2"]
    assert _moved(second, third) <= 5
    assert restored.allocate(ids) == third


def test_cost_model_has_the_gpu_shape() -> None:
    # Prepare
    model = CostModel.parse("0.01,0.1,0.5,100")

    # Execute / Assert: floor while unsaturated, linear beyond, OOM above the cap
    assert model.time(10) == 0.5
    assert model.time(100) == pytest.approx(1.1)
    assert model.scaled(2.0).time(100) == pytest.approx(2.2)
    with pytest.raises(OutOfMemoryError, match="101"):
        model.time(101)


@pytest.mark.parametrize("text", ["", "x", "0.1,a", "1,2,3,4,5", "-1", "0.1,0,0,0"])
def test_cost_model_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError):
        CostModel.parse(text)
