"""Encrypted cluster mode: the parameter server adds CKKS-encrypted gradients, the workers
keep identical model replicas, and a worker that lost iterations catches up."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fl_lbbsp.clients.cluster import WorkerSetup, make_worker_app, worker_data
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPCluster

pytest.importorskip("tenseal")

from fl_lbbsp.crypto import generate_keys, write_key_files  # noqa: E402
from fl_lbbsp.crypto.records import is_encrypted  # noqa: E402
from fl_lbbsp.strategies import EncryptedLBBSPCluster  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task")

SETTINGS = {"initial_batch_size": 16, "lr": 0.1, "momentum": 0.5, "min_train_nodes": 3,
            "min_available_nodes": 3}  # fmt: skip


@pytest.fixture(scope="module")
def key_files(tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_key_files(generate_keys(), tmp_path_factory.mktemp("keys"))


def _initial(setup: WorkerSetup) -> ArrayRecord:
    torch.manual_seed(0)
    data = worker_data(setup, 0)
    model = build_model(setup.model, input_shape=data.input_shape, num_classes=data.num_classes)
    return ArrayRecord(model.state_dict())


def _replicas(grid: InProcessGrid) -> list[dict[str, np.ndarray]]:
    return [
        {name: a.numpy() for name, a in context.state["replica"].items()}
        for context in grid._contexts.values()
    ]


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)


def test_encrypted_cluster_matches_the_plaintext_parameter_server(key_files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: workers of emulated speeds 4:2:1 (cost models: reported times, and so the
    # balanced batch sizes, are the same in both runs), so gradients weigh unequally
    plain_setup = WorkerSetup(num_workers=3, slowdowns=("1", "2", "4"), cost_models=("0.001",) * 3)
    enc_setup = plain_setup.model_copy(update={"secret_context": str(key_files.secret)})
    plain = LBBSPCluster(allocator="proportional", **SETTINGS)
    encrypted = EncryptedLBBSPCluster(
        public_context=key_files.public, allocator="proportional", evaluate_every=2,
        telemetry_path=tmp_path / "t.jsonl", **SETTINGS,
    )  # fmt: skip
    plain_grid = InProcessGrid(make_worker_app(plain_setup), num_nodes=3)
    enc_grid = InProcessGrid(make_worker_app(enc_setup), num_nodes=3)

    # Execute
    plain_result = plain.start(grid=plain_grid, initial_arrays=_initial(plain_setup), num_rounds=4)
    enc_result = encrypted.start(grid=enc_grid, initial_arrays=_initial(enc_setup), num_rounds=4)

    # Assert: the server holds only the encrypted aggregate; every worker's replica is the
    # plaintext server's model (within CKKS noise), and the replicas are identical
    assert is_encrypted(enc_result.arrays) and encrypted.replicas.version == 4
    reference = {name: a.numpy() for name, a in plain_result.arrays.items()}
    replicas = _replicas(enc_grid)
    assert all(_max_diff(r, reference) <= 1e-4 for r in replicas)
    assert all(_max_diff(r, replicas[0]) == 0.0 for r in replicas[1:])
    assert _max_diff(replicas[0], {n: a.numpy() for n, a in _initial(enc_setup).items()}) > 1e-3
    # federated evaluation every 2 iterations; he-time reported apart from train-time
    assert sorted(enc_result.evaluate_metrics_clientapp) == [2, 4]
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    silos = [s for e in events if e["event"] == "train" for s in e["silos"].values()]
    assert len(silos) == 12 and all(s["he-time"] > 0 for s in silos)
    assert [s["batch-size"] for s in silos[-3:]] == [27, 14, 7]  # 4:2:1 of X = 48
    assert all(t.error is None for t in enc_grid.transfers)


def _crashing_app(inner: ClientApp, *, worker: int, server_round: int) -> ClientApp:
    """The worker app, except that ``worker`` crashes and loses its state in one round."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        crash = context.node_config["partition-id"] == worker
        if crash and msg.content["config"]["server-round"] == server_round:
            for name in list(context.state.keys()):
                del context.state[name]
            raise RuntimeError("worker killed")
        return inner(msg, context)

    return app


def test_worker_that_lost_its_replica_catches_up_from_the_initial_model(key_files, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: worker 1 crashes in iteration 2 and loses its replica
    setup = WorkerSetup(num_workers=3, secret_context=str(key_files.secret))
    strategy = EncryptedLBBSPCluster(public_context=key_files.public, **SETTINGS)
    grid = InProcessGrid(
        _crashing_app(make_worker_app(setup), worker=1, server_round=2), num_nodes=3
    )

    # Execute
    strategy.start(grid=grid, initial_arrays=_initial(setup), num_rounds=4)

    # Assert: iteration 2 went on with the two others; worker 1 got the initial model and
    # every aggregate in iteration 3, and all replicas agree at the end
    errors = [t for t in grid.transfers if t.error]
    assert len(errors) == 1 and "worker killed" in errors[0].error
    train = [t for t in grid.transfers if t.message_type == "train"]
    resent = [t for t in train[6:9] if t.node_id == 101][0]
    others = [t for t in train[6:9] if t.node_id != 101]
    assert resent.sent_bytes > 1.5 * max(t.sent_bytes for t in others)
    assert strategy.replicas.version == 4
    replicas = _replicas(grid)
    assert all(_max_diff(r, replicas[0]) == 0.0 for r in replicas[1:])


def test_reply_at_a_stale_model_version_is_rejected(key_files, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a worker app that reports the wrong model version
    setup = WorkerSetup(num_workers=3, secret_context=str(key_files.secret))
    inner = make_worker_app(setup)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        reply = inner(msg, context)
        if context.node_config["partition-id"] == 2:
            reply.content["metrics"]["model-version"] = 7
        return reply

    strategy = EncryptedLBBSPCluster(public_context=key_files.public, **SETTINGS)
    grid = InProcessGrid(app, num_nodes=3)

    # Execute
    strategy.start(grid=grid, initial_arrays=_initial(setup), num_rounds=1)

    # Assert
    assert strategy.replicas.version == 1
    assert "model version 7, expected 0" in fl_log.text
    assert "rejected" in fl_log.text


def test_worker_beyond_the_kept_history_is_left_out_with_a_warning(key_files, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a strategy that has produced 3 aggregates and keeps only 2
    strategy = EncryptedLBBSPCluster(public_context=key_files.public, max_history=2, **SETTINGS)
    setup = WorkerSetup(num_workers=3)
    strategy.replicas.initial = _initial(setup)
    strategy.replicas.version = 3
    strategy.replicas.aggregates = {2: ArrayRecord(), 3: ArrayRecord()}
    strategy.replicas.node_version = {100: 3, 101: 1}

    # Execute
    up_to_date, behind, fresh = (strategy.replicas.records_for(n) for n in (100, 101, 102))

    # Assert
    assert up_to_date == {}
    assert behind is not None and sorted(behind) == ["aggregate-2", "aggregate-3"]
    assert fresh is None  # would need aggregate 1, which is gone
