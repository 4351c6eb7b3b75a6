"""Deadlines follow the plan and never compound: a silo that replies late for its own
reasons (at 0.9x every deadline it is given) cannot stretch every later round, and a
silo's first round (its cold start) teaches no messaging overhead. Times are injected."""

from __future__ import annotations

import pytest

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.round.deadline import DeadlinePolicy
from fl_lbbsp.core.round.engine import RoundEngine
from fl_lbbsp.core.round.state import Verdict
from fl_lbbsp.core.settings import ReplyLimits, balancing_config
from fl_lbbsp.security.guard import guard

KEYS = RecordKeys()
TAU, B_INIT = 10, 16
SPEEDS = {1: 1000.0, 2: 500.0, 3: 250.0}  # samples per second, node -> speed
MESSAGING = 0.05  # seconds every honest reply spends beyond its compute


def _engine(**balancing: object) -> RoundEngine:
    engine = RoundEngine(
        config=balancing_config(
            initial_batch_size=B_INIT, local_steps=TAU, lr=0.1, **{"check_times": True, **balancing}
        ),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
        deadline=DeadlinePolicy(margin=3.0, floor=0.01, ceiling=3600.0),
    )
    guard(engine)
    return engine


def _round(engine: RoundEngine, server_round: int, *, late: int | None) -> float | None:
    """Plan a round, have every silo reply (node ``late`` at 0.9x the deadline, whatever
    its compute), close it; the round's deadline."""
    state = engine.plan(server_round, list(SPEEDS))
    deadline = state.deadline
    observed = {}
    for node, ins in state.instructions.items():
        compute = ins.batch_size * TAU / SPEEDS[node]
        seen = compute + MESSAGING
        if node == late and deadline is not None:
            seen = 0.9 * deadline
        observed[node] = seen
        metrics = {
            KEYS.num_examples: 100,
            KEYS.train_time: compute,
            KEYS.batch_size: ins.batch_size,
            KEYS.samples_processed: ins.batch_size * TAU,
        }
        engine.report(state, Verdict(node=node, silo=str(node)), metrics, observed=seen)
    engine.close(state, replied=list(SPEEDS), wall=max(observed.values()))
    return deadline


@pytest.mark.parametrize("late", [1, 3])
def test_a_silo_late_for_its_own_reasons_cannot_stretch_the_deadline(late: int) -> None:
    # Prepare
    engine = _engine()

    # Execute: 16 rounds, one silo always replying at 0.9x its deadline
    deadlines = [_round(engine, r, late=late) for r in range(1, 17)]

    # Assert: from round 5 on the deadline is flat: no growth round over round (it grew
    # 2.7x every two rounds without bound), and far under the ceiling
    settled = [d for d in deadlines[4:] if d is not None]
    assert max(settled) <= 1.01 * min(settled)
    assert max(settled) < 10.0


def test_the_deadline_is_capped_relative_to_the_ideal_round() -> None:
    # Prepare
    policy = DeadlinePolicy(margin=3.0, floor=0.5, ceiling=3600.0, ideal_multiple=10.0)

    # Execute / Assert: a plan predicted at 100 s whose ideal split takes 2 s waits 20 s
    assert policy.timeout(100.0, ideal=2.0) == pytest.approx(20.0)
    assert policy.timeout(1.0, ideal=2.0) == pytest.approx(3.0)
    assert policy.timeout(100.0, ideal=0.01) == pytest.approx(0.5)  # never below the floor


def test_a_cold_first_round_teaches_no_overhead_but_bounds_the_next_deadline() -> None:
    # Prepare: round 1's replies take 30 s beyond their compute (process start-up)
    engine = _engine()
    state = engine.plan(1, list(SPEEDS))
    for node, ins in state.instructions.items():
        compute = ins.batch_size * TAU / SPEEDS[node]
        metrics = {
            KEYS.num_examples: 100,
            KEYS.train_time: compute,
            KEYS.batch_size: ins.batch_size,
        }
        engine.report(state, Verdict(node=node, silo=str(node)), metrics, observed=compute + 30.0)

    # Execute
    engine.close(state, replied=list(SPEEDS), wall=31.0)
    following = engine.plan(2, list(SPEEDS))

    # Assert: nothing learned, yet round 2 may take as long as round 1 did (a ClientApp
    # process started per round pays much of that start-up again): 3 x 31 s
    assert engine.overhead.predict() == 0.0
    assert following.deadline == pytest.approx(3 * 31.0)


def test_a_silo_far_slower_than_its_floor_allows_is_reported_once_and_not_waited_for(
    fl_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: every silo held at B_init by the floor; silo 3 is 20x slower than the others
    engine = _engine(min_batch_size=B_INIT)
    speeds = {1: 1000.0, 2: 1000.0, 3: 50.0}
    deadlines = []

    # Execute: 6 rounds
    for server_round in range(1, 7):
        state = engine.plan(server_round, list(speeds))
        deadlines.append((state.deadline, set(state.slow)))
        for node, ins in state.instructions.items():
            metrics = {
                KEYS.num_examples: 100,
                KEYS.train_time: ins.batch_size * TAU / speeds[node],
                KEYS.batch_size: ins.batch_size,
                KEYS.samples_processed: ins.batch_size * TAU,
            }
            engine.report(state, Verdict(node=node, silo=str(node)), metrics)
        engine.close(state, replied=list(speeds), wall=None)

    # Assert: once it has been held at its floor and far slower for 3 plans (rounds 2-4),
    # the deadline is the others' (3 x 0.16 s), not its 3.2 s; until then it is capped at
    # 10x the ideal round (the total work over the predicted speeds) and not its 3 x 3.2 s;
    # one warning for it in all the rounds
    ideal = TAU * 3 * B_INIT / sum(speeds.values())
    for deadline, slow in deadlines[1:3]:
        assert slow == set() and deadline == pytest.approx(10 * ideal)
    for deadline, slow in deadlines[3:]:
        assert slow == {"3"} and deadline == pytest.approx(3 * B_INIT * TAU / 1000.0)
    warnings = {id(r) for r in fl_log.records if "silo 3 is predicted" in r.getMessage()}
    assert len(warnings) == 1


def test_a_time_liar_is_caught_by_round_2_despite_a_cold_first_round() -> None:
    # Prepare: silo 3 claims 1/1000 of its compute; round 1 holds 30 s of start-up for all
    engine = _engine()
    caught = []

    # Execute
    for server_round, startup in ((1, 30.0), (2, 0.0)):
        state = engine.plan(server_round, list(SPEEDS))
        for node, ins in state.instructions.items():
            compute = ins.batch_size * TAU / SPEEDS[node]
            claim = compute / 1000 if node == 3 else compute
            metrics = {
                KEYS.num_examples: 100,
                KEYS.train_time: claim,
                KEYS.batch_size: ins.batch_size,
            }
            seen = compute + MESSAGING + startup
            engine.report(state, Verdict(node=node, silo=str(node)), metrics, observed=seen)
        engine.close(state, replied=list(SPEEDS), wall=None)
        caught.append("claimed-train-time" in state.reports["3"])

    # Assert: not judged on the cold round alone, caught on the first warm one, and its
    # time replaced by what the server saw (its real compute, within the messaging)
    assert caught == [False, True]
    replaced = state.reports["3"][KEYS.train_time]
    compute = state.instructions[3].batch_size * TAU / SPEEDS[3]
    assert replaced == pytest.approx(compute, rel=0.2)
