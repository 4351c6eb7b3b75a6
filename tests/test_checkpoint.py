"""Checkpoints and resume: a restarted server continues with the same batch sizes, round
numbers and model as a run that was never interrupted (FL, cluster with momentum, CKKS)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FakeGrid
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Result
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.cli import main
from fl_lbbsp.clients.app import SiloSetup, make_client_app
from fl_lbbsp.clients.cluster import WorkerSetup, make_worker_app
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.fl import SimulationConfig, make_strategy
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPCluster, LBBSPFedAvg
from fl_lbbsp.strategies.checkpoint import CheckpointError, CheckpointStore
from fl_lbbsp.strategies.checkpointing import save_checkpoint
from fl_lbbsp.telemetry import start_telemetry

pytestmark = pytest.mark.usefixtures("flower_task")

SPEEDS = (4000.0, 2000.0, 1000.0)  # samples per second reported by silos 0, 1, 2
FL = {
    "initial_batch_size": 16,
    "local_steps": 3,
    "lr": 0.05,
    "min_train_nodes": 3,
    "min_available_nodes": 3,
    "min_evaluate_nodes": 3,
}


class _ServerKilledError(RuntimeError):
    """The server process dying mid-round."""


def _steady(app: ClientApp, configs: list[dict[str, Any]] | None = None) -> ClientApp:
    """``app`` whose silos report ``train-time = samples / SPEEDS[silo]`` (and a fixed
    ``he-time``), so that batch sizes do not depend on this machine's timing noise; the
    train configs received are appended to ``configs``."""
    steady = ClientApp()

    @steady.train()
    def train(msg: Message, context: Context) -> Message:
        if configs is not None:
            configs.append(dict(msg.content["config"]))
        reply = app(msg, context)
        metrics = reply.content["metrics"]
        speed = SPEEDS[int(context.node_config["partition-id"])]
        metrics["train-time"] = float(metrics["samples-processed"]) / speed  # type: ignore[arg-type]
        if "he-time" in metrics:
            metrics["he-time"] = 0.01
        return reply

    @steady.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return app(msg, context)

    return steady


def _initial(model: str = "mlp", *, seed: int = 0) -> ArrayRecord:
    torch.manual_seed(seed)
    return ArrayRecord(build_model(model, input_shape=(1, 32, 32), num_classes=10).state_dict())


def _lenet(*, seed: int = 0) -> ArrayRecord:
    return _initial("lenet5", seed=seed)


def _start(
    strategy: LBBSPFedAvg, grid: InProcessGrid | ClientApp, rounds: int, initial: ArrayRecord
) -> Result:
    """Run ``strategy`` on ``grid`` (or on a new grid of three nodes running the app)."""
    if isinstance(grid, ClientApp):
        grid = InProcessGrid(grid, num_nodes=3)
    return strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)


def _trains(path: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in events if e["event"] == "train"]


@dataclass
class _Runs:
    whole: Result
    resumed: Result
    whole_log: Path
    resumed_log: Path
    whole_grid: InProcessGrid
    resumed_grid: InProcessGrid


def _interrupted_and_whole(
    make: Callable[..., LBBSPFedAvg],
    app: ClientApp,
    tmp_path: Path,
    *,
    rounds: int,
    stop: int,
    initial: Callable[..., ArrayRecord] = _initial,
) -> _Runs:
    """A whole run of ``rounds``, and one stopped after ``stop`` rounds then restarted
    (new strategy, other initial arrays) on the same checkpoint folder; the silos keep
    running (the same nodes) while the server restarts."""
    whole_log, resumed_log = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    whole_grid, grid = InProcessGrid(app, num_nodes=3), InProcessGrid(app, num_nodes=3)
    whole = _start(make(telemetry_path=whole_log), whole_grid, rounds, initial())
    folder = tmp_path / "ckpt"
    _start(make(checkpoint_dir=folder, telemetry_path=resumed_log), grid, stop, initial())
    resumed = _start(
        make(checkpoint_dir=folder, telemetry_path=resumed_log), grid, rounds, initial(seed=1)
    )
    return _Runs(whole, resumed, whole_log, resumed_log, whole_grid, grid)


def _assert_same_run(whole: Result, resumed: Result, whole_log: Path, resumed_log: Path) -> None:
    expected, got = _trains(whole_log), _trains(resumed_log)
    assert [e["round"] for e in got] == [e["round"] for e in expected]
    assert [e["sent"] for e in got] == [e["sent"] for e in expected]
    assert len({tuple(e["sent"].values()) for e in expected}) > 1  # balancing moved them
    assert list(whole.arrays.keys()) == list(resumed.arrays.keys())
    for name in whole.arrays:
        np.testing.assert_allclose(
            resumed.arrays[name].numpy(), whole.arrays[name].numpy(), rtol=0, atol=1e-6
        )


# ------------------------------------------------------------------------ resume
def test_fl_run_resumed_after_a_crash_matches_the_uninterrupted_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the server dies while writing round 3's checkpoint (after its telemetry)
    app = _steady(make_client_app(SiloSetup(num_silos=3, model="mlp")))

    def make(**kwargs: Any) -> LBBSPFedAvg:
        return LBBSPFedAvg(fraction_evaluate=0.0, **FL, **kwargs)

    whole = _start(make(telemetry_path=tmp_path / "whole.jsonl"), app, 4, _initial())
    folder, telemetry = tmp_path / "ckpt", tmp_path / "resumed.jsonl"
    save = CheckpointStore.save

    def crash_in_round_3(self, server_round, **kwargs):  # type: ignore[no-untyped-def]
        if server_round == 3:
            raise _ServerKilledError
        return save(self, server_round, **kwargs)

    monkeypatch.setattr(CheckpointStore, "save", crash_in_round_3)
    with pytest.raises(_ServerKilledError):
        _start(make(checkpoint_dir=folder, telemetry_path=telemetry), app, 4, _initial())
    monkeypatch.setattr(CheckpointStore, "save", save)

    # Execute: a new server process on the same folder
    resumed = _start(
        make(checkpoint_dir=folder, telemetry_path=telemetry), app, 4, _initial(seed=1)
    )

    # Assert: rounds 3 and 4 again, once each in the telemetry, as if never interrupted
    assert sorted(resumed.train_metrics_clientapp) == [3, 4]
    _assert_same_run(whole, resumed, tmp_path / "whole.jsonl", telemetry)
    assert CheckpointStore(folder).rounds() == [3, 4]


def test_cluster_resume_restores_the_momentum_buffers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: GPU-shaped cost models (deterministic times), momentum 0.9
    setup = WorkerSetup(
        num_workers=3, model="mlp", slowdowns=("1", "2", "4"), cost_models=("0.001,0.002",) * 3
    )

    def make(**kwargs: Any) -> LBBSPCluster:
        return LBBSPCluster(
            initial_batch_size=16, lr=0.05, momentum=0.9, min_train_nodes=3,
            min_available_nodes=3, **kwargs,
        )  # fmt: skip

    # Execute
    runs = _interrupted_and_whole(make, make_worker_app(setup), tmp_path, rounds=5, stop=3)

    # Assert
    assert sorted(runs.resumed.train_metrics_clientapp) == [4, 5]
    _assert_same_run(runs.whole, runs.resumed, runs.whole_log, runs.resumed_log)
    saved = CheckpointStore(tmp_path / "ckpt").latest()
    assert saved is not None and saved.server_round == 5
    assert len(saved.records["optimizer"]) == len(runs.whole.arrays)


def test_encrypted_resume_continues_from_the_encrypted_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    pytest.importorskip("tenseal")
    from fl_lbbsp.crypto import decrypt_update, generate_keys, load_silo_keys, write_key_files
    from fl_lbbsp.crypto.records import is_encrypted, update_from_record
    from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg

    files = write_key_files(generate_keys(), tmp_path / "keys")
    setup = SiloSetup(num_silos=3, model="mlp", secret_context=str(files.secret))

    def make(**kwargs: Any) -> EncryptedLBBSPFedAvg:
        return EncryptedLBBSPFedAvg(
            public_context=files.public, fraction_evaluate=0.0, **FL, **kwargs
        )

    configs: list[dict[str, Any]] = []

    # Execute
    runs = _interrupted_and_whole(
        make, _steady(make_client_app(setup), configs), tmp_path, rounds=3, stop=2
    )

    # Assert: same batch sizes and, in round 3, the same weights applied by the server
    # (the silos' pinned dataset sizes were restored); the decrypted models agree up to
    # CKKS noise
    expected, got = _trains(runs.whole_log), _trains(runs.resumed_log)
    assert [e["round"] for e in got] == [1, 2, 3]
    assert [e["sent"] for e in got] == [e["sent"] for e in expected]
    assert is_encrypted(runs.resumed.arrays)
    weights = [update_from_record(r.arrays).weight for r in (runs.whole, runs.resumed)]
    assert weights[0] == weights[1] > 3
    keys = load_silo_keys(files.secret)
    a = decrypt_update(keys, update_from_record(runs.whole.arrays))
    b = decrypt_update(keys, update_from_record(runs.resumed.arrays))
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-3)
    assert not np.allclose(a, 0.0)


def test_encrypted_cluster_resume_keeps_the_workers_replicas_in_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: workers keep their model replicas while the server restarts; proportional
    # allocation (the measured he-time would move the linear allocator's sizes)
    pytest.importorskip("tenseal")
    from fl_lbbsp.crypto import generate_keys, write_key_files
    from fl_lbbsp.strategies.encrypted_cluster import EncryptedLBBSPCluster

    files = write_key_files(generate_keys(), tmp_path / "keys")
    setup = WorkerSetup(
        num_workers=3, slowdowns=("1", "2", "4"), cost_models=("0.001",) * 3,
        secret_context=str(files.secret),
    )  # fmt: skip

    def make(**kwargs: Any) -> EncryptedLBBSPCluster:
        return EncryptedLBBSPCluster(
            public_context=files.public, initial_batch_size=16, lr=0.1, momentum=0.5,
            allocator="proportional", min_train_nodes=3, min_available_nodes=3, **kwargs,
        )  # fmt: skip

    # Execute
    runs = _interrupted_and_whole(
        make, make_worker_app(setup), tmp_path, rounds=4, stop=2, initial=_lenet
    )

    # Assert: same batch sizes, no worker error, and every replica equals the
    # uninterrupted run's (up to CKKS noise) although start got other initial arrays
    expected, got = _trains(runs.whole_log), _trains(runs.resumed_log)
    assert [e["sent"] for e in got] == [e["sent"] for e in expected]
    assert all(t.error is None for t in runs.resumed_grid.transfers)
    sent = [
        sum(t.sent_bytes for t in grid.transfers if t.message_type == "train")
        for grid in (runs.whole_grid, runs.resumed_grid)
    ]
    assert sent[1] < 1.2 * sent[0]  # only the missing aggregate went out, not the history
    replicas = [
        {name: a.numpy() for name, a in grid._contexts[node].state["replica"].items()}
        for grid in (runs.whole_grid, runs.resumed_grid)
        for node in (100, 101, 102)
    ]
    for replica in replicas[1:]:
        for name, value in replica.items():
            np.testing.assert_allclose(value, replicas[0][name], rtol=0, atol=1e-4)
    saved = CheckpointStore(tmp_path / "ckpt").latest()
    assert saved is not None and saved.state["updates"]["version"] == 4
    assert sorted(saved.records) == ["aggregate-1", "aggregate-2", "aggregate-3", "aggregate-4",
                                     "initial-model"]  # fmt: skip


def test_a_finished_run_is_not_run_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    app = _steady(make_client_app(SiloSetup(num_silos=3, model="mlp")))

    def make() -> LBBSPFedAvg:
        return LBBSPFedAvg(fraction_evaluate=0.0, checkpoint_dir=tmp_path, **FL)

    first = _start(make(), app, 2, _initial())
    grid = InProcessGrid(app, num_nodes=3)

    # Execute
    again = make().start(grid=grid, initial_arrays=_initial(seed=1), num_rounds=2)

    # Assert: the saved model, and no message sent
    assert grid.transfers == []
    for name in first.arrays:
        np.testing.assert_array_equal(again.arrays[name].numpy(), first.arrays[name].numpy())


# ------------------------------------------------------------------- the files
def _saved(tmp_path: Path, rounds: int, **kwargs: Any) -> CheckpointStore:
    """A strategy's checkpoints of rounds 1..rounds, with a growing model."""
    strategy = LBBSPFedAvg(**FL, **kwargs)
    store = CheckpointStore(tmp_path)
    for server_round in range(1, rounds + 1):
        arrays = ArrayRecord({"w": Array(np.full(3, server_round, dtype=np.float32))})
        save_checkpoint(store, strategy, server_round, arrays)
    return store


