"""Runners resolve once: a run's checkpoint is read and restored before round 1 and not
again, and a silo resolves its node (data, slowdown, keys) at its first message only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_lbbsp.clients.app import SiloApp, SiloSetup, make_client_app, silo_data
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.engine import execute
from fl_lbbsp.runs.fl import SimulationConfig, resolve, run
from fl_lbbsp.security.silo_keys import write_silo_keys
from fl_lbbsp.strategies.checkpoint import CheckpointStore

pytestmark = pytest.mark.usefixtures("flower_task")


def _config(tmp_path: Path, rounds: int) -> SimulationConfig:
    return SimulationConfig(
        silos=3,
        rounds=rounds,
        local_steps=2,
        model="mlp",
        partition="iid",
        runtime="inprocess",
        emulate_wait=False,
        cost_model="0.001,0.01",
        out=tmp_path / "out",
        checkpoint_dir=tmp_path / "checkpoints",
    )


def _train_rounds(events: list[dict[str, Any]]) -> list[int]:
    return [int(e["round"]) for e in events if e.get("event") == "train"]


def test_a_resumed_run_reads_its_checkpoint_once_before_round_1(tmp_path: Path) -> None:
    # Prepare: two rounds run and checkpointed; a rerun of three resolved
    run(_config(tmp_path, rounds=2))
    resolved = resolve(_config(tmp_path, rounds=3))
    store = CheckpointStore(tmp_path / "checkpoints" / "lbbsp")

    # Execute: the checkpoint files vanish between the resolution and round 1
    for server_round in store.rounds():
        for file in store.directory.glob(f"*{server_round}*"):
            file.unlink()
    events = execute(resolved, runtime="inprocess")

    # Assert: the run resumed from the point resolved (round 3 alone ran), not afresh
    assert resolved.resume is not None and resolved.resume.server_round == 2
    assert _train_rounds(events) == [1, 2, 3]
    assert store.rounds() == [3]


def test_a_fresh_run_resolves_no_resume_point(tmp_path: Path) -> None:
    # Execute
    resolved = resolve(_config(tmp_path, rounds=1))

    # Assert
    assert resolved.resume is None


def _train_message(setup: SiloSetup) -> Message:
    data = silo_data(setup, 0)
    torch.manual_seed(0)
    model = build_model(setup.model, input_shape=data.input_shape, num_classes=data.num_classes)
    config = {"batch-size": 8, "local-steps": 2, "lr": 0.05, "server-round": 1}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(config)}
    )
    return Message(content=content, dst_node_id=7, message_type="train")


def _context(partition: int) -> Context:
    return Context(
        run_id=1,
        node_id=7 + partition,
        node_config={"partition-id": partition},
        state=RecordDict(),
        run_config={},
    )


def test_a_silo_loads_its_signing_key_at_its_first_message_only(tmp_path: Path) -> None:
    # Prepare: silo 0 signs with its key file, which is gone after its first message
    files = write_silo_keys(tmp_path / "keys", ["0", "1"])
    setup = SiloSetup(num_silos=2, model="mlp", signing_key=str(tmp_path / "keys"))
    app, context = make_client_app(setup), _context(0)
    app(_train_message(setup), context)
    files.keys["0"].unlink()

    # Execute
    reply = app(_train_message(setup), context)

    # Assert: still signed, with the key loaded at the first message
    assert not reply.has_error()
    assert reply.content["silo"]["signature"]


@pytest.mark.parametrize(
    ("node_config", "partition", "silo_id"),
    [({"partition-id": 1}, 1, "1"), ({"partition-id": 0, "silo-id": "a"}, 0, "a")],
    ids=["partition", "silo-id"],
)
def test_a_silo_node_is_resolved_once_from_its_node_config(
    node_config: dict[str, Any], partition: int, silo_id: str
) -> None:
    # Prepare
    silo = SiloApp(SiloSetup(num_silos=2, model="mlp"))
    context = Context(
        run_id=1, node_id=3, node_config=node_config, state=RecordDict(), run_config={}
    )

    # Execute
    first, again = silo.node(context), silo.node(context)

    # Assert
    assert first is again
    assert (first.partition_id, first.silo_id) == (partition, silo_id)
