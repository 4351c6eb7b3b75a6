"""Bounded claims (issue 16, item 2) with injected times (no clock, no Ray): a 1000x-fast
liar measured against the true round time, a num-examples grab, a changed num-examples,
he-time = 10^6 and the deadline, absurd train-times, the observation switched off, and a
property over random federations (a liar gains at most the tolerance)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.contract import SLOWDOWN, RecordKeys
from fl_lbbsp.core.round.engine import RoundEngine
from fl_lbbsp.core.round.rewriters import FastestReplies
from fl_lbbsp.core.round.state import RoundState, Verdict
from fl_lbbsp.core.settings import CLAIM_SETTINGS, BalancingConfig, ReplyLimits, balancing_config
from fl_lbbsp.security.claims import ClaimChecker
from fl_lbbsp.security.guard import guard

KEYS = RecordKeys()
B_INIT, TAU = 32, 5
COST = 0.001  # seconds per sample on the fastest silo (k = 1)
FIXED = 0.002  # seconds of per-round compute that does not depend on B
MESSAGING = 0.01  # seconds between the silo's compute and the server's observation
CAPACITIES = (1.0, 1.0, 2.0, 3.0, 5.0)  # k_i: silo i is k_i times slower than the fastest


# ------------------------------------------------------------------------ helpers
def _engine(**balancing: Any) -> RoundEngine:
    engine = RoundEngine(
        config=balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1, **balancing),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
    )
    guard(engine)
    return engine


def _metrics(size: int, seconds: float, *, num_examples: Any = 100, **extra: Any) -> dict[str, Any]:
    return {
        KEYS.num_examples: num_examples,
        KEYS.train_time: seconds,
        KEYS.batch_size: size,
        KEYS.samples_processed: size * TAU,
        **extra,
    }


def _report(
    engine: RoundEngine, state: RoundState, node: int, metrics: Mapping[str, Any], **kw: Any
) -> bool:
    return engine.report(state, Verdict(node=node, silo=f"silo-{node}"), metrics, **kw)


def _true_time(k: float, size: int) -> float:
    """The emulated silo's true compute time: k_i * B_i * tau * cost + fixed."""
    return k * size * TAU * COST + FIXED


def _federation(
    engine: RoundEngine,
    capacities: tuple[float, ...],
    *,
    rounds: int,
    liar: int | None = None,
    factor: float = 1000.0,
    observe: bool = True,
) -> tuple[list[float], list[dict[int, int]]]:
    """Run ``rounds`` emulated rounds: each silo's true time is ``_true_time``; the liar
    reports it divided by ``factor``; the engine is given the observed time (true time
    plus messaging) when ``observe``. Returns the true round times (max true time) and
    the batch sizes of every round."""
    round_times, sizes = [], []
    for server_round in range(1, rounds + 1):
        state = engine.plan(server_round, range(len(capacities)))
        truth = {}
        for node, instruction in state.instructions.items():
            size = instruction.batch_size
            truth[node] = _true_time(capacities[int(node)], size)
            claim = truth[node] / factor if node == liar else truth[node]
            observed = truth[node] + MESSAGING if observe else None
            _report(engine, state, int(node), _metrics(size, claim), observed=observed)
        engine.close(state, replied=list(truth), wall=max(truth.values()) + MESSAGING)
        round_times.append(max(truth.values()))
        sizes.append({int(n): i.batch_size for n, i in state.instructions.items()})
    return round_times, sizes


# ------------------------------------------------------------------ the fast liar
@pytest.mark.parametrize("liar", [4, 0], ids=["slowest-lies", "fastest-lies"])
@pytest.mark.parametrize("allocator", ["linear", "proportional"])
def test_a_1000x_fast_liar_does_not_slow_the_rounds(liar: int, allocator: str) -> None:
    # Prepare: the honest run and the run with one silo reporting train-time / 1000
    honest, _ = _federation(_engine(allocator=allocator), CAPACITIES, rounds=8)

    # Execute
    lied, sizes = _federation(_engine(allocator=allocator), CAPACITIES, rounds=8, liar=liar)

    # Assert: from round 3 on the true round time is within 1.2x the honest run's
    for server_round in range(3, 9):
        assert lied[server_round - 1] <= 1.2 * honest[server_round - 1], (server_round, sizes)