def test_the_newest_two_checkpoints_are_kept_and_nothing_else(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Execute
    store = _saved(tmp_path, 4)

    # Assert
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-000003.ckpt", "round-000004.ckpt"]
    latest = store.latest()
    assert latest is not None and latest.server_round == 4
    assert latest.manifest["format"] == 2 and latest.manifest["strategy"] == "LBBSPFedAvg"
    assert latest.manifest["settings"]["balancing"]["initial_batch_size"] == 16
    np.testing.assert_array_equal(latest.arrays["w"].numpy(), np.full(3, 4.0))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    # Prepare: one byte of the newest file flipped
    store = _saved(tmp_path, 3)
    data = bytearray(store.path(3).read_bytes())
    data[-5] ^= 0xFF
    store.path(3).write_bytes(bytes(data))

    # Execute
    with caplog.at_level(logging.WARNING, logger="fl_lbbsp"):
        latest = store.latest()

    # Assert
    assert latest is not None and latest.server_round == 2
    assert "round-000003.ckpt" in caplog.text and "damaged" in caplog.text
    store.path(2).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        store.latest()


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: LBBSPFedAvg(**FL, checkpoint_dir=d, allocator="proportional"), "allocator="),
        (lambda d: LBBSPFedAvg(**FL, checkpoint_dir=d, balance=False), "scheme='lbbsp'"),
        (lambda d: LBBSPFedAvg(**{**FL, "lr": 0.1}, checkpoint_dir=d), "lr=0.05"),
        (lambda d: LBBSPCluster(initial_batch_size=16, lr=0.05, checkpoint_dir=d), "strategy="),
    ],
)
def test_a_checkpoint_of_other_settings_is_refused(tmp_path, make, named) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    _saved(tmp_path, 1)
    strategy = make(tmp_path)

    # Execute / Assert: refused before anything is sent
    with pytest.raises(CheckpointError, match=named):
        strategy.start(grid=FakeGrid([1, 2, 3]), initial_arrays=_initial(), num_rounds=3)


