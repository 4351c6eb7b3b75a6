"""Edited checkpoints (digest recomputed) are refused on load with one line naming the
field, never obeyed and never a KeyError (issue 16, item 5)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fl_lbbsp.cli import main
from fl_lbbsp.runs.fl import SimulationConfig
from fl_lbbsp.strategies.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointInvalidError,
    CheckpointLimits,
    CheckpointStore,
    check_arrays,
    validate_checkpoint,
)
from fl_lbbsp.strategies.checkpointing import resume_from

E = "state.engine"
"""Where the engine's state is in a checkpoint's fields."""
Edit = Callable[[dict[str, Any], dict[str, Any]], None]


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """The round-2 checkpoint of the fixture's parameter server (checkpoint_fixture.py)."""
    from checkpoint_fixture import write_checkpoint
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    try:
        path = write_checkpoint(tmp_path_factory.mktemp("original"), 2)
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved
    return CheckpointStore(path.parent).load(path)


def _resaved(original: Checkpoint, folder: Path, edit: Edit) -> Path:
    """The fixture's round-2 checkpoint, edited by ``edit(manifest, state)`` and written
    again with a digest of the edited contents (what an attacker with write access does)."""
    manifest, state = copy.deepcopy(original.manifest), copy.deepcopy(original.state)
    edit(manifest, state)
    return CheckpointStore(folder).save(
        2, arrays=original.arrays, manifest=manifest, state=state, records=original.records
    )


def _silo(state: dict[str, Any]) -> dict[str, Any]:
    return state["engine"]["balancer"]["silos"]["w11"]  # type: ignore[no-any-return]


def _set(path: str, value: Any) -> Edit:
    def edit(manifest: dict[str, Any], state: dict[str, Any]) -> None:
        root, *keys = path.split(".")
        target = manifest if root == "manifest" else state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def _delete(path: str) -> Edit:
    def edit(manifest: dict[str, Any], state: dict[str, Any]) -> None:
        root, *keys = path.split(".")
        target = manifest if root == "manifest" else state
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return edit


EDITS = [
    pytest.param(_delete(f"{E}.balancer"), f"{E}.balancer", id="balancer-missing"),
    pytest.param(_set(f"{E}.federation_size", 10**6), f"{E}.federation_size", id="huge-fed"),
    pytest.param(_set(f"{E}.federation_size", 4), f"{E}.federation_size", id="fed>seen"),
    pytest.param(_set(f"{E}.federation_size", -1), f"{E}.federation_size", id="fed<0"),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.estimator.value", -400.0),
        f"{E}.balancer.silos.w11.estimator.value",
        id="negative-speed",
    ),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.estimator.value", float("inf")),
        f"{E}.balancer.silos.w11.estimator.value",
        id="infinite-speed",
    ),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.history", [[16, 0.04, 9]]),
        f"{E}.balancer.silos.w11.history",
        id="history-shape",
    ),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.history", [[14_600_000, 0.04]]),
        f"{E}.balancer.silos.w11.history",
        id="history-batch-huge",
    ),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.max_batch_size", 0),
        f"{E}.balancer.silos.w11.max_batch_size",
        id="memory-cap-0",
    ),
    pytest.param(
        _set(f"{E}.balancer.silos.w11.last.train_time", -1.0),
        f"{E}.balancer.silos.w11.last.train_time",
        id="negative-time",
    ),
    pytest.param(
        _delete(f"{E}.balancer.silos.w11.estimator"),
        f"{E}.balancer.silos.w11.estimator",
        id="estimator-missing",
    ),
    pytest.param(
        _set(f"{E}.balancer.config.initial_batch_size", -16),
        f"{E}.balancer.config",
        id="balancer-config",
    ),
    pytest.param(_set(f"{E}.overhead", [0.0, -5.0]), f"{E}.overhead", id="overhead"),
    pytest.param(
        _set(f"{E}.claims", {"sizes": {"w11": -100}}),
        f"{E}.claims.sizes.w11",
        id="size<0",
    ),
    pytest.param(
        _set(f"{E}.claims", {"overhead": [float("nan")]}),
        f"{E}.claims.overhead",
        id="claims-overhead",
    ),
    pytest.param(_set(f"{E}.silo_of_node", {"x": "w11"}), f"{E}.silo_of_node", id="node-id"),
    pytest.param(_delete("manifest.round"), "manifest.round", id="round-missing"),
    pytest.param(_set("manifest.round", 0), "manifest.round", id="round-0"),
    pytest.param(_set("manifest.settings.balancing.alpha", 7.0), "manifest.settings", id="alpha"),
]


