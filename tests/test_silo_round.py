"""One silo round (fl_lbbsp.clients.round) and the instruction codec
(fl_lbbsp.instruction): every entry point shuffles the same way, misuse is reported.
The adapter's decorator checks are in test_adapter.py."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fl_lbbsp.clients import LocalTraining, lbbsp_train, misuse_of, run_round, train_local
from fl_lbbsp.clients.emulated import Emulation, run_emulated_round, slowdown_schedule
from fl_lbbsp.clients.emulation import CostModel
from fl_lbbsp.clients.round import WorkDone
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.instruction import InstructionError, RoundInstruction, round_seed, silo_id_of

KEYS = RecordKeys()
RENAMED = RecordKeys(batch_size="bs", local_steps="tau", lr="eta", server_round="round")
B, TAU = 6, 4


# --------------------------------------------------------------------- the codec
@pytest.mark.parametrize("offset", [None, 48])
@pytest.mark.parametrize("keys", [KEYS, RENAMED])
def test_instruction_round_trips_through_a_config_record(
    keys: RecordKeys, offset: int | None
) -> None:
    # Prepare
    sent = RoundInstruction(
        batch_size=24, local_steps=5, lr=0.05, server_round=3, batch_offset=offset
    )

    # Execute
    record = sent.to_config(keys, base={"user-entry": "kept", keys.batch_size: 1})
    received = RoundInstruction.from_config(record, keys)

    # Assert: the caller's entries stay, the instruction's replace theirs, None is left out
    assert received == sent
    assert record["user-entry"] == "kept" and record[keys.batch_size] == 24
    assert (keys.batch_offset in record) == (offset is not None)


def test_instruction_reads_whole_floats_and_defaults_the_round() -> None:
    # Execute
    instruction = RoundInstruction.from_config({"batch-size": 16.0, "local-steps": 2, "lr": 1})

    # Assert
    assert instruction.batch_size == 16 and isinstance(instruction.batch_size, int)
    assert instruction.server_round == 1 and instruction.lr == 1.0
    assert instruction.samples == 32


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"local-steps": 4, "lr": 0.1}, "'batch-size' \\(RecordKeys.batch_size\\)"),
        ({"batch-size": 8, "lr": 0.1}, "'local-steps' \\(RecordKeys.local_steps\\)"),
        ({"batch-size": 8, "local-steps": 4}, "'lr' \\(RecordKeys.lr\\)"),
        ({"batch-size": 0, "local-steps": 4, "lr": 0.1}, "'batch-size'.*greater than 0"),
        ({"batch-size": 2.5, "local-steps": 4, "lr": 0.1}, "'batch-size'.*whole number"),
        ({"batch-size": True, "local-steps": 4, "lr": 0.1}, "'batch-size'.*a finite number"),
        ({"batch-size": "8", "local-steps": 4, "lr": 0.1}, "'batch-size'.*a finite number"),
        ({"batch-size": 8, "local-steps": 4, "lr": -1.0}, "'lr'.*greater than 0"),
        ({"batch-size": 8, "local-steps": 4, "lr": math.nan}, "'lr'.*finite"),
        ({"batch-size": 8, "local-steps": 4, "lr": 0.1, "server-round": -1}, "'server-round'"),
    ],
)
def test_instruction_refuses_a_bad_config_naming_the_key(
    config: dict[str, Any], named: str
) -> None:
    # Execute / Assert
    with pytest.raises(InstructionError, match=named):
        RoundInstruction.from_config(config)


def test_round_seed_depends_on_the_run_the_silo_and_the_round_only() -> None:
    # Execute
    seed = round_seed(0, "clinic-a", 3)

    # Assert: reproducible, different for another run, silo or round, a valid torch seed
    assert seed == round_seed(0, "clinic-a", 3)
    assert (
        len(
            {
                seed,
                round_seed(1, "clinic-a", 3),
                round_seed(0, "b", 3),
                round_seed(0, "clinic-a", 4),
            }
        )
        == 4
    )
    assert 0 <= seed < 2**63
    torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("node_config", "node_id", "expected"),
    [
        ({"silo-id": "clinic-a", "partition-id": 2}, 9, "clinic-a"),
        ({"partition-id": 2}, 9, "2"),
        ({}, 9, "9"),
        ({}, None, "0"),
    ],
)
def test_silo_id_is_the_node_configs_then_the_partition_then_the_node(
    node_config: dict[str, Any], node_id: int | None, expected: str
) -> None:
    assert silo_id_of(node_config, node_id=node_id) == expected


@pytest.mark.parametrize(
    ("node_config", "run_config", "listed", "expected"),
    [
        ({"partition-id": 1, "slowdown": "3"}, {"slowdowns": "1;5"}, ("1", "2"), 3.0),
        ({"partition-id": 1}, {"slowdowns": "1;5"}, ("1", "2"), 2.0),
        ({"partition-id": 1}, {"slowdowns": "1;5"}, (), 5.0),
        ({"partition-id": 4}, {"slowdowns": "1;5"}, (), 1.0),
        ({}, None, (), 1.0),
    ],
)
def test_slowdown_is_the_node_configs_then_the_listed_then_the_run_configs(
    node_config: dict[str, Any],
    run_config: dict[str, Any] | None,
    listed: tuple[str, ...],
    expected: float,
) -> None:
    schedule = slowdown_schedule(node_config, listed=listed, run_config=run_config)
    assert schedule.factor(1) == expected


# ------------------------------------------------------------------ the round
INSTRUCTION = RoundInstruction(batch_size=B, local_steps=TAU, lr=0.1, server_round=2)


def _draw(
    plan: LocalTraining, *, passes: int = 1, steps: int | None = None, size: int | None = None
) -> None:
    sampler = plan.batch_sampler(20)
    if size is not None:
        sampler.batch_size = size
    for _ in range(passes):
        for k, _batch in enumerate(sampler):
            if steps is not None and k + 1 >= steps:
                break


@pytest.mark.parametrize(
    ("draw", "drawn", "note"),
    [
        (lambda plan: None, 0, "drew no batch through plan.batch_sampler"),
        (
            lambda plan: _draw(plan, passes=2),
            2 * B * TAU,
            f"drew {2 * TAU} batches, {2 * B * TAU} samples",
        ),
        (
            lambda plan: _draw(plan, size=B + 2),
            (B + 2) * TAU,
            f"drew {TAU} batches, {(B + 2) * TAU} samples",
        ),
        (lambda plan: _draw(plan, steps=2), 2 * B, f"drew 2 batches, {2 * B} samples"),
    ],
    ids=["own-loader", "extra-epoch", "other-batch-size", "fewer-steps"],
)
def test_a_round_that_draws_other_batches_says_so_and_reports_what_was_drawn(
    draw: Callable[[LocalTraining], None], drawn: int, note: str
) -> None:
    # Execute
    report = run_emulated_round(
        INSTRUCTION,
        lambda plan: WorkDone(output=draw(plan)),
        silo_id="s",
        emulation=Emulation(cost=CostModel(per_sample=0.01), wait=False),
    )

    # Assert: the note says what was drawn, what was instructed and the fix
    misuse = report.notes[KEYS.misuse]
    assert note in misuse and f"instructed {TAU} batches of {B} ({B * TAU} samples)" in misuse
    assert "batch_sampler=plan.batch_sampler(" in misuse and "\n" not in misuse
    assert len(misuse) < 300  # the server keeps 300 characters
    assert report.metrics[KEYS.samples_drawn] == drawn
    assert report.metrics[KEYS.samples_processed] == (drawn or B * TAU)


def test_an_honest_round_reports_the_contract_and_no_misuse() -> None:
    # Prepare: a silo emulated 2x slower on a cost model, with a memory cap under its
    # local data
    seen: list[int] = []

    def work(plan: LocalTraining) -> WorkDone[str]:
        with plan.timed():
            seen.extend(len(b) for b in plan.batch_sampler(80))
        return WorkDone(output="done", num_examples=80, loss=0.5)

    # Execute
    report = run_emulated_round(
        INSTRUCTION,
        work,
        silo_id="s",
        emulation=Emulation(factor=2.0, cost=CostModel(per_sample=0.01, fixed=0.02), wait=False),
        max_batch_size=64,
    )

    # Assert
    assert seen == [B] * TAU and report.output == "done" and report.notes == {}
    assert report.metrics[KEYS.train_time] == pytest.approx(TAU * 2 * (0.01 * B + 0.02))
    assert report.metrics[KEYS.samples_processed] == report.metrics[KEYS.samples_drawn] == B * TAU
    assert report.metrics[KEYS.batch_size] == B and report.metrics[KEYS.num_examples] == 80
    assert report.metrics[KEYS.max_batch_size] == 64 and report.metrics["train-loss"] == 0.5
    assert report.metrics["slowdown"] == 2.0 and report.plan.seed == round_seed(0, "s", 2)


def test_a_round_that_does_not_check_draws_reports_b_times_tau() -> None:
    # Execute: cluster mode slices a global batch instead of drawing through the plan
    report = run_round(
        INSTRUCTION, lambda plan: WorkDone(output=None), silo_id="w", check_draws=False
    )

    # Assert
    assert report.notes == {} and KEYS.samples_drawn not in report.metrics
    assert report.metrics[KEYS.samples_processed] == B * TAU


def test_a_round_waits_from_when_the_silo_got_its_instruction() -> None:
    # Prepare: the instruction came 10 s ago (queueing, loading): nothing is left to wait
    started = time.perf_counter() - 10.0

    # Execute
    begun = time.perf_counter()
    report = run_emulated_round(
        INSTRUCTION,
        lambda plan: WorkDone(output=None),
        silo_id="s",
        emulation=Emulation(cost=CostModel(per_sample=0.1)),
        started=started,
        check_draws=False,
    )

    # Assert: 2.4 s reported, and no wait (it would be 2.4 s)
    assert report.reported_time == pytest.approx(TAU * 0.1 * B)
    assert time.perf_counter() - begun < report.reported_time


def test_the_plain_round_reports_what_it_measured_and_its_interval() -> None:
    # Prepare
    before = time.time()

    # Execute: the production round, no emulation
    report = run_round(INSTRUCTION, lambda plan: WorkDone(output=None), silo_id="s")

    # Assert: train-time is the compute, its interval lies in the call, no slowdown key
    metrics = report.metrics
    assert metrics[KEYS.train_time] == metrics["compute-time"] == report.reported_time
    assert before <= metrics["compute-start"] <= metrics["compute-end"] <= time.time()
    assert "slowdown" not in metrics


@pytest.mark.parametrize(
    ("factor", "cost", "waited_since", "expected", "slept"),
    [
        (3.0, CostModel(per_sample=0.1), 1.0, 3 * TAU * 0.1 * B, 3 * TAU * 0.1 * B - 1.0),
        (1.0, CostModel(per_sample=0.1), 5.0, TAU * 0.1 * B, None),
        (2.0, CostModel(per_sample=0.05, fixed=0.1), 0.0, 2 * TAU * (0.05 * B + 0.1), None),
    ],
    ids=["waits-the-rest", "nothing-left", "no-wait-asked"],
)
def test_the_emulation_wrapper_reports_the_emulated_time_and_waits_for_it(
    factor: float, cost: CostModel, waited_since: float, expected: float, slept: float | None
) -> None:
    # Prepare: an injected clock, the instruction received waited_since seconds ago
    sleeps: list[float] = []
    wait = waited_since > 0

    # Execute
    report = run_emulated_round(
        INSTRUCTION,
        lambda plan: WorkDone(output=None),
        silo_id="s",
        emulation=Emulation(factor=factor, cost=cost, wait=wait),
        started=100.0 - waited_since,
        clock=lambda: 100.0,
        sleep=sleeps.append,
        check_draws=False,
    )

    # Assert: k times the cost model's time, the slowdown reported, the rest waited, and
    # the interval spans at least the reported time
    metrics = report.metrics
    assert metrics[KEYS.train_time] == pytest.approx(expected) == report.reported_time
    assert metrics["slowdown"] == factor
    assert sleeps == ([] if slept is None else [pytest.approx(slept)])
    assert metrics["compute-end"] - metrics["compute-start"] >= expected - 1e-9


# ------------------------------------------------ the same silo, every entry point
RUN_CONFIG = {
    "dataset": "embedded",
    "partition": "iid",
    "seed": 3,
    "model": "mlp",
    "slowdowns": "",
    "cost-model": "",
}
NODE_CONFIG = {"partition-id": 1, "num-partitions": 3, "silo-id": "silo-1"}
CONFIG = {"batch-size": 8, "local-steps": 3, "lr": 0.05, "server-round": 2}


def _initial(data: Any) -> dict[str, torch.Tensor]:
    from fl_lbbsp.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _by_silo_task(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    from fl_lbbsp.clients.silo_task import handle
    from fl_lbbsp.clients.task import TaskRequest

    request = TaskRequest(
        kind="train",
        arrays=[(n, t.numpy()) for n, t in state.items()],
        config=CONFIG,
        run_config=RUN_CONFIG,
        node_config=NODE_CONFIG,
        process_started=time.time(),
    )
    return dict(handle(request).arrays)


def _context() -> Context:
    return Context(
        run_id=1,
        node_id=7,
        node_config=dict(NODE_CONFIG),
        state=RecordDict(),
        run_config=dict(RUN_CONFIG),
    )


def _message(state: dict[str, torch.Tensor], config: dict[str, Any] | None = None) -> Message:
    content = RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord(config or CONFIG)})
    return Message(content=content, dst_node_id=7, message_type="train")


def _by_client_app(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    from fl_lbbsp.clients.app import SiloSetup, make_client_app

    setup = SiloSetup(dataset="embedded", partition="iid", num_silos=3, seed=3, model="mlp")
    reply = make_client_app(setup)(_message(state), _context())
    return {k: v.numpy() for k, v in reply.content["arrays"].items()}


def _by_adapter(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    from fl_lbbsp.clients.silo_task import build_model_for, local_train_set

    @lbbsp_train(emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        data = local_train_set(context.run_config, context.node_config)
        model = build_model_for(context.run_config, data)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
        sampler = plan.batch_sampler(len(x))
        train_local(model, x, y, batch_size=B, local_steps=TAU, lr=plan.lr, sampler=sampler)
        metrics = MetricRecord({"num-examples": len(x)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    reply = train(_message(state), _context())
    assert KEYS.misuse not in reply.content[KEYS.silo_record]
    return {k: v.numpy() for k, v in reply.content["arrays"].items()}


@pytest.mark.usefixtures("flower_task")
def test_the_same_silo_trains_the_same_in_simulation_deployment_and_the_adapter() -> None:
    # Prepare: one silo's data and initial model
    from fl_lbbsp.clients.silo_task import local_train_set

    state = _initial(local_train_set(RUN_CONFIG, NODE_CONFIG))

    # Execute: the simulation ClientApp, the quickstart task, a user's decorated function
    updates = [run(state) for run in (_by_client_app, _by_silo_task, _by_adapter)]

    # Assert: one seed function: the same batches, so the same update, bit for bit
    for other in updates[1:]:
        assert other.keys() == updates[0].keys()
        for name, value in updates[0].items():
            np.testing.assert_array_equal(other[name], value)
    assert any(not np.array_equal(updates[0][n], state[n].numpy()) for n in state)


# ------------------------------------------------------------- the adapter's checks
def _reply(msg: Message, metrics: dict[str, Any] | None = None) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord(), "metrics": MetricRecord(metrics or {"num-examples": 20})}
    )
    return Message(content=content, reply_to=msg)


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize(
    ("draw", "samples"),
    [
        (lambda plan: None, 0),
        (lambda plan: _draw(plan, passes=2), 2 * B * TAU),
        (lambda plan: _draw(plan, size=2 * B), 2 * B * TAU),
    ],
    ids=["own-loader", "extra-epoch", "other-batch-size"],
)
def test_the_adapter_reports_misuse_in_the_silo_record(
    draw: Callable[[LocalTraining], None], samples: int
) -> None:
    # Prepare
    @lbbsp_train(emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        draw(plan)
        return _reply(msg)

    config = {"batch-size": B, "local-steps": TAU, "lr": 0.1}

    # Execute
    reply = train(_message({}, config), _context())

    # Assert: the silo record says it; the metrics hold what was really drawn
    silo = reply.content[KEYS.silo_record]
    assert silo[KEYS.silo_id] == "silo-1"
    assert f"instructed {TAU} batches of {B}" in str(silo[KEYS.misuse])
    metrics = reply.content["metrics"]
    assert metrics[KEYS.samples_drawn] == samples
    assert metrics[KEYS.samples_processed] == (samples or B * TAU)


@pytest.mark.usefixtures("flower_task")
def test_the_adapter_takes_keys_as_a_mapping_of_record_keys_fields() -> None:
    # Prepare
    @lbbsp_train(keys={"batch_size": "bs"}, emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        list(plan.batch_sampler(20))
        return _reply(msg)

    # Execute
    reply = train(_message({}, {"bs": B, "local-steps": TAU, "lr": 0.1}), _context())

    # Assert
    assert reply.content["metrics"]["bs"] == B and KEYS.misuse not in reply.content["silo"]


@pytest.mark.usefixtures("flower_task")
def test_the_adapter_passes_an_error_reply_on_untouched() -> None:
    # Prepare
    from flwr.app import Error

    @lbbsp_train(emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        return Message(Error(code=1, reason="disk full"), reply_to=msg)

    # Execute
    reply = train(_message({}, {"batch-size": B, "local-steps": TAU, "lr": 0.1}), _context())

    # Assert
    assert reply.has_error() and reply.error.reason == "disk full"


@pytest.mark.usefixtures("flower_task")
def test_the_adapter_refuses_a_function_that_returns_no_message() -> None:
    # Prepare
    @lbbsp_train(emulate_wait=False)
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        return None  # type: ignore[return-value]

    # Execute / Assert
    with pytest.raises(TypeError, match="returned NoneType, not a Message"):
        train(_message({}, {"batch-size": B, "local-steps": TAU, "lr": 0.1}), _context())


def test_misuse_of_names_nothing_for_exactly_tau_batches_of_b() -> None:
    # Prepare
    plan = LocalTraining(batch_size=B, local_steps=TAU, lr=0.1, server_round=1, seed=0)
    list(plan.batch_sampler(10))

    # Execute / Assert
    assert misuse_of(plan) is None and plan.batches_drawn == TAU


def test_plan_loader_recuts_the_apps_loader_to_tau_batches_of_the_batch_size() -> None:
    # Prepare: the app's own loader (its batch size 7, shuffled, its collate function)
    from torch.utils.data import DataLoader, TensorDataset

    from fl_lbbsp.clients.round import LocalTraining, misuse_of

    data = TensorDataset(torch.arange(50, dtype=torch.float32)[:, None])
    own = DataLoader(data, batch_size=7, shuffle=True, collate_fn=lambda rows: len(rows))
    plan = LocalTraining(batch_size=12, local_steps=4, lr=0.1, server_round=1, seed=3)

    # Execute
    sizes = list(plan.loader(own))

    # Assert: the app's collate function, the plan's batches, nothing to report
    assert sizes == [12, 12, 12, 12]
    assert misuse_of(plan) is None and plan.samples_drawn == 48


@pytest.mark.parametrize(
    ("drawn_at", "steps", "expected"),
    [
        ((10.0, 11.0), 5, (20.0 - 11.0) * 5 / 4),  # start-up and the first step left out
        ((10.0,), 5, 10.0),  # one batch drawn: from it
        ((10.0, 11.0), 1, 10.0),  # one step: from the first batch
        ((), 5, None),  # nothing drawn through the plan
    ],
)
def test_the_compute_is_timed_from_the_batches_drawn(
    drawn_at: tuple[float, ...], steps: int, expected: float | None
) -> None:
    # Prepare: injected draw times, no clock
    from fl_lbbsp.clients.round import LocalTraining

    plan = LocalTraining(batch_size=4, local_steps=steps, lr=0.1, server_round=1, seed=0)
    plan.batch_sampler(10).drawn_at = list(drawn_at)

    # Execute
    measured = plan.drawn_time(20.0)

    # Assert
    assert measured == (None if expected is None else pytest.approx(expected))


def test_the_interval_opens_at_the_compute_not_at_the_loading() -> None:
    # Prepare: a work that loads (a cold dataset) before it draws its first batch
    def work(plan: LocalTraining) -> WorkDone[None]:
        time.sleep(0.2)  # loading, not compute
        loading_done = time.time()
        for _ in plan.batch_sampler(40):
            pass
        marks.append(loading_done)
        return WorkDone(output=None)

    marks: list[float] = []

    # Execute
    report = run_round(INSTRUCTION, work, silo_id="s")

    # Assert: the interval begins after the loading (a lower bound: no wall-clock speed)
    assert report.metrics["compute-start"] >= marks[0] - 1e-3


class _Clock:
    """An injected ``time`` module: ``perf_counter`` and ``time`` advance by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_000.0 + self.now


