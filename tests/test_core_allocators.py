"""Tests for the allocator registry (fl_lbbsp.core.allocation.allocators): allocators as
objects or names, their settings checked once, the one message for an unknown name, a
checkpoint of the settings before the registry, and a toy allocator added to it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from fl_lbbsp.core import BatchSizeBalancer, SiloReport
from fl_lbbsp.core.allocation.allocators import (
    ALLOCATORS,
    Allocator,
    Decision,
    Problem,
    registered,
    split_equally,
)
from fl_lbbsp.core.allocation.pipeline import Iterative, Linear, Proportional
from fl_lbbsp.core.settings import BalancingKnobs, Tuning
from fl_lbbsp.core.silo.estimators import parse_estimator
from fl_lbbsp.core.silo.state import EstimatorState

IDS = ["a", "b", "c"]
TIMES = {"a": 0.08, "b": 0.16, "c": 0.32}  # speeds 400, 200, 100 at batch size 32


def _run(knobs: BalancingKnobs, rounds: int = 3) -> tuple[BatchSizeBalancer, dict[str, int]]:
    """A balancer fed ``rounds`` rounds of the three silos at batch size 32."""
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=knobs)
    for _ in range(rounds):
        balancer.report_round({s: SiloReport(batch_size=32, train_time=TIMES[s]) for s in IDS})
    return balancer, balancer.allocate(IDS)


# ------------------------------------------------------------------ a toy allocator
class FastestShare(Allocator):
    """A toy allocator: the fastest silo gets ``share`` of the total, the others split
    the rest equally (one class, one registry entry)."""

    name = "toy-fastest-share"
    share: float = Field(default=0.5, gt=0, lt=1)

    def allocate(self, problem: Problem) -> Decision:
        ids, total = problem.ids, problem.bounds.total
        speeds = problem.table.speeds(ids)
        if speeds is None:
            return Decision.of(ids, split_equally(problem.bounds), "no-report")
        fastest = int(np.argmax(speeds))
        first = round(self.share * total)
        others, extra = divmod(total - first, len(ids) - 1)
        sizes = np.full(len(ids), others, dtype=np.int64)
        sizes[fastest] = first + extra
        return Decision.of(ids, sizes, self.name)


def test_a_toy_allocator_added_to_the_registry_drives_a_balancer_end_to_end() -> None:
    # Prepare / Execute: as an object, by its name, across a checkpoint round trip
    with registered(FastestShare):
        balancer, sizes = _run(BalancingKnobs(allocator=FastestShare(share=0.6)))
        restored = BatchSizeBalancer.from_json(balancer.to_json())
        named, by_name = _run(
            BalancingKnobs(allocator="toy-fastest-share", allocator_options={"share": 0.6})
        )
        with pytest.raises(ValueError, match="share"):
            BalancingKnobs(allocator="toy-fastest-share", allocator_options={"share": 2.0})
        assert "toy-fastest-share" in ALLOCATORS

    # Assert: its split and reason, kept across the round trip and by name; the registry
    # holds it no longer after the block
    assert sizes == by_name == {"a": 58, "b": 19, "c": 19}
    assert balancer.last_allocation["a"] == (58, "toy-fastest-share")
    assert restored.allocate(IDS) == sizes and restored.allocator == FastestShare(share=0.6)
    assert named.allocator == FastestShare(share=0.6)
    assert "toy-fastest-share" not in ALLOCATORS
    with pytest.raises(ValueError, match="unknown allocator 'toy-fastest-share'"):
        BalancingKnobs(allocator="toy-fastest-share")


# ------------------------------------------------------------- objects and names
@pytest.mark.parametrize(
    ("allocator", "name", "options"),
    [
        (Linear(), "linear", {}),
        (Proportional(), "proportional", {}),
        (Iterative(window=1, step=2), "iterative", {"window": 1, "step": 2}),
    ],
    ids=["linear", "proportional", "iterative"],
)
def test_an_allocator_object_and_its_name_give_the_same_decisions(
    allocator: Allocator, name: str, options: dict[str, Any]
) -> None:
    # Execute
    as_object, sizes = _run(BalancingKnobs(allocator=allocator, max_change_ratio=None))
    as_name, named = _run(
        BalancingKnobs(allocator=name, allocator_options=options, max_change_ratio=None)
    )

    # Assert: held as its name and settings, built back into the same object
    tuning = as_object.tuning
    assert tuning.allocator == name and tuning.allocator_options == allocator.model_dump()
    assert as_object.allocator == as_name.allocator == allocator
    assert sizes == named and sum(sizes.values()) == 96


@given(
    step=st.integers(1, 50),
    window=st.integers(1, 50),
    refast=st.none() | st.floats(1.01, 10.0),
)
def test_alg2_settings_survive_the_name_and_a_dump(
    step: int, window: int, refast: float | None
) -> None:
    # Prepare
    allocator = Iterative(step=step, window=window, refast_ratio=refast)

    # Execute
    tuning = Tuning.model_validate(Tuning(allocator=allocator).model_dump(mode="json"))

    # Assert
    assert tuning.batch_allocator() == allocator


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"allocator": "greedy"}, "unknown allocator 'greedy': must be one of"),
        ({"allocator": "linear", "allocator_options": {"step": 2}}, "linear allocator: step"),
        ({"allocator": "iterative", "allocator_options": {"window": 0}}, "window"),
        ({"allocator": Iterative(), "allocator_options": {"step": 2}}, "named by a string"),
        ({"allocator": 3}, "allocator"),
    ],
    ids=["unknown", "not-taken", "out-of-range", "object-and-options", "not-a-name"],
)
def test_a_bad_allocator_setting_is_refused_at_the_boundary(
    settings: dict[str, Any], message: str
) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        Tuning(**settings)


def test_an_unknown_estimator_gets_the_same_message_everywhere() -> None:
    # Execute: each boundary that takes an estimator's name
    raisers = [
        lambda: Tuning(estimator="kalman"),
        lambda: parse_estimator("kalman"),
        lambda: BatchSizeBalancer.from_state_dict(
            {"config": {"initial_batch_size": 8, "tuning": {"estimator": "kalman"}}, "silos": {}}
        ),
        lambda: EstimatorState(name="kalman"),
    ]
    messages = []
    for raise_it in raisers:
        with pytest.raises(ValueError) as caught:
            raise_it()
        messages.append(str(caught.value))

    # Assert: one wording, written in one place
    wanted = "unknown speed estimator 'kalman': must be one of ['change-ema', 'ema'"
    assert all(wanted in m for m in messages), messages


def test_a_state_from_before_the_registry_still_loads() -> None:
    # Prepare: a linear balancer's state as written before allocators were objects (Alg.
    # 2's default settings beside it, an empty Alg. 2 state)
    balancer, sizes = _run(BalancingKnobs())
    state = balancer.state_dict()
    state["config"]["tuning"]["allocator_options"] = {
        "step": 5, "window": 5, "fine_step": 1, "fine_window": 20, "memory_limit": 95.0,
        "refast_ratio": 1.5,
    }  # fmt: skip
    state["iterative"] = {
        "allocator": {"config": state["config"]["tuning"]["allocator_options"],
                      "phase": "fast", "sizes": {}, "times": [], "removable": None},
        "stepped": {},
    }  # fmt: skip

    # Execute
    restored = BatchSizeBalancer.from_state_dict(state)

    # Assert
    assert restored.allocator == Linear() and restored.tuning.allocator_options == {}
    assert restored.allocate(IDS) == sizes


def test_alg2_settings_given_as_before_are_taken() -> None:
    # Prepare: Alg. 2's settings as a model, as allocator_options took them before
    from fl_lbbsp.core.settings import IterativeSettings

    # Execute
    tuning = Tuning(allocator="iterative", allocator_options=IterativeSettings(window=1))

    # Assert
    assert tuning.batch_allocator() == Iterative(window=1)
