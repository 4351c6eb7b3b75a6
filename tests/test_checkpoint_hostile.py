"""Edited checkpoints (issue 27, item 6): an edit whose digest was recomputed is refused
before round 1 with one line naming the field, never obeyed and never a traceback; with a
checkpoint key any edit is detected, within honest ranges too."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoint_fixture import NODES, SETTINGS, replies, sent_sizes, weights
from conftest import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord

from fl_lbbsp.cli import main
from fl_lbbsp.runs.fl import SimulationConfig, make_strategy
from fl_lbbsp.strategies import LBBSPCluster
from fl_lbbsp.strategies.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointInvalidError,
    CheckpointKeyError,
    CheckpointStore,
    load_checkpoint_key,
    write_checkpoint_key,
)
from fl_lbbsp.strategies.checkpointing import resume_from, save_checkpoint

pytestmark = pytest.mark.usefixtures("flower_task")

E = "state.engine"
"""Where the engine's state is in a checkpoint's fields."""
Edit = Callable[[dict[str, Any], dict[str, Any], dict[str, np.ndarray]], None]


def _initial() -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in weights().items()})


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """The checkpoint of round 6 of a parameter server with momentum whose silos have
    cost fits, pending reports and a pooled shape (fixture replies, no training)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    try:
        strategy = LBBSPCluster(**SETTINGS)
        arrays = _initial()
        grid: Any = FakeGrid(list(NODES))
        for server_round in range(1, 7):
            messages = strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
            sent = sent_sizes(list(messages))
            after, _ = strategy.aggregate_train(server_round, replies(server_round, sent))
            assert after is not None
            arrays = after
        folder = tmp_path_factory.mktemp("rich")
        path = save_checkpoint(CheckpointStore(folder), strategy, 6, arrays)
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved
    checkpoint = CheckpointStore(folder).load(path)
    assert checkpoint.state["engine"]["balancer"]["silos"]["w11"]["fit"] is not None
    assert checkpoint.records["optimizer"]
    return checkpoint


def _resaved(source: Checkpoint, folder: Path, edit: Edit, *, key: bytes | None = None) -> Path:
    """``source`` edited by ``edit(manifest, state, arrays)`` and written again with a
    valid digest (or HMAC under ``key``): what an attacker who can write the file does."""
    manifest, state = copy.deepcopy(source.manifest), copy.deepcopy(source.state)
    arrays = {name: a.numpy().copy() for name, a in source.arrays.items()}
    edit(manifest, state, arrays)
    record = ArrayRecord({name: Array(a) for name, a in arrays.items()})
    store = CheckpointStore(folder, key=key)
    return store.save(
        source.server_round, arrays=record, manifest=manifest, state=state, records=source.records
    )


def _set(path: str, value: Any) -> Edit:
    def edit(manifest: dict[str, Any], state: dict[str, Any], arrays: Any) -> None:
        root, *keys = path.split(".")
        target = manifest if root == "manifest" else state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def _model(change: Callable[[dict[str, np.ndarray]], None]) -> Edit:
    def edit(manifest: Any, state: Any, arrays: dict[str, np.ndarray]) -> None:
        change(arrays)

    return edit


