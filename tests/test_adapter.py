"""The silo-side adapter ``lbbsp_train`` on a quickstart-pytorch style ClientApp
(examples/plugin): in process with LBBSPFedAvg, and through ``flwr run`` in simulation."""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from flower_run import flower_ports_taken, run_app
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.clients import LocalTraining, lbbsp_train
from fl_lbbsp.contract import SILO_APP_METRICS, RecordKeys
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.telemetry import read_telemetry

APP = Path(__file__).resolve().parent.parent / "examples" / "plugin"
KEYS = RecordKeys()
COST = "0.001,0.002"  # emulated step time m,b of the fastest silo: silo times are exact
SLOWDOWNS = "1;2;4"
TAU = 5


@pytest.fixture
def plugin_app():  # type: ignore[no-untyped-def]
    """The example's ClientApp module, imported from examples/plugin."""
    sys.path.insert(0, str(APP))
    try:
        from plugin_app import client_app

        yield client_app
    finally:
        sys.path.remove(str(APP))


def _context(node_config: dict | None = None, run_config: dict | None = None) -> Context:  # type: ignore[type-arg]
    return Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 1, **(node_config or {})},
        state=RecordDict(),
        run_config=dict(run_config or {}),
    )


def _train_message(config: dict) -> Message:  # type: ignore[type-arg]
    content = RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord(config)})
    return Message(content=content, dst_node_id=7, message_type="train")


def _user_train(*, metrics: dict | None = None, records: int = 1):  # type: ignore[no-untyped-def, type-arg]
    """A train function that draws its batches from the plan's sampler."""
    seen: list[list[int]] = []

    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        with plan.timed():
            seen.extend(list(plan.batch_sampler(50)))
        content = RecordDict({"arrays": ArrayRecord()})
        for i in range(records):
            content[f"metrics{i}"] = MetricRecord(
                {KEYS.num_examples: 50, "train_loss": 0.5} if metrics is None else metrics
            )
        return Message(content=content, reply_to=msg)

    return train, seen


def test_adapter_hands_over_the_instructions_and_adds_the_contract(flower_task) -> None:
    # Prepare: a silo emulated 2x slower on a cost model, with a memory cap and an id
    function, seen = _user_train()
    train = lbbsp_train(cost_model=COST, emulate_wait=False)(function)
    config = {KEYS.batch_size: 12, KEYS.local_steps: 4, KEYS.lr: 0.1, KEYS.server_round: 3}
    context = _context({"slowdown": 2.0, KEYS.silo_id: "clinic-a", KEYS.max_batch_size: 40})

    # Execute
    reply = train(_train_message(config), context)

    # Assert: exactly tau batches of B; the reported time is the cost model's; the
    # user's own metrics stay beside the contract's; the silo names itself
    assert [len(batch) for batch in seen] == [12] * 4
    metrics = reply.content["metrics0"]
    assert metrics[KEYS.train_time] == pytest.approx(4 * 2 * (0.001 * 12 + 0.002))
    assert metrics[KEYS.batch_size] == 12 and metrics[KEYS.samples_processed] == 48
    assert metrics[KEYS.max_batch_size] == 40 and metrics["train_loss"] == 0.5
    assert metrics[KEYS.num_examples] == 50
    assert {KEYS.cpu_percent, KEYS.memory_percent} <= set(metrics)
    assert reply.content[KEYS.silo_record][KEYS.silo_id] == "clinic-a"


@pytest.mark.parametrize(
    ("config", "user", "error"),
    [
        ({KEYS.local_steps: 4, KEYS.lr: 0.1}, {}, "batch_size"),
        ({KEYS.batch_size: 0, KEYS.local_steps: 4, KEYS.lr: 0.1}, {}, "batch_size"),
        ({KEYS.batch_size: 8, KEYS.local_steps: 4, KEYS.lr: -1.0}, {}, "lr"),
        ({KEYS.batch_size: 8, KEYS.local_steps: 4, KEYS.lr: 0.1}, {"metrics": {}}, "num-examples"),
        (
            {KEYS.batch_size: 8, KEYS.local_steps: 4, KEYS.lr: 0.1},
            {"records": 2},
            "2 MetricRecords",
        ),
    ],
)
def test_adapter_refuses_bad_instructions_and_replies_without_a_weight(
    flower_task,
    config: dict,  # type: ignore[type-arg]
    user: dict,  # type: ignore[type-arg]
    error: str,
) -> None:
    # Prepare
    function, _ = _user_train(**user)
    train = lbbsp_train(emulate_wait=False)(function)

    # Execute / Assert: in a silo this becomes an error reply naming the problem
    with pytest.raises(ValueError, match=error):
        train(_train_message(config), _context())


