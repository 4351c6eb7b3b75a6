"""Failures that name the real cause (issue 38): an app that ran undecorated (or a stale
SuperLink running an older one), a forgotten decorator, and a silo that is not balanced
counted as such, not as left out. In process, injected times."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.clients import LocalTraining
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.outcomes import NoUpdateError

B_INIT, TAU = 16, 5


@pytest.fixture
def flwr_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture Flower's logger (it does not propagate) and fl_lbbsp's (a quiet CLI run
    earlier in the suite may have stopped it from propagating and raised its level)."""
    loggers = [logging.getLogger("flwr"), logging.getLogger("fl_lbbsp")]
    filters = {logger.name: list(logger.filters) for logger in loggers}
    for logger in loggers:
        logger.addHandler(caplog.handler)
        caplog.set_level(logging.INFO, logger=logger.name)
        for kept in filters[logger.name]:  # a CLI run's filters (below WARNING) stay on
            logger.removeFilter(kept)
    yield caplog
    for logger in loggers:
        logger.removeHandler(caplog.handler)
        for kept in filters[logger.name]:
            logger.addFilter(kept)


def _moved(msg: Message) -> ArrayRecord:
    arrays = msg.content.array_records["arrays"]
    return ArrayRecord({k: Array(a.numpy() + np.float32(1)) for k, a in arrays.items()})


def _fedavg_app() -> ClientApp:
    """A FedAvg app's ClientApp, as a stale SuperLink keeps running it: its own metrics,
    no silo id, no train-time."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        metrics = MetricRecord({"train_loss": 0.5, "num-examples": 100})
        return Message(RecordDict({"arrays": _moved(msg), "metrics": metrics}), reply_to=msg)

    return app


def _forgotten_decorator_app() -> ClientApp:
    """The README's train function with its plan, under @app.train() but without
    @lbbsp_train()."""
    app = ClientApp()

    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        raise AssertionError("never called with a plan")

    app.train()(train)  # type: ignore[arg-type]
    return app


def _misusing_app() -> ClientApp:
    """Honest silos, silo 2 drawing its own batches (a misuse note)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])
        b = int(msg.content.config_records["config"]["batch-size"])  # type: ignore[arg-type]
        metrics = MetricRecord(
            {
                "num-examples": 100,
                "train-time": (partition + 1) * 0.001 * b * TAU,
                "batch-size": b,
                "samples-processed": b * TAU,
            }
        )
        silo: dict[str, Any] = {"silo-id": str(partition)}
        if partition == 2:
            silo["misuse"] = "the train function drew no batch through plan.batch_sampler"
        content = RecordDict(
            {"arrays": _moved(msg), "metrics": metrics, "silo": ConfigRecord(silo)}
        )
        return Message(content, reply_to=msg)

    return app


def _run(app: ClientApp, rounds: int) -> Any:
    strategy = LBBSPFedAvg(
        initial_batch_size=B_INIT,
        local_steps=TAU,
        lr=0.1,
        fraction_evaluate=0.0,
        min_train_nodes=3,
        min_available_nodes=3,
        deadline_margin=None,
    )
    initial = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})
    return strategy.start(
        grid=InProcessGrid(app, num_nodes=3), initial_arrays=initial, num_rounds=rounds
    )


@pytest.mark.parametrize(
    ("app", "named"),
    [
        (_fedavg_app, ["not decorated with @lbbsp_train()", "flower-superlink", "kill <pid>"]),
        (
            _forgotten_decorator_app,
            ["TypeError: the train function takes 'plan' but is not decorated", "@app.train()"],
        ),
    ],
    ids=["undecorated-or-stale-superlink", "forgotten-decorator"],
)
def test_a_run_that_never_reached_the_decorator_says_why(
    app: Callable[[], ClientApp], named: list[str]
) -> None:
    # Execute / Assert: the run stops, its error naming the causes and the fixes
    with pytest.raises(NoUpdateError) as stopped:
        _run(app(), rounds=2)
    for text in named:
        assert text in str(stopped.value)


def test_a_silo_that_is_not_balanced_is_not_counted_as_left_out(
    flwr_log: pytest.LogCaptureFixture,
) -> None:
    # Execute
    _run(_misusing_app(), rounds=2)

    # Assert: the round's line says silo 2 is not balanced, and that nobody is left out
    lines = list(
        {
            id(r): r.getMessage()
            for r in flwr_log.records
            if r.getMessage().startswith("[lbbsp] round 2")
        }.values()
    )
    assert len(lines) == 1
    assert "left out: none" in lines[0] and "not balanced: 2 (" in lines[0]


def test_each_round_is_one_info_line_naming_the_silos_from_round_1(
    flwr_log: pytest.LogCaptureFixture,
) -> None:
    # Prepare: fl_lbbsp's logger too
    ours = logging.getLogger("fl_lbbsp")
    ours.addHandler(flwr_log.handler)

    # Execute
    try:
        _run(_misusing_app(), rounds=2)
    finally:
        ours.removeHandler(flwr_log.handler)

    # Assert: one INFO line a round, whichever logger, silos named by their ids in round 1
    for server_round in (1, 2):
        lines = {
            id(r): r.getMessage()
            for r in flwr_log.records
            if r.levelno == logging.INFO
            and f"round {server_round}" in r.getMessage()
            and "[lbbsp]" in r.getMessage()
        }
        assert len(lines) == 1, lines
    first = next(
        r.getMessage() for r in flwr_log.records if r.getMessage().startswith("[lbbsp] round 1")
    )
    assert "B 0=16 1=16 2=16" in first and "node-" not in first and "round time" in first