def _fill(name: str, value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = np.full_like(arrays[name], value)

    return change


def _rename(arrays: dict[str, np.ndarray]) -> None:
    arrays["x"] = arrays.pop("w")


W11 = f"{E}.balancer.silos.w11"
# Alg. 2's state (a linear allocator's checkpoint holds none) in an unknown phase
ITERATIVE_WARP = {
    "allocator": {"config": {"step": 5, "window": 5, "fine_step": 1, "fine_window": 20,
                             "memory_limit": 95.0, "refast_ratio": 1.5},
                  "phase": "warp", "sizes": {}, "times": []},
    "stepped": {},
}  # fmt: skip
# The edits (those obeyed on eb5bb71, and those that crashed with a traceback)
EDITS = [
    pytest.param(_model(_fill("w", np.nan)), "arrays.w", id="nan-model"),
    pytest.param(_model(_fill("w", 1e30)), "arrays", id="1e30-model"),
    pytest.param(_model(_rename), "arrays", id="renamed-arrays"),
    pytest.param(_set(f"{E}.claims.sizes", {"w11": 10**9}), f"{E}.claims.sizes.w11",
                 id="pinned-size-1e9"),
    pytest.param(_set(f"{E}.overhead", [1e9]), f"{E}.overhead", id="overhead-1e9"),
    pytest.param(_set(f"{E}.claims.overhead", [1e9]), f"{E}.claims.overhead",
                 id="claims-overhead-1e9"),
    pytest.param(_set(f"{W11}.fit.slope", -0.005), f"{W11}.fit.slope", id="negative-slope"),
    pytest.param(_set(f"{W11}.fit", "garbage"), f"{W11}.fit", id="fit-garbage"),
    pytest.param(_set(f"{W11}.fit.spread", [16.0, 13.0]), f"{W11}.fit", id="fit-spread"),
    pytest.param(_set(f"{E}.balancer.pooled_shape.value", float("nan")),
                 f"{E}.balancer.pooled_shape.value", id="pooled-shape-nan"),
    pytest.param(_set(f"{W11}.pending", "garbage"), f"{W11}.pending", id="pending-garbage"),
    pytest.param(_set(f"{W11}.pending", [["a", 1]]), f"{W11}.pending", id="pending-entries"),
    pytest.param(_set(f"{E}.balancer.iterative", "garbage"), f"{E}.balancer.iterative",
                 id="iterative-garbage"),
    pytest.param(_set(f"{E}.balancer.iterative", ITERATIVE_WARP),
                 f"{E}.balancer.iterative.allocator.phase", id="iterative-phase"),
    pytest.param(_set(f"{W11}.boost", 1e300), f"{E}.balancer", id="boost-1e300"),
    pytest.param(_set(f"{W11}.estimator.value", 1e300), f"{W11}.estimator.value",
                 id="speed-1e300"),
    pytest.param(_set(f"{W11}.estimator.name", "oracle"), f"{W11}.estimator.name",
                 id="estimator-name"),
    pytest.param(_set(f"{W11}.history", [[16, 1e300]]), W11, id="history-time-1e300"),
    pytest.param(_set(f"{E}.balancer.config.bogus", 1), f"{E}.balancer.config",
                 id="unknown-balancer-setting"),
    pytest.param(_set(f"{E}.balancer.silos", {"../../x": {"estimator": {"name": "ema"}}}),
                 f"{E}.balancer.silos", id="silo-id-path"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "field"), EDITS)
def test_an_edited_checkpoint_is_refused_before_round_1(
    rich: Checkpoint, tmp_path: Path, edit: Edit, field: str
) -> None:
    # Prepare: the edited file where a restarted server resumes from
    path = _resaved(rich, tmp_path, edit)
    strategy = LBBSPCluster(**SETTINGS, checkpoint_dir=tmp_path)

    # Execute
    with pytest.raises(CheckpointInvalidError) as info:
        resume_from(strategy, max_silos=3, initial_arrays=_initial())

    # Assert: one line naming the file and the field
    assert info.value.field.startswith(field), info.value.field
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_the_untouched_checkpoint_resumes_and_the_next_round_runs(
    rich: Checkpoint, tmp_path: Path
) -> None:
    # Prepare
    _resaved(rich, tmp_path, lambda m, s, a: None)
    strategy = LBBSPCluster(**SETTINGS, checkpoint_dir=tmp_path)

    # Execute
    checkpoint = resume_from(strategy, max_silos=3, initial_arrays=_initial())
    assert checkpoint is not None
    strategy.deadline_grid(FakeGrid(list(NODES)), timeout=60)  # type: ignore[arg-type]
    grid = FakeGrid(list(NODES))
    sent = sent_sizes(list(strategy.configure_train(7, checkpoint.arrays, ConfigRecord(), grid)))  # type: ignore[arg-type]
    after, _ = strategy.aggregate_train(7, replies(7, sent))

    # Assert: the fastest silo keeps most of the batch, the model moves
    assert after is not None and sent[11] > sent[12] > sent[13]


# ------------------------------------------------------------------ checkpoint key
KEY = b"k" * 32
OTHER = b"o" * 32


def test_a_keyed_checkpoint_round_trips(rich: Checkpoint, tmp_path: Path) -> None:
    # Prepare
    path = _resaved(rich, tmp_path, lambda m, s, a: None, key=KEY)

    # Execute
    loaded = CheckpointStore(tmp_path, key=KEY).load(path)

    # Assert
    assert loaded.server_round == rich.server_round and loaded.state == rich.state


@pytest.mark.parametrize(
    ("writer_key", "reader_key", "message"),
    [
        pytest.param(None, KEY, "written without a checkpoint key", id="unkeyed-file"),
        pytest.param(OTHER, KEY, "does not match the checkpoint key", id="other-key"),
        pytest.param(KEY, None, "give the same key", id="no-key-given"),
    ],
)
def test_an_edit_within_honest_ranges_is_detected_with_a_key(
    rich: Checkpoint,
    tmp_path: Path,
    writer_key: bytes | None,
    reader_key: bytes | None,
    message: str,
) -> None:
    # Prepare: a memory cap of 1 (a value a silo could claim, so no range check can
    # refuse it) written with a recomputed digest or under another key
    _resaved(rich, tmp_path, _set(f"{W11}.max_batch_size", 1), key=writer_key)

    # Execute / Assert: refused, never skipped for an older checkpoint
    with pytest.raises(CheckpointKeyError, match=message):
        CheckpointStore(tmp_path, key=reader_key).latest()


def test_a_flipped_byte_in_a_keyed_checkpoint_is_refused_not_skipped(
    rich: Checkpoint, tmp_path: Path
) -> None:
    # Prepare: an intact round 5, a round 6 with one byte changed
    store = CheckpointStore(tmp_path, key=KEY)
    manifest = {**rich.manifest, "round": 5}
    store.save(5, arrays=rich.arrays, manifest=manifest, state=rich.state, records=rich.records)
    path = _resaved(rich, tmp_path, lambda m, s, a: None, key=KEY)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))

    # Execute / Assert
    with pytest.raises(CheckpointKeyError, match="edited, damaged or written under another"):
        store.latest()


