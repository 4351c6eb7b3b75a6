"""A silo that runs out of memory at the batch size it was sent: the silo's error reply
names the size, the server caps the silo at a size known to fit instead of sending it
again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from pydantic import ValidationError

from fl_lbbsp.clients import lbbsp_train
from fl_lbbsp.clients.round import LocalTraining, WorkDone, run_round
from fl_lbbsp.contract import (
    BatchSizeOutOfMemoryError,
    RecordKeys,
    is_out_of_memory,
    out_of_memory_batch_size,
)
from fl_lbbsp.core import BatchSizeBalancer, SiloReport
from fl_lbbsp.core.round.engine import EngineState
from fl_lbbsp.core.round.memory_caps import MemoryCaps
from fl_lbbsp.core.settings import BalancingKnobs
from fl_lbbsp.instruction import RoundInstruction
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.telemetry import read_telemetry

KEYS = RecordKeys()

INSTRUCTION = RoundInstruction(batch_size=48, local_steps=2, lr=0.1, server_round=3)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (MemoryError("no room"), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("MPS backend out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_memory_failures_are_told_from_other_errors(error: Exception, expected: bool) -> None:
    # Execute / Assert
    assert is_out_of_memory(error) is expected


@pytest.mark.parametrize(
    "cause", [MemoryError("no room"), torch.OutOfMemoryError("CUDA out of memory")]
)
def test_a_round_out_of_memory_raises_an_error_naming_its_batch_size(cause: Exception) -> None:
    # Prepare
    def work(plan: LocalTraining) -> WorkDone[None]:
        list(plan.batch_sampler(100))
        raise cause

    # Execute
    with pytest.raises(BatchSizeOutOfMemoryError) as caught:
        run_round(INSTRUCTION, work, silo_id="s")

    # Assert: the text Flower carries to the server names the size, and what failed
    reason = f"{type(caught.value).__name__}:<'{caught.value}'>"  # Flower's error reason
    assert out_of_memory_batch_size(reason) == 48
    assert type(cause).__name__ in str(caught.value) and caught.value.__cause__ is cause


def test_other_errors_of_a_round_pass_through_unchanged() -> None:
    # Prepare
    def work(plan: LocalTraining) -> WorkDone[None]:
        raise KeyError("label")

    # Execute / Assert
    with pytest.raises(KeyError):
        run_round(INSTRUCTION, work, silo_id="s")


@pytest.mark.parametrize(
    "reason", ["", "MemoryError: no room", "lbbsp: out of memory at batch size", "ValueError: 3"]
)
def test_replies_that_name_no_failed_size_give_none(reason: str) -> None:
    # Execute / Assert
    assert out_of_memory_batch_size(reason) is None


@pytest.mark.parametrize(
    ("completed", "failed", "cap"),
    [
        ([], 64, 32),  # nothing known to fit: half
        ([16, 40, 24], 64, 40),  # the largest size that ran below the failure
        ([16, 80], 64, 32),  # it ran at 80 once (memory shrank since): half
        ([], 1, 1),  # never below 1
    ],
)
def test_the_cap_is_a_size_known_to_fit_or_half(
    completed: list[int], failed: int, cap: int
) -> None:
    # Prepare
    caps = MemoryCaps()
    for size in completed:
        caps.ran("a", size)

    # Execute / Assert
    assert caps.failed("a", failed) == cap and caps.caps == {"a": cap}


def test_the_cap_only_falls_and_survives_a_checkpoint() -> None:
    # Prepare
    caps = MemoryCaps()
    caps.ran("a", 20)
    caps.failed("a", 30)

    # Execute: a later failure above the cap (a stale instruction) does not raise it
    caps.failed("a", 64)
    restored = MemoryCaps()
    restored.load_state_dict(caps.state_dict())

    # Assert
    assert caps.caps == {"a": 20} and restored.caps == {"a": 20}
    assert restored.completed == {"a": 20}


@pytest.mark.parametrize(
    "state",
    [{"caps": {"a": 0}}, {"caps": {"a": 2.5}}, {"completed": {"a": -1}}, {"caps": {"a": True}}],
)
def test_a_checkpoint_with_bad_caps_is_refused(state: dict[str, Any]) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="valid integer|greater than or equal to 1"):
        MemoryCaps().load_state_dict(state)


def test_the_balancer_keeps_a_learned_cap_and_gives_the_rest_to_the_others() -> None:
    # Prepare: silo "a" is the fastest by far
    balancer = BatchSizeBalancer(initial_batch_size=32, knobs=BalancingKnobs(max_change_ratio=None))
    speeds = {"a": 8.0, "b": 1.0, "c": 1.0}
    for _ in range(3):
        balancer.report_round(
            {s: SiloReport(batch_size=32, train_time=32 / v) for s, v in speeds.items()}
        )
    free = balancer.allocate(speeds)

    # Execute
    capped = balancer.allocate(speeds, caps={"a": 20})

    # Assert: uncapped, "a" takes most of X = 96; capped, it gets 20 and the others the rest
    assert free["a"] > 20
    assert capped["a"] == 20 and sum(capped.values()) == 96


LIMIT = 24
"""Silo 0's memory holds batches of at most this many samples."""


def _app_short_of_memory() -> ClientApp:
    """A Message-API app whose silo 0 (the fastest) fails above ``LIMIT``."""
    app = ClientApp()

    @app.train()
    @lbbsp_train()
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        if context.node_config["partition-id"] == 0 and plan.batch_size > LIMIT:
            raise MemoryError(f"cannot allocate a batch of {plan.batch_size}")
        with plan.timed():
            list(plan.batch_sampler(200))
        content = RecordDict(
            {"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 200})}
        )
        return Message(content=content, reply_to=msg)

    return app


def test_a_silo_out_of_memory_misses_one_round_then_runs_capped(tmp_path: Path) -> None:
    # Prepare: silo 0 is 4 times as fast as the others; B_init 16 runs, 32 would not
    grid = InProcessGrid(
        _app_short_of_memory(), num_nodes=3,
        run_config={"slowdowns": "1;4;4", "cost-model": "0.001,0.002"},
    )  # fmt: skip
    telemetry = tmp_path / "telemetry.jsonl"
    strategy = LBBSPFedAvg(
        initial_batch_size=16, local_steps=2, lr=0.1, fraction_evaluate=0.0,
        min_train_nodes=2, min_available_nodes=3, telemetry_path=telemetry,
    )  # fmt: skip
    arrays = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})

    # Execute
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=5, timeout=600)

    # Assert: silo 0 fails once, at the size it was sent, then runs every round at the
    # size it ran before (16), the other silos taking the rest of X = 48
    rounds = [e for e in read_telemetry(telemetry) if e["event"] == "train"]
    failed = [r for r, e in enumerate(rounds) if e["rejected"]]
    assert len(failed) == 1 and failed[0] >= 1
    assert "out of memory at batch size" in rounds[failed[0]]["rejected"][0]["reason"]
    for event in rounds[failed[0] + 1 :]:
        assert event["rejected"] == [] and event["silos"]["0"][KEYS.batch_size] == 16
        assert sum(row[KEYS.batch_size] for row in event["silos"].values()) == 48
    # the cap goes into a checkpoint through its schema, and a bad one does not
    state = strategy.engine.state_dict()
    assert state.memory.caps == {"0": 16}
    with pytest.raises(ValidationError):
        EngineState.model_validate({**state.model_dump(), "memory": {"caps": {"0": 0}}})