@pytest.mark.parametrize(
    ("through_plan", "expected"),
    [(True, TAU * 0.1), (False, 1.6 + TAU * 0.1)],
    ids=["plan-sampler", "own-loader"],
)
def test_a_timed_block_counts_the_steps_not_the_set_up_before_them(
    monkeypatch: pytest.MonkeyPatch, through_plan: bool, expected: float
) -> None:
    # Prepare: injected clock; the block builds its optimiser first (torch's first SGD in a
    # process imports its compiler: 1.6 s), then runs tau steps of 0.1 s each
    from fl_lbbsp.clients import round as round_module
    from fl_lbbsp.clients import sampler as sampler_module

    clock = _Clock()
    monkeypatch.setattr(round_module, "time", clock)
    monkeypatch.setattr(sampler_module, "time", clock)
    batches = [list(range(B))] * TAU

    def work(plan: LocalTraining) -> WorkDone[None]:
        sampler = plan.batch_sampler(40)
        with plan.timed():
            clock.now += 1.6
            for _ in sampler if through_plan else batches:
                clock.now += 0.1
        return WorkDone(output=None)

    # Execute
    report = run_round(INSTRUCTION, work, silo_id="s", check_draws=False)

    # Assert: with the plan's sampler the compute and its interval begin at the first batch
    assert report.metrics[KEYS.train_time] == pytest.approx(expected)
    interval = report.metrics["compute-end"] - report.metrics["compute-start"]
    assert interval == pytest.approx(expected)


@pytest.mark.parametrize(("threads", "inside"), [(1, 1), (None, 3)], ids=["one", "as-set"])
def test_the_emulated_compute_runs_on_the_emulations_threads_and_restores_them(
    threads: int | None, inside: int
) -> None:
    # Prepare: the process set 3 threads
    import torch

    seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        # Execute
        run_emulated_round(
            INSTRUCTION,
            lambda plan: WorkDone(output=seen.append(torch.get_num_threads())),
            silo_id="s",
            emulation=Emulation(factor=2.0, wait=False, threads=threads),
            check_draws=False,
        )
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

    # Assert
    assert seen == [inside] and after == 3