# ------------------------------------------------------------------------- CLI
def test_cli_refuses_a_checkpoint_of_other_settings_before_starting(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a checkpoint of an LB-BSP run with the linear allocator
    folder = tmp_path / "ckpt"
    config = SimulationConfig(silos=3, model="mlp", out=tmp_path, checkpoint_dir=folder)
    path = config.checkpoint_path()
    assert path is not None
    save_checkpoint(CheckpointStore(path), make_strategy(config), 1, _initial())
    argv = ["simulate", "--silos", "3", "--model", "mlp", "--out", str(tmp_path)]

    # Execute: the same run with the proportional allocator
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--allocator", "proportional", "--checkpoint-dir", str(folder)])

    # Assert
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "--checkpoint-dir" in err and "allocator='linear'" in err
    assert "Traceback" not in err


def test_a_resumed_run_keeps_its_telemetry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    path = tmp_path / "lbbsp.jsonl"
    config = SimulationConfig(out=tmp_path)
    start_telemetry(path, config)
    path.write_text(path.read_text() + json.dumps({"event": "train", "round": 1}) + "\n")

    # Execute
    start_telemetry(path, config, resume=True)
    kept = path.read_text()
    start_telemetry(path, config)

    # Assert: resumed, the events stay; a fresh run starts over with the config
    assert [json.loads(line)["event"] for line in kept.splitlines()] == ["config", "train"]
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["config"]


def _telemetry(path: Path, rounds: range) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"event": "train", "round": r}) + "\n" for r in rounds))
    return path