@pytest.mark.parametrize(("edit", "field"), EDITS)
def test_an_edited_checkpoint_is_refused_naming_the_field(original, tmp_path, edit, field) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    path = _resaved(original, tmp_path, edit)

    # Execute
    with pytest.raises(CheckpointInvalidError) as info:
        CheckpointStore(tmp_path).load(path)

    # Assert: one line naming the field, and it is a CheckpointError (the CLI's exit 2)
    assert info.value.field.startswith(field), info.value.field
    message = str(info.value)
    assert "\n" not in message and field in message and str(path) in message
    assert isinstance(info.value, CheckpointError)


def test_an_edited_newest_checkpoint_is_not_skipped_for_an_older_one(original, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: an untouched round 1, an edited round 2
    store = CheckpointStore(tmp_path)
    store.save(1, arrays=original.arrays, manifest={**original.manifest, "round": 1},
               state=original.state)  # fmt: skip
    _resaved(original, tmp_path, _set(f"{E}.federation_size", 10**6))

    # Execute / Assert
    with pytest.raises(CheckpointInvalidError, match="federation_size"):
        store.latest()


def test_the_untouched_checkpoint_passes(original: Checkpoint) -> None:
    # Execute / Assert: the fixture as written, and bounded by its own federation
    validate_checkpoint(original.manifest, original.state, limits=CheckpointLimits(max_silos=3))


def test_a_federation_larger_than_configured_is_refused(original: Checkpoint) -> None:
    # Prepare

    # Execute / Assert
    with pytest.raises(CheckpointInvalidError, match=f"{E}.federation_size") as info:
        limits = CheckpointLimits(max_silos=2)
        validate_checkpoint(original.manifest, original.state, where="ckpt", limits=limits)
    assert info.value.field == f"{E}.federation_size"


def test_resume_from_bounds_the_federation_with_the_configured_size(original, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    from checkpoint_fixture import SETTINGS

    from fl_lbbsp.strategies import LBBSPCluster

    assert original.path is not None
    (tmp_path / original.path.name).write_bytes(original.path.read_bytes())
    strategy = LBBSPCluster(**SETTINGS, checkpoint_dir=tmp_path)

    # Execute / Assert
    assert resume_from(strategy, max_silos=3) is not None
    with pytest.raises(CheckpointInvalidError, match="over this strategy's 2"):
        resume_from(strategy, max_silos=2)


def _model(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({name: Array(value) for name, value in arrays.items()})


MODEL = {"w": np.full((3, 4), 0.5, dtype=np.float32), "b": np.zeros(4, dtype=np.float32)}


@pytest.mark.parametrize(
    ("arrays", "encrypted", "message"),
    [
        pytest.param({**MODEL, "w": np.zeros((30, 4), np.float32)}, False,
                     r"arrays\.w: shape \[30, 4\]", id="other-shape"),
        pytest.param({"x": MODEL["w"], "b": MODEL["b"]}, False, "not the model's", id="renamed"),
        pytest.param({"b": MODEL["b"], "w": MODEL["w"]}, False, "not the model's", id="reordered"),
        pytest.param({**MODEL, "w": MODEL["w"].astype(np.float64)}, False, "dtype float64",
                     id="other-dtype"),
        pytest.param({**MODEL, "w": np.full((3, 4), np.nan, np.float32)}, False,
                     "NaN or infinite", id="nan"),
        pytest.param({**MODEL, "w": np.full((3, 4), np.inf, np.float32)}, False,
                     "NaN or infinite", id="inf"),
        pytest.param({**MODEL, "w": np.full((3, 4), 1e30, np.float32)}, False, "L2 norm",
                     id="1e30"),
        pytest.param({"fl-lbbsp-encrypted": np.zeros(7, np.uint8)}, False, "plaintext",
                     id="encrypted-for-plaintext"),
        pytest.param({"fl-lbbsp-encrypted": np.zeros(7, np.uint8)}, True,
                     "not a readable encrypted model", id="garbage-ciphertext"),
    ],
)  # fmt: skip
def test_a_model_the_strategy_cannot_start_from_is_refused(
    arrays: dict[str, np.ndarray], encrypted: bool, message: str
) -> None:
    # Prepare
    from fl_lbbsp.contract import ENCRYPTED_HEADER

    arrays = {ENCRYPTED_HEADER if k == "fl-lbbsp-encrypted" else k: v for k, v in arrays.items()}
    checkpoint = Checkpoint(2, _model(**arrays), {}, {}, {}, Path("ckpt"))

    # Execute / Assert: one line naming the field
    with pytest.raises(CheckpointInvalidError, match=message) as info:
        check_arrays(checkpoint, _model(**MODEL), encrypted=encrypted)
    assert "\n" not in str(info.value) and info.value.field.startswith("arrays")


def test_a_trained_model_of_the_layout_passes() -> None:
    # Prepare: ten times the initial model, well within the bound
    trained = _model(w=MODEL["w"] * 10, b=MODEL["b"] + 3)
    checkpoint = Checkpoint(2, trained, {}, {}, {}, Path("ckpt"))

    # Execute / Assert: no exception
    check_arrays(checkpoint, _model(**MODEL))


@pytest.mark.parametrize(
    ("records", "message"),
    [
        pytest.param({"optimizer": {"w": np.full((3, 4), np.nan, np.float32),
                                    "b": np.zeros(4, np.float32)}},
                     "records.optimizer.w: holds NaN", id="momentum-nan"),
        pytest.param({"optimizer": {"w": np.zeros((2, 2), np.float32), "b": np.zeros(4)}},
                     r"records.optimizer.w: shape \[2, 2\]", id="momentum-shape"),
        pytest.param({"optimizer": {"00000": np.zeros((3, 4), np.float32)}},
                     "are not the model's", id="momentum-names"),
        pytest.param({"other": {"x": np.full(2, np.inf, np.float32)}}, "records.other.x",
                     id="other-inf"),
    ],
)  # fmt: skip
def test_array_state_the_strategy_cannot_take_is_refused(
    records: dict[str, dict[str, np.ndarray]], message: str
) -> None:
    # Prepare
    state = {name: _model(**arrays) for name, arrays in records.items()}
    checkpoint = Checkpoint(2, _model(**MODEL), {}, {}, state, Path("ckpt"))

    # Execute / Assert
    with pytest.raises(CheckpointInvalidError, match=message):
        check_arrays(checkpoint, _model(**MODEL))


def test_cli_refuses_an_edited_checkpoint_with_one_line_and_exit_2(
    original: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: an edited checkpoint where the run would resume from
    folder = tmp_path / "ckpt"
    config = SimulationConfig(silos=3, model="mlp", out=tmp_path, checkpoint_dir=folder)
    path = config.checkpoint_path()
    assert path is not None
    _resaved(original, path, _delete(f"{E}.balancer"))
    argv = ["simulate", "--silos", "3", "--model", "mlp", "--out", str(tmp_path)]

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--checkpoint-dir", str(folder)])

    # Assert
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert len(err.splitlines()) == 1, err
    assert f"{E}.balancer" in err and "Traceback" not in err and "KeyError" not in err