def test_without_observations_the_liar_takes_over() -> None:
    # Prepare: the same liar, nothing observed (the in-process emulation)
    honest, _ = _federation(_engine(), CAPACITIES, rounds=8)

    # Execute
    lied, sizes = _federation(_engine(), CAPACITIES, rounds=8, liar=4, observe=False)

    # Assert: the attack the observation stops; the change limit still bounds the first
    # report's effect (round 2: at most max_change_ratio * B_init)
    assert sizes[1][4] <= 2 * B_INIT
    assert lied[-1] > 2 * honest[-1]


def test_check_times_off_ignores_the_observation() -> None:
    # Prepare
    engine = _engine(check_times=False)
    state = engine.plan(1, [0])

    # Execute: a claim 1000 times below the observation
    _report(engine, state, 0, _metrics(B_INIT, 0.001), observed=1.0)

    # Assert: believed as claimed, nothing observed on the record
    assert state.reports["silo-0"][KEYS.train_time] == 0.001
    assert "observed-time" not in state.reports["silo-0"]


@pytest.mark.parametrize(
    ("claimed", "he", "observed", "expected_train", "expected_he"),
    [
        (0.001, None, 1.0, 1.0, None),  # far below: the observation (an overhead of 0)
        (0.6, None, 1.0, 0.6, None),  # within the tolerance: believed
        (5.0, None, 1.0, 1.0, None),  # far above the wall time: cut to it
        (0.5, 1e6, 1.0, 0.5, 0.5),  # he-time far above: the rest of the wall time
        (0.001, 0.001, 1.0, 0.999, 0.001),  # far below: the missing time is train-time
    ],
    ids=["below", "within", "above", "he-above", "he-below"],
)
def test_a_contradicted_claim_is_replaced_by_the_observation(
    claimed: float,
    he: float | None,
    observed: float,
    expected_train: float,
    expected_he: float | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: a round taught the checker a messaging overhead of 0
    checker = ClaimChecker()
    checker.learn_overhead([0.0])

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        checked = checker.check_times(claimed, he, observed=observed)

    # Assert
    assert checked.train_time == pytest.approx(expected_train)
    assert checked.he_time == pytest.approx(expected_he)
    assert (checked.note is None) == (expected_train == claimed and expected_he == he)


@pytest.mark.parametrize(
    ("gaps", "expected"),
    [
        ([0.01, 0.01, 0.012, 1.0], 0.012),  # one liar of 4: the second largest
        ([0.01, 1.0], 0.01),  # one of 2: the smaller
        ([0.5], 0.5),
        ([0.01] * 7 + [1.0, 2.0, 3.0], 0.01),  # three of 10: the fourth largest
        ([-0.2, 0.01, 0.02], 0.01),
    ],
)
def test_the_learned_overhead_is_the_largest_honest_gap(gaps: list[float], expected: float) -> None:
    # Prepare
    checker = ClaimChecker()

    # Execute
    checker.learn_overhead(gaps)

    # Assert: the liars do not move it; a claim net of it is checked
    assert checker.overhead.predict() == pytest.approx(expected)
    assert checker.check_times(0.2, None, observed=0.211).note is None


def test_before_any_overhead_is_learned_no_claim_is_judged_too_small() -> None:
    # Prepare: nothing learned (a first round: its wall times hold cold starts)
    checker = ClaimChecker()

    # Execute
    below = checker.check_times(0.001, None, observed=30.0, silo="x")
    above = checker.check_times(90.0, None, observed=30.0, silo="x")

    # Assert: the claim below is believed and counts no strike; one above the wall time
    # is impossible whatever the overhead, and is cut
    assert below.train_time == 0.001 and below.note is None
    assert above.train_time == 30.0 and above.note is not None
    assert not checker.contradicted and not checker.distrusted


def test_one_contradicted_round_then_a_consistent_one_brands_no_silo() -> None:
    # Prepare: an overhead of 0.01 s learned
    checker = ClaimChecker()
    checker.learn_overhead([0.01])

    # Execute: one round's start-up spike, then a consistent round, then another spike
    spike = checker.check_times(0.1, None, observed=5.0, silo="x")
    checker.check_times(0.1, None, observed=0.12, silo="x")
    checker.check_times(0.1, None, observed=5.0, silo="x")
    later = checker.check_times(0.1, None, observed=0.15, silo="x")

    # Assert: each spike replaced for its round only; x is still believed
    assert spike.note is not None and later.note is None and later.train_time == 0.1
    assert checker.distrusted == set()


def test_a_silo_caught_lying_is_timed_by_the_server_from_then_on() -> None:
    # Prepare: an overhead of 0.01 s learned; silo x caught claiming 1 ms of 1 s in two
    # rounds in a row (strikes, default 2)
    checker = ClaimChecker()
    checker.learn_overhead([0.01])
    checker.check_times(0.001, None, observed=1.0, silo="x")
    checker.check_times(0.001, None, observed=1.0, silo="x")

    # Execute: both claim 0.6 s of 1 s, within the tolerance
    x = checker.check_times(0.6, None, observed=1.0, silo="x")
    y = checker.check_times(0.6, None, observed=1.0, silo="y")

    # Assert: x is timed by the server, y believed; a checkpoint keeps it
    assert x.train_time == pytest.approx(0.99) and x.note is not None
    assert y.train_time == 0.6 and y.note is None
    restored = ClaimChecker()
    restored.load_state_dict(checker.state_dict())
    assert restored.distrusted == {"x"}


@pytest.mark.parametrize(
    ("claimed", "observed", "replaced"),
    [(0.3, 0.3 + 3.5, False), (0.3, 0.3 + 8.0, True), (0.003, 10.0, True)],
    ids=["jitter", "beyond-jitter", "liar"],
)
def test_messaging_jitter_within_the_honest_gap_is_no_lie(
    claimed: float, observed: float, replaced: bool
) -> None:
    # Prepare: the largest honest gap is 3.4 s (a SuperNode polling every 3 s, pushing
    # every 0.5 s: a delay of 0 to 3.5 s)
    checker = ClaimChecker()
    checker.learn_overhead([0.5, 2.0, 3.0, 3.4, 3.5])

    # Execute
    checked = checker.check_times(claimed, None, observed=observed)

    # Assert: a replaced claim becomes the observation net of the overhead
    assert (checked.note is not None) is replaced
    assert checked.train_time == pytest.approx(observed - 3.4 if replaced else claimed)


def _jittered(engine: RoundEngine, seed: int) -> tuple[list[float], list[set[str]]]:
    """8 rounds of honest silos whose replies come 0 to 3.5 s after their compute (a
    SuperNode polling every 3 s, pushing every 0.5 s), reported in arrival order; the true
    round times and the distrusted silos after each round."""
    rng = np.random.default_rng(seed)
    round_times, distrusted = [], []
    for server_round in range(1, 9):
        state = engine.plan(server_round, range(len(CAPACITIES)))
        truth = {
            n: _true_time(CAPACITIES[int(n)], i.batch_size) for n, i in state.instructions.items()
        }
        observed = {n: truth[n] + float(rng.uniform(0, 3.5)) for n in truth}
        for node in sorted(observed, key=observed.__getitem__):
            size = state.instructions[node].batch_size
            _report(engine, state, int(node), _metrics(size, truth[node]), observed=observed[node])
        engine.close(state, replied=list(truth), wall=max(observed.values()))
        round_times.append(max(truth.values()))
        distrusted.append(set(engine.claims.distrusted))
    return round_times, distrusted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_honest_silos_under_supernode_jitter_are_left_alone(seed: int) -> None:
    # Prepare: compute of 0.16 to 0.8 s, far below the jitter; the run without checks
    unchecked, _ = _jittered(_engine(check_times=False), seed)

    # Execute
    checked, distrusted = _jittered(_engine(), seed)

    # Assert: no honest claim contradicted once an overhead is learned (round 1 judges
    # by the replies before it); the last round within 10% of the unchecked run's
    assert distrusted[-1] == distrusted[0]
    assert checked[-1] <= 1.1 * unchecked[-1]


@pytest.mark.parametrize("emulated", [True, False])
def test_an_emulated_time_not_waited_out_is_replaced_with_the_remedy_named(
    emulated: bool, fl_log: pytest.LogCaptureFixture
) -> None:
    # Prepare: a silo claims 0.4 s of a round the server saw end after 0.1 s (a silo
    # emulating a slowdown, emulate_wait=False, reports the slowdown beside its time)
    engine = _engine(check_times=True)
    state = engine.plan(1, [0])
    extra = {SLOWDOWN: 4.0} if emulated else {}

    # Execute
    _report(engine, state, 0, _metrics(B_INIT, 0.4, **extra), observed=0.1)
    engine.close(state, replied=[0], wall=0.1)

    # Assert: replaced either way; the warning names the remedy only for an emulated silo
    [line, *_] = [r.getMessage() for r in fl_log.records if "replaced" in r.getMessage()]
    assert ("check_times=False" in line) is emulated


# ------------------------------------------------------------------ he-time, bounds
def test_he_time_of_a_million_seconds_does_not_pin_the_deadline() -> None:
    # Prepare: encrypted rounds, one silo claiming he-time = 10^6
    engine = _engine()
    deadlines = []

    # Execute
    for server_round in range(1, 5):
        state = engine.plan(server_round, [0, 1])
        deadlines.append(state.deadline)
        for node in (0, 1):
            true = _true_time(1.0, state.instructions[node].batch_size)
            he = 1e6 if node == 1 else 0.05
            metrics = _metrics(state.instructions[node].batch_size, true, **{KEYS.he_time: he})
            _report(engine, state, node, metrics, observed=true + 0.05 + MESSAGING)
        engine.close(state, replied=[0, 1], wall=1.0)

    # Assert: round 1 has the ceiling (nothing predicted); later rounds the floor
    assert deadlines[0] == engine.deadline.ceiling
    assert all(d is not None and d < engine.deadline.ceiling for d in deadlines[1:])
    assert deadlines[-1] == engine.deadline.floor


@pytest.mark.parametrize(
    ("claimed", "expected"), [(1e-300, 1e-6), (1e300, 86400.0)], ids=["tiny", "huge"]
)
def test_absurd_train_times_are_clipped_with_a_warning(
    claimed: float, expected: float, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare
    engine = _engine()
    state = engine.plan(1, [0])

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        counts = _report(engine, state, 0, _metrics(B_INIT, claimed))
    engine.close(state, replied=[0], wall=None)

    # Assert: clipped, one warning, the claim kept on the record, a finite speed
    record = state.reports["silo-0"]
    assert counts and record[KEYS.train_time] == expected
    assert record["claimed-train-time"] == claimed
    assert "invalid-report" not in record
    assert math.isfinite(engine.balancer.predicted_speed("silo-0") or math.nan)
    assert len([r for r in caplog.records if "clipped" in r.getMessage()]) == 1


# ------------------------------------------------------------------ num-examples
@pytest.mark.parametrize(
    ("claim", "balancing", "declared", "accepted"),
    [
        (10**9, {}, None, False),  # the grab, refused by default
        (10_000_000, {}, None, True),  # at the cap
        (10**9, {"max_dataset_size": None}, None, True),  # cap lifted by configuration
        (10**9, {}, 10**9, True),  # declared: not a claim
        (500, {}, 400, False),  # not the declared size
        (0, {}, None, False),
        (12.5, {}, None, False),
    ],
    ids=["grab", "at-cap", "no-cap", "declared", "not-declared", "zero", "fraction"],
)
def test_num_examples_claims_are_bounded(
    claim: Any,
    balancing: dict[str, Any],
    declared: int | None,
    accepted: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare
    engine = _engine(**balancing)
    if declared is not None:
        engine.claims.declare({"silo-0": declared})
    state = engine.plan(1, [0])

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        counts = _report(engine, state, 0, _metrics(B_INIT, 0.5, num_examples=claim))
    engine.close(state, replied=[0], wall=None)

    # Assert: a rejected claim leaves the update out, with one line, and feeds nothing
    assert counts is accepted
    assert ("rejected-claim" in state.reports["silo-0"]) is not accepted
    assert (engine.balancer.predicted_speed("silo-0") is None) is not accepted
    assert len([r for r in caplog.records if "claim rejected" in r.getMessage()]) == (
        0 if accepted else 1
    )


@pytest.mark.parametrize(("later", "accepted"), [(100, True), (101, False), (10**6, False)])
def test_num_examples_is_pinned_at_the_first_report(later: int, accepted: bool) -> None:
    # Prepare: round 1 pins 100
    engine = _engine()
    state = engine.plan(1, [0])
    assert _report(engine, state, 0, _metrics(B_INIT, 0.5, num_examples=100))

    # Execute: round 2 claims ``later``; a checkpoint keeps the pin
    restored = _engine()
    restored.load_state_dict(engine.state_dict())
    state = restored.plan(2, [0])
    counts = _report(restored, state, 0, _metrics(B_INIT, 0.5, num_examples=later))

    # Assert
    assert counts is accepted
    assert restored.claims.sizes == {"silo-0": 100}


def test_cluster_mode_does_not_pin_num_examples() -> None:
    # Prepare: the weight is the batch size
    engine = RoundEngine(
        config=balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.batch_size,
        require_valid_report=True,
    )
    guard(engine)
    state = engine.plan(1, [0])

    # Execute
    counts = _report(engine, state, 0, _metrics(B_INIT, 0.5, num_examples=10**9))

    # Assert
    assert counts and engine.claims.sizes == {}


# ---------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "bad",
    [
        {"max_dataset_size": 0},
        {"time_tolerance": 1.0},
        {"min_claimed_time": 0.0},
        {"max_claimed_time": math.inf},
        {"min_claimed_time": 2.0, "max_claimed_time": 1.0},
    ],
)
def test_bad_claim_settings_are_refused(bad: dict[str, Any]) -> None:
    # Execute / Assert
    with pytest.raises(ValueError):
        balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1, **bad)


def test_claim_settings_are_tuning_fields_of_the_balancing_config() -> None:
    # Assert: documented defaults
    tuning = BalancingConfig(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1).tuning
    assert CLAIM_SETTINGS.issubset(type(tuning).model_fields)
    assert tuning.max_dataset_size == 10_000_000 and tuning.check_times is None
    assert tuning.time_tolerance == 2.0


# ---------------------------------------------------------------------- property
@settings(max_examples=30, deadline=None)
@given(
    capacities=st.lists(st.floats(1.0, 8.0), min_size=2, max_size=5),
    liar_index=st.integers(0, 4),
    factor=st.floats(1.0, 1e6),
)
def test_a_liar_gains_at_most_the_tolerance(
    capacities: list[float], liar_index: int, factor: float
) -> None:
    # Prepare
    ks = tuple(capacities)
    liar = liar_index % len(ks)
    honest, _ = _federation(_engine(), ks, rounds=6)

    # Execute
    lied, _ = _federation(_engine(), ks, rounds=6, liar=liar, factor=factor)

    # Assert: from round 3 on the round is at most the tolerance (2) times the honest one
    for server_round in range(3, 7):
        assert lied[server_round - 1] <= 2.0 * honest[server_round - 1] + 1e-9


# ------------------------------------------------------------- strategy wiring
class _Clock:
    """An injected clock: the grid moves it to each reply's arrival."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _ClockedGrid(Grid):
    """Node n replies ``arrival[n]`` clock-seconds after the push, one reply per pull,
    claiming ``claims[n]`` seconds of train-time."""

    def __init__(self, clock: _Clock, arrival: dict[int, float], claims: dict[int, float]):
        self.clock, self.arrival, self.claims = clock, arrival, claims
        self.queue: list[tuple[float, Message]] = []

    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.arrival)

    def get_nodes(self) -> Any:
        raise NotImplementedError

    def send_and_receive(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{i}"
            node = msg.metadata.dst_node_id
            b, tau = int(msg.content["config"]["batch-size"]), TAU
            metrics = MetricRecord(
                {
                    "num-examples": 100,
                    "train-time": self.claims[node],
                    "batch-size": b,
                    "samples-processed": b * tau,
                }
            )
            content = RecordDict(
                {
                    "arrays": msg.content["arrays"],
                    "metrics": metrics,
                    "silo": ConfigRecord({"silo-id": f"s{node}"}),
                }
            )
            self.queue.append((self.clock.now + self.arrival[node], Message(content, reply_to=msg)))
            ids.append(f"m{i}")
        self.queue.sort(key=lambda pair: pair[0])
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        if not self.queue:
            return []
        at, reply = self.queue.pop(0)
        self.clock.now = at
        return [reply]


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize(("check", "replaced"), [(True, True), (None, False), (False, False)])
def test_the_strategy_times_each_reply_with_its_clock(check: bool | None, replaced: bool) -> None:
    # Prepare: silo 2 claims 0.001 s but its reply comes 1 s after the push; silo 1 is
    # honest (0.5 s claimed, 0.51 s observed)
    from fl_lbbsp.strategies import LBBSPFedAvg

    clock = _Clock()
    inner = _ClockedGrid(clock, arrival={1: 0.51, 2: 1.0}, claims={1: 0.5, 2: 0.001})
    strategy = LBBSPFedAvg(
        initial_batch_size=B_INIT,
        local_steps=TAU,
        lr=0.1,
        fraction_evaluate=0.0,
        check_times=check,
        clock=clock,
    )
    grid = strategy.deadline_grid(inner, timeout=60)
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})

    # Execute: one round through the strategy (None: a test grid is not Flower's: off)
    sent = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(sent))
    strategy.aggregate_train(1, replies)

    # Assert
    assert strategy.round is not None
    reports = strategy.round.reports
    assert reports["s1"]["train-time"] == 0.5
    # replaced: the observation net of silo 1's gap (the first observed round's reference)
    assert reports["s2"]["train-time"] == (pytest.approx(0.99) if replaced else 0.001)
    assert ("observed-time" in reports["s2"]) is replaced


# ------------------------------------------------------------- encrypted path
@pytest.mark.usefixtures("flower_task")
def test_a_num_examples_grab_is_refused_in_the_encrypted_path(tmp_path: Any) -> None:
    # Prepare: silos a and b honest (100 and 100 samples), c claims 10^9 (above the
    # largest dataset size a silo may claim); believed, it would take the aggregate to
    # its own 1e-7
    pytest.importorskip("tenseal")
    from conftest import FakeGrid, make_reply

    from fl_lbbsp.crypto import (
        decrypt_update,
        encrypt_update,
        flatten,
        generate_keys,
        load_silo_keys,
        write_key_files,
    )
    from fl_lbbsp.crypto.records import update_from_record, update_to_record
    from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg

    files = write_key_files(generate_keys(), tmp_path / "keys")
    keys = load_silo_keys(files.secret)
    strategy = EncryptedLBBSPFedAvg(
        public_context=files.public,
        initial_batch_size=16,
        local_steps=4,
        lr=0.05,
        min_train_nodes=3,
        min_available_nodes=3,
        fraction_evaluate=0.0,
    )
    grid = FakeGrid([1, 2, 3])
    initial = ArrayRecord({"w": Array(np.zeros(8, dtype=np.float32))})
    list(strategy.configure_train(1, initial, ConfigRecord(), grid))  # type: ignore[arg-type]

    def reply(node: int, silo: str, value: float, n: int) -> Message:
        flat, layout = flatten({"w": np.full(8, value, dtype=np.float32)})
        update = encrypt_update(keys, flat, layout=layout)
        metrics = MetricRecord(
            {"num-examples": n, "train-time": 1.0, "batch-size": 16, "samples-processed": 64}
        )
        content = RecordDict(
            {
                "arrays": update_to_record(update),
                "metrics": metrics,
                "silo": ConfigRecord({"silo-id": silo}),
            }
        )
        return make_reply(content, node_id=node)  # type: ignore[no-any-return]

    # Execute
    arrays, _ = strategy.aggregate_train(
        1, [reply(1, "a", 1.0, 100), reply(2, "b", 4.0, 100), reply(3, "c", 1e-7, 10**9)]
    )
    second = list(strategy.configure_train(2, initial, ConfigRecord(), grid))  # type: ignore[arg-type]

    # Assert: the mean of a and b only, weighed by the server; c's claim is not pinned
    assert arrays is not None
    np.testing.assert_allclose(
        decrypt_update(keys, update_from_record(arrays)), np.full(8, 2.5), atol=1e-6
    )
    assert update_from_record(arrays).weight == 200
    assert len(second) == 3
    assert strategy.engine.claims.sizes == {"a": 100, "b": 100}


@pytest.mark.parametrize(
    ("observed", "replaced"),
    [
        ((17.5, 17.6, 18.1), set()),  # every silo's cold start (Ray actors, ClientApps)
        ((0.11, 0.21, 5.0), {"silo-2"}),  # silo 2 claims 0.3 s of a 5 s round: a lie
    ],
    ids=["cold-start", "first-round-liar"],
)
def test_the_first_observed_round_is_judged_against_its_own_gaps(
    observed: tuple[float, ...], replaced: set[str]
) -> None:
    # Prepare: nothing learned; three silos claim 0.1, 0.2 and 0.3 s
    engine = _engine(check_times=True)
    state = engine.plan(1, range(3))
    claims = (0.1, 0.2, 0.3)

    # Execute: replies in arrival order, the round closed
    for node, (claim, seen) in enumerate(zip(claims, observed, strict=True)):
        _report(engine, state, node, _metrics(B_INIT, claim), observed=seen)
    engine.close(state, replied=range(3), wall=max(observed))

    # Assert: a claim is replaced only when the round's other gaps contradict it, and the
    # balancer is fed what was believed
    for node, claim in enumerate(claims):
        record = state.reports[f"silo-{node}"]
        assert ("claimed-train-time" in record) is (f"silo-{node}" in replaced)
        believed = record[KEYS.train_time]
        assert (believed == claim) is (f"silo-{node}" not in replaced)
        assert engine.balancer.predicted_speed(f"silo-{node}") == pytest.approx(
            B_INIT * TAU / believed
        )


def test_a_first_round_reply_the_selector_drops_is_still_timed() -> None:
    # Prepare: backup workers (keep the 2 fastest of 3), nothing learned yet
    engine = RoundEngine(
        config=balancing_config(initial_batch_size=B_INIT, local_steps=TAU, lr=0.1),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
        selector=FastestReplies(replies=2),
    )
    guard(engine)
    state = engine.plan(1, range(3))
    claims = (0.1, 0.2, 0.4)

    # Execute: the replies, the selection, the close
    for node, claim in enumerate(claims):
        _report(engine, state, node, _metrics(B_INIT, claim), observed=claim + 0.01)
    kept, dropped = engine.select(state, [f"silo-{n}" for n in range(3)])
    engine.close(state, replied=range(3), wall=0.41)

    # Assert: silo 2 is dropped from the aggregate, but the balancer knows its speed and
    # its record (in the dropped ones) says so
    assert kept == {"silo-0", "silo-1"} and set(dropped) == {"silo-2"}
    assert engine.balancer.predicted_speed("silo-2") == pytest.approx(B_INIT * TAU / 0.4)
    assert dropped["silo-2"]["predicted-speed"] == pytest.approx(B_INIT * TAU / 0.4)


# ------------------------------------------------------------ the round fed together
def test_the_engine_feeds_a_round_together_and_a_shared_slowdown_is_taken_out() -> None:
    # Prepare: 4 silos 4:2:1:1 in steady state (no claim checks: the slowdown is real)
    engine = _engine(check_times=False)
    _federation(engine, (1.0, 2.0, 4.0, 4.0), rounds=8, observe=False)
    state = engine.plan(9, range(4))
    before = engine.balancer.to_json()

    # Execute: every silo 1.5x slower this round; the balancer is fed at the close
    for node, instruction in state.instructions.items():
        k = (1.0, 2.0, 4.0, 4.0)[int(node)]
        seconds = 1.5 * _true_time(k, instruction.batch_size)
        _report(engine, state, int(node), _metrics(instruction.batch_size, seconds))
    fed_early = engine.balancer.to_json() != before
    extra = engine.close(state, replied=list(state.instructions), wall=None)

    # Assert: nothing fed before the close; the shared factor taken out, no silo restarted
    assert not fed_early
    assert extra["common_factor"] == pytest.approx(1.5)
    for node in range(4):
        silo = f"silo-{node}"
        assert len(engine.balancer._silos[silo].history) > 2
        assert state.reports[silo]["predicted-speed"] == engine.balancer.predicted_speed(silo)