def test_a_resume_into_an_output_folder_behind_the_checkpoint_is_refused(tmp_path: Path) -> None:
    # Prepare: a run recorded with folder a (rounds 1-10), resumed into folder b, where
    # its telemetry was copied and went on to round 12
    from fl_lbbsp.runs.resume import RunRecord

    a = _telemetry(tmp_path / "a" / "lbbsp.jsonl", range(1, 11))
    ckpt, settings = tmp_path / "ckpt", {"seed": 0}
    ckpt.mkdir()
    RunRecord(directory=ckpt, settings=settings, telemetry=a).write()
    second = RunRecord(directory=ckpt, settings=settings, telemetry=tmp_path / "b" / "lbbsp.jsonl")
    second.keep(second.check_same(), after_round=10)
    _telemetry(second.telemetry, range(1, 13))

    # Execute: the next resume, after round 12, back into folder a
    third = RunRecord(directory=ckpt, settings=settings, telemetry=a)
    with pytest.raises(CheckpointError) as refused:
        third.keep(third.check_same(), after_round=12)

    # Assert: refused, naming the folder that holds rounds 11-12 (the report would have
    # had a gap); resuming there is accepted
    assert "ends at round 10" in str(refused.value) and str(tmp_path / "b") in str(refused.value)
    fourth = RunRecord(directory=ckpt, settings=settings, telemetry=second.telemetry)
    fourth.keep(fourth.check_same(), after_round=12)


