"""The run's log says when the noise budget holds fast silos down (they finish early by
design, not by a misprediction), once per change, and never without a budget."""

from __future__ import annotations

import logging
import re

import pytest

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.round.deadline import DeadlinePolicy
from fl_lbbsp.core.round.engine import RoundEngine
from fl_lbbsp.core.round.state import Verdict
from fl_lbbsp.core.settings import ReplyLimits, balancing_config
from fl_lbbsp.security.guard import guard

KEYS = RecordKeys()
TAU, B_INIT = 10, 32
SPEEDS: dict[int | str, float] = {
    1: 8000.0,
    2: 8000.0,
    3: 1000.0,
    4: 250.0,
}  # samples per second, node -> speed
SILOS: dict[int | str, str] = {1: "fast-a", 2: "fast-b", 3: "middle", 4: "slow"}


def _engine(**balancing: object) -> RoundEngine:
    engine = RoundEngine(
        config=balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1, **balancing),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
        deadline=DeadlinePolicy(margin=3.0, floor=0.01, ceiling=3600.0),
    )
    guard(engine)
    return engine


def _rounds(engine: RoundEngine, count: int) -> None:
    """``count`` rounds whose silos compute at :data:`SPEEDS` (injected times)."""
    for server_round in range(1, count + 1):
        state = engine.plan(server_round, list(SPEEDS))
        for node, ins in state.instructions.items():
            compute = ins.batch_size * TAU / SPEEDS[node]
            metrics = {
                KEYS.num_examples: 100,
                KEYS.train_time: compute,
                KEYS.batch_size: ins.batch_size,
                KEYS.samples_processed: ins.batch_size * TAU,
            }
            engine.report(state, Verdict(node=node, silo=SILOS[node]), metrics, observed=compute)
        engine.close(state, replied=list(SPEEDS), wall=1.0)


def test_a_binding_budget_is_said_once_naming_the_silos_it_holds_below_the_round_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare
    engine = _engine()

    # Execute: steady speeds, so the held silos do not change after the first allocation
    with caplog.at_level(logging.INFO, logger="fl_lbbsp"):
        _rounds(engine, 6)

    # Assert: named are the silos held below the round time, each with its batch and the
    # batch the predicted round time allows it, at least one sample more
    said = [r.getMessage() for r in caplog.records if "noise budget" in r.getMessage()]
    balancer = engine.balancer
    sizes = {silo: size for silo, (size, _) in balancer.last_allocation.items()}
    slowest = balancer.predicted_round_time(sizes)
    assert slowest is not None and len(said) == 1
    named = re.findall(r"'([\w-]+)' (\d+) of (\d+)", said[0])
    assert named
    for silo, size, allowed in named:
        a, b = balancer.cost_line(silo) or (0.0, 0.0)
        assert int(size) == sizes[silo] < int(allowed)
        assert a * int(allowed) + b <= slowest * (1 + 1e-9) < a * (int(allowed) + 1) + b
    assert "slow" not in {silo for silo, _, _ in named}


def test_no_line_without_a_budget(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: the paper's Alg. 1 (no noise budget)
    engine = _engine(noise_budget=None)

    # Execute
    with caplog.at_level(logging.INFO, logger="fl_lbbsp"):
        _rounds(engine, 6)

    # Assert
    assert not [r for r in caplog.records if "noise budget" in r.getMessage()]


def test_a_silo_whose_cost_line_is_flat_is_not_named_and_stops_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a fit that found no per-sample cost for one silo (a = 0: its time does not
    # depend on its batch size), the others as measured
    engine = _engine()
    fitted = engine.balancer.cost_line
    monkeypatch.setattr(
        engine.balancer,
        "cost_line",
        lambda silo: (0.0, 0.5) if silo == "fast-a" else fitted(silo),
    )

    # Execute: the rounds plan, report and close as before
    with caplog.at_level(logging.INFO, logger="fl_lbbsp"):
        _rounds(engine, 6)

    # Assert: the flat silo is never named (no batch size is "allowed" by a flat line)
    said = " ".join(r.getMessage() for r in caplog.records if "noise budget" in r.getMessage())
    assert "'fast-a'" not in said