def test_the_strategys_checkpoint_key_is_used_to_resume(rich: Checkpoint, tmp_path: Path) -> None:
    # Prepare: the key file, a strategy configured with it, a checkpoint under another key
    key_file = write_checkpoint_key(tmp_path / "key")
    folder = tmp_path / "ckpt"
    strategy = LBBSPCluster(**SETTINGS, checkpoint_dir=folder)
    strategy.server_config = strategy.server_config.model_copy(update={"checkpoint_key": key_file})
    _resaved(rich, folder, lambda m, s, a: None, key=load_checkpoint_key(key_file))
    good = resume_from(strategy, max_silos=3, initial_arrays=_initial())
    _resaved(rich, folder, lambda m, s, a: None, key=OTHER)

    # Execute / Assert
    assert good is not None and good.server_round == 6
    with pytest.raises(CheckpointKeyError):
        resume_from(strategy, max_silos=3, initial_arrays=_initial())


def test_a_strategy_that_cannot_restore_a_state_refuses_it(
    rich: Checkpoint, tmp_path: Path
) -> None:
    # Prepare: a state the schema keeps that the strategy chokes on
    class Choking(LBBSPCluster):
        def load_checkpoint_state(self, state: Any, records: Any) -> None:
            raise KeyError("version")

    _resaved(rich, tmp_path, _set("manifest.strategy", "Choking"))
    strategy = Choking(**SETTINGS, checkpoint_dir=tmp_path)

    # Execute / Assert
    with pytest.raises(CheckpointInvalidError, match="cannot restore it .KeyError") as info:
        resume_from(strategy, max_silos=3, initial_arrays=_initial())
    assert info.value.field == "state"


# --------------------------------------------------------------------------- CLI
def _mlp() -> ArrayRecord:
    import torch

    from fl_lbbsp.models import build_model

    torch.manual_seed(0)
    return ArrayRecord(build_model("mlp", input_shape=(1, 32, 32), num_classes=10).state_dict())