def test_a_checkpoint_of_an_older_format_is_refused_with_one_line(tmp_path: Path) -> None:
    # Prepare: the round-2 checkpoint a parameter server wrote with fl_lbbsp ae7511b
    # (format 1: Flower's protobuf of a RecordDict; tests/checkpoint_fixture.py)
    from checkpoint_fixture import SETTINGS

    from fl_lbbsp.strategies.checkpoint import CheckpointInvalidError
    from fl_lbbsp.strategies.checkpointing import resume_from

    fixture = Path(__file__).parent / "data" / "checkpoint-before-engine"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "round-000002.ckpt").write_bytes((fixture / "round-000002.ckpt").read_bytes())
    strategy = LBBSPCluster(**SETTINGS, checkpoint_dir=folder)

    # Execute / Assert: refused, never skipped, in one line that says what to do
    with pytest.raises(CheckpointInvalidError, match="older fl_lbbsp .format 1.") as info:
        resume_from(strategy)
    assert "\n" not in str(info.value) and "another checkpoint dir" in str(info.value)


# ------------------------------------------------------------ the file format
DTYPES = ["float32", "float64", "int64", "uint8"]


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
    flip=st.floats(0, 1, exclude_max=True),
    keyed=st.booleans(),
)
def test_every_model_round_trips_and_every_flipped_byte_is_caught(
    tmp_path_factory: pytest.TempPathFactory,
    shapes: list[list[int]],
    dtypes: list[str],
    seed: int,
    flip: float,
    keyed: bool,
) -> None:
    # Prepare: a model of any layout, the checkpoint of a strategy that ran no round
    rng = np.random.default_rng(seed)
    model = {
        f"layer.{i}": np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=False))
    }
    folder = tmp_path_factory.mktemp("codec")
    store = CheckpointStore(folder, key=b"k" * 32 if keyed else None)
    record = ArrayRecord({name: Array(values) for name, values in model.items()})
    path = save_checkpoint(store, LBBSPFedAvg(**FL), 1, record)

    # Execute
    loaded = store.load(path)
    data = bytearray(path.read_bytes())
    data[int(flip * len(data))] ^= 0x01
    path.write_bytes(bytes(data))

    # Assert: the same names, dtypes, shapes and bits; any flipped byte refused
    assert list(loaded.arrays) == list(model)
    for name, values in model.items():
        got = loaded.arrays[name].numpy()
        assert got.dtype == values.dtype and got.shape == values.shape
        assert got.tobytes() == values.tobytes()
    with pytest.raises(CheckpointError):
        store.load(path)