def _three_rounds(
    plugin_app: Any,
    tmp_path: Path,
    *,
    initial_batch_size: int,
    local_steps: int,
    cost: str,
    extra_metric_keys: tuple[str, ...] | None = None,
) -> tuple[InProcessGrid, list[dict[str, Any]]]:
    """The example's ClientApp on 3 in-process nodes emulated 1:2:4 times slower, 3 rounds
    of LBBSPFedAvg: the grid and the rounds' telemetry."""
    grid = InProcessGrid(
        plugin_app.app, num_nodes=3, run_config={"slowdowns": SLOWDOWNS, "cost-model": cost}
    )
    telemetry = tmp_path / "telemetry.jsonl"
    strategy = LBBSPFedAvg(
        initial_batch_size=initial_batch_size, local_steps=local_steps, lr=0.05,
        fraction_evaluate=0.0, min_train_nodes=3, min_available_nodes=3,
        extra_metric_keys=extra_metric_keys, telemetry_path=telemetry,
    )  # fmt: skip
    torch.manual_seed(0)
    model = plugin_app.Net()
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=3, timeout=600
    )
    return grid, [e for e in read_telemetry(telemetry) if e["event"] == "train"]


def test_quickstart_style_app_balances_through_the_in_process_grid(
    plugin_app, tmp_path: Path
) -> None:
    # Prepare / Execute: the example's ClientApp on 3 nodes emulated 1:2:4 times slower
    grid, rounds = _three_rounds(
        plugin_app, tmp_path, initial_batch_size=16, local_steps=TAU, cost=COST,
        extra_metric_keys=(*SILO_APP_METRICS, "train_loss"),
    )  # fmt: skip

    # Assert: every reply accepted, silos named by partition, the faster a silo the
    # bigger its batch, the total X = 3 * 16 kept, and the round shorter than FedAvg's
    assert [e["rejected"] for e in rounds] == [[], [], []]
    assert set(rounds[-1]["silos"]) == {"0", "1", "2"}
    sizes = [rounds[-1]["silos"][s][KEYS.batch_size] for s in ("0", "1", "2")]
    assert sizes[0] > sizes[1] > sizes[2] and sum(sizes) == 48
    assert rounds[-1]["round_time"] < 0.6 * rounds[0]["round_time"]
    assert all(t.error is None for t in grid.transfers)


def test_a_silo_is_never_given_more_than_its_data_from_round_two(
    plugin_app, tmp_path: Path
) -> None:
    # Prepare / Execute: 3 silos of about 480 samples, 1:2:4 times slower, and B_init =
    # 300: the fastest silo's share of X = 900 would be over its data
    _, rounds = _three_rounds(
        plugin_app, tmp_path, initial_batch_size=300, local_steps=2, cost="0.0001,0.002"
    )

    # Assert: from round 2 every silo's batch fits its data, the fastest at its data
    for event in rounds[1:]:
        for row in event["silos"].values():
            assert row[KEYS.batch_size] <= row[KEYS.num_examples]
    fastest = rounds[-1]["silos"]["0"]
    assert fastest[KEYS.batch_size] == fastest[KEYS.num_examples]


@pytest.mark.slow
def test_quickstart_style_app_runs_under_flwr_run_in_simulation(tmp_path: Path) -> None:
    # Prepare: a private Flower home (its managed local SuperLink on free ports) and a copy
    # of the app; the SuperLink's own API ports are fixed by Flower
    if flower_ports_taken():
        pytest.skip("another SuperLink holds Flower's ServerAppIo/Fleet ports")
    telemetry = tmp_path / "telemetry.jsonl"

    # Execute
    done = run_app(
        APP, tmp_path, overrides=f"telemetry='{telemetry}'", pythonpath=(APP.parent.parent,),
        supernodes=3,
    )  # fmt: skip

    # Assert: three rounds, every silo's reply accepted and its cost model's time kept,
    # batch sizes ordered by the emulated slowdowns; the app's pyproject.toml left as it
    # was (Flower migrates a legacy federation in place)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    copied = (tmp_path / APP.name / "pyproject.toml").read_text()
    assert copied == (APP / "pyproject.toml").read_text()
    rounds = [e for e in read_telemetry(telemetry) if e["event"] == "train"]
    assert len(rounds) == 3 and all(e["rejected"] == [] for e in rounds)
    last = rounds[-1]["silos"]
    assert len(last) == 3
    assert not [r for e in rounds for r in e["silos"].values() if "claimed-train-time" in r]
    by_slowdown = sorted(last.values(), key=lambda r: r["slowdown"])
    sizes = [r[KEYS.batch_size] for r in by_slowdown]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1] and sum(sizes) == 48


# ------------------------------------------------- decorator and plan mistakes
def _two_parameters(msg: Message, context: Context) -> Message:
    return msg


def _three_parameters(msg: Message, context: Context, plan: LocalTraining) -> Message:
    return msg


def _no_parentheses() -> None:
    lbbsp_train(_three_parameters)


def _no_plan() -> None:
    lbbsp_train()(_two_parameters)  # type: ignore[arg-type]


def _stacked_above_flower() -> None:
    app = ClientApp()

    @lbbsp_train()
    @app.train()
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:  # type: ignore[type-var]
        return msg


def _decorated_twice() -> None:
    lbbsp_train()(lbbsp_train()(_three_parameters))  # type: ignore[arg-type]