ARGV = ["simulate", "--silos", "3", "--model", "mlp", "--rounds", "2", "--in-process", "--quiet"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        pytest.param(_model(_fill("net.1.weight", np.nan)), "arrays.net.1.weight", id="nan-model"),
        pytest.param(_model(lambda a: a.update({"x": a.pop("net.1.weight")})), "arrays",
                     id="renamed-arrays"),
        pytest.param(_set(f"{E}.balancer.pooled_shape", "x"), f"{E}.balancer.pooled_shape",
                     id="pooled-shape-garbage"),
        pytest.param(_set(f"{E}.claims", {"sizes": {"0": 10**9}}), f"{E}.claims.sizes.0",
                     id="pinned-size-1e9"),
        pytest.param(_set(f"{E}.silo_of_node", {str(n): f"s{n}" for n in range(5)}),
                     f"{E}.silos", id="more-silos-than-the-run"),
    ],
)  # fmt: skip
def test_cli_refuses_an_edited_checkpoint_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Edit, field: str
) -> None:
    # Prepare: a checkpoint this very command would resume, edited
    folder = tmp_path / "ckpt"
    config = SimulationConfig(silos=3, model="mlp", out=tmp_path, checkpoint_dir=folder)
    directory = config.checkpoint_path()
    assert directory is not None
    path = save_checkpoint(CheckpointStore(directory), make_strategy(config), 1, _mlp())
    _resaved(CheckpointStore(directory).load(path), directory, edit)

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main([*ARGV, "--out", str(tmp_path), "--checkpoint-dir", str(folder)])

    # Assert
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("fl-lbbsp: error: --checkpoint-dir:") and field in err
    assert "Traceback" not in err


def test_cli_with_a_checkpoint_key_refuses_a_checkpoint_with_a_recomputed_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the run's checkpoint rewritten without the key (digest recomputed)
    key = write_checkpoint_key(tmp_path / "key")
    folder = tmp_path / "ckpt"
    config = SimulationConfig(
        silos=3, model="mlp", out=tmp_path, checkpoint_dir=folder, checkpoint_key=key
    )
    directory = config.checkpoint_path()
    assert directory is not None
    keyed = CheckpointStore(directory, key=load_checkpoint_key(key))
    path = save_checkpoint(keyed, make_strategy(config), 1, _mlp())
    _resaved(keyed.load(path), directory, _set(f"{E}.federation_size", 0))

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main([*ARGV, "--out", str(tmp_path), "--checkpoint-dir", str(folder),
              "--checkpoint-key", str(key)])  # fmt: skip

    # Assert
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert "written without a checkpoint key" in err and "Traceback" not in err


def test_a_checkpoint_error_is_a_value_error_for_library_users() -> None:
    # Execute / Assert: callers catching ValueError keep working
    assert issubclass(CheckpointKeyError, CheckpointInvalidError)
    assert issubclass(CheckpointInvalidError, CheckpointError)
    assert issubclass(CheckpointError, ValueError)


def test_cli_writes_keyed_checkpoints_and_resumes_from_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: one round with a checkpoint key
    key = write_checkpoint_key(tmp_path / "key")
    argv = ["simulate", "--silos", "3", "--model", "mlp", "--in-process", "--quiet", "--no-wait",
            "--local-steps", "1", "--batch-size", "8", "--out", str(tmp_path / "out"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-key", str(key)]  # fmt: skip
    assert main([*argv, "--rounds", "1"]) == 0
    capsys.readouterr()

    # Execute: a second round resumes; without the key the checkpoint is refused
    resumed = main([*argv, "--rounds", "2"])
    with pytest.raises(SystemExit) as exit_info:
        main([*argv[:-2], "--rounds", "3"])

    # Assert: keyed files, resumed, and refused without the key in one line
    store = CheckpointStore(tmp_path / "ckpt" / "lbbsp", key=load_checkpoint_key(key))
    latest = store.latest()
    assert resumed == 0 and latest is not None and latest.server_round == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and "give the same key" in err[-1]