def _keys_of_another_type() -> None:
    lbbsp_train(keys=["batch-size"])  # type: ignore[arg-type]


def _keys_with_an_unknown_field() -> None:
    lbbsp_train(keys={"batch-size": "bs"})


def _not_a_function() -> None:
    lbbsp_train()("train")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mistake", "fix"),
    [
        (_no_parentheses, "write '@lbbsp_train\\(\\)'"),
        (_no_plan, "_two_parameters\\(msg, context\\) takes no 'plan': add a third parameter"),
        (_stacked_above_flower, "above @app.train\\(\\).*swap the two lines"),
        (_decorated_twice, "already decorated"),
        (_keys_of_another_type, "takes a fl_lbbsp.contract.RecordKeys.*not list"),
        (_keys_with_an_unknown_field, "RecordKeys.*batch-size: Extra inputs"),
        (_not_a_function, "decorates a function, not str"),
    ],
    ids=lambda v: getattr(v, "__name__", "fix").strip("_"),
)
def test_decorator_mistakes_raise_one_type_error_naming_the_fix(
    mistake: Callable[[], None], fix: str
) -> None:
    # Execute / Assert
    with pytest.raises(TypeError, match=fix) as raised:
        mistake()
    if mistake not in (_keys_of_another_type, _keys_with_an_unknown_field, _not_a_function):
        assert "@app.train()" in str(raised.value)


def test_the_right_order_decorates_and_registers_the_wrapped_function() -> None:
    # Prepare / Execute
    app = ClientApp()

    @app.train()
    @lbbsp_train()
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        return msg

    # Assert: what Flower registered takes (msg, context)
    assert list(inspect.signature(train, follow_wrapped=False).parameters) == ["msg", "context"]


@pytest.mark.parametrize(
    ("memory_cap", "batch_size", "reported"),
    [
        (None, 12, 50),  # no memory cap: the 50 samples drawn over
        (64, 12, 50),  # a memory cap over the data: the data
        (30, 12, 30),  # a memory cap under the data: the memory cap
        (None, 80, 50),  # a batch over the data: drawn as told, the data reported
    ],
)
def test_adapter_reports_the_local_data_as_a_cap_on_the_batch_size(
    flower_task, caplog, memory_cap, batch_size, reported
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the silo draws from 50 samples
    function, seen = _user_train()
    train = lbbsp_train(cost_model=COST, emulate_wait=False)(function)
    config = {KEYS.batch_size: batch_size, KEYS.local_steps: 2, KEYS.lr: 0.1,
              KEYS.server_round: 1}  # fmt: skip
    node = {} if memory_cap is None else {KEYS.max_batch_size: memory_cap}

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp.clients.round"):
        reply = train(_train_message(config), _context(node))

    # Assert: the batches are as instructed; the server learns the silo's cap; a batch
    # over the data is named in a warning, and only then
    assert [len(batch) for batch in seen] == [batch_size] * 2
    assert reply.content["metrics0"][KEYS.max_batch_size] == reported
    warned = [r.getMessage() for r in caplog.records if "repeats samples" in r.getMessage()]
    assert len(warned) == (1 if batch_size > 50 else 0)


@pytest.mark.parametrize(
    ("node_config", "run_config", "decorator", "threads_inside", "slowdown"),
    [
        ({}, {"slowdowns": "1;2;4"}, {}, 1, 1.0),  # partition 0 of an emulating run: k = 1
        ({"slowdown": 1.0}, {}, {}, 1, 1.0),
        ({}, {}, {"slowdowns": "1;3"}, 1, 1.0),
        ({"partition-id": 1}, {"slowdowns": "1;2;4"}, {}, 1, 2.0),
        ({}, {}, {}, 2, None),  # no emulation asked: the user's threads, the plain round
    ],
    ids=["k1-run-config", "k1-node-config", "k1-decorator", "k2", "not-emulated"],
)
def test_an_emulating_run_computes_every_silo_on_one_torch_thread(
    node_config: dict[str, Any],
    run_config: dict[str, Any],
    decorator: dict[str, Any],
    threads_inside: int,
    slowdown: float | None,
    flower_task: None,
) -> None:
    # Prepare: the process runs torch on 2 threads (as a Ray actor of num_cpus 2 does)
    seen: list[int] = []
    function, _ = _user_train()

    def train_fn(msg: Message, context: Context, plan: LocalTraining) -> Message:
        seen.append(torch.get_num_threads())
        return function(msg, context, plan)

    train = lbbsp_train(emulate_wait=False, **decorator)(train_fn)
    config = {KEYS.batch_size: 4, KEYS.local_steps: 2, KEYS.lr: 0.1, KEYS.server_round: 1}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        # Execute
        reply = train(_train_message(config), _context(node_config, run_config))
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

    # Assert: one thread while computing (k = 1 silos of an emulating run too), the
    # process's threads given back, the slowdown reported by every emulated silo
    assert seen == [threads_inside] and after == 2
    assert reply.content["metrics0"].get("slowdown") == slowdown
