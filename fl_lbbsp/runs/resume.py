"""A rerun that resumes from a checkpoint: it must be the run that wrote the checkpoint
(:data:`RUN_FILE` records that run's settings beside its checkpoints), with a checkpoint
the strategy can take and the telemetry of the earlier rounds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord

from ..strategies import EngineStrategy
from ..strategies.checkpoint import CheckpointError, ResumePoint, resume_from, store_of
from .config import RunSettings

__all__ = ["RUN_FILE", "check_checkpoint_dir", "resume_run"]

RUN_FILE = "run.json"
"""File beside a run's checkpoints recording the settings that decide the run."""

_NOT_RUN_SETTINGS = frozenset(
    {"out", "rounds", "iterations", "runtime", "parallel", "emulate_wait", "wait",
     "checkpoint_dir", "checkpoint_key", "encrypt", "eval_every", "time_dilation",
     "silo_registry"}
)  # fmt: skip
"""Config fields a resumed run may change: where output goes, how long it runs and how
the silos are scheduled, none of which changes a round's result."""


def resume_run(
    config: RunSettings, strategy: EngineStrategy, initial: ArrayRecord
) -> ResumePoint | None:
    """Check the run's checkpoint folder and, when it holds a checkpoint, the resume;
    return where the run resumes (``None``: a fresh start).

    The checkpoint folder is a writable directory (:func:`check_checkpoint_dir`); a
    resume (a checkpoint in the folder) has the settings of the run that wrote it
    (:data:`RUN_FILE`: model, data, silos, partition, seed, tau, eta, B_init, balancer,
    ...), a valid state of at most the run's silos and a model of the layout of
    ``initial``, the run's initial model, and is restored into ``strategy`` here, once
    (:func:`~fl_lbbsp.strategies.checkpoint.resume_from`: ``strategy.start(...,
    resume=...)`` takes it as it is); and the telemetry of its earlier rounds is there,
    copied from the first run's output folder when ``out`` changed. The run's settings are
    recorded in :data:`RUN_FILE`.

    Raises
    ------
    CheckpointError
        A checkpoint folder that cannot be written, or a resume that differs from the
        run that wrote the checkpoint (each differing field named with both values).
    CheckpointInvalidError
        A checkpoint that fails validation or that the strategy cannot restore.
    """
    directory = config.checkpoint_path()
    if config.checkpoint_dir is None or directory is None:
        return None
    check_checkpoint_dir(config.checkpoint_dir, directory)
    settings = {
        k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_RUN_SETTINGS
    }
    run_file = directory / RUN_FILE
    store = store_of(strategy)
    resume = saved = None
    if store is not None and store.rounds():
        saved = _check_same_run(run_file, settings) if run_file.is_file() else None
        # A checkpoint of another strategy or other settings, of more silos than the run
        # has, of another model, or that the strategy cannot restore is refused here.
        resume = resume_from(strategy, store=store, max_silos=config.size, initial_arrays=initial)
    telemetry = config.telemetry_path()
    if resume is not None:
        _keep_telemetry(telemetry, None if saved is None else Path(saved), resume)
    if resume is None or not run_file.is_file():
        record = {"telemetry": str(telemetry.resolve()), "settings": settings}
        _write_atomically(run_file, json.dumps(record, indent=2, sort_keys=True))
    return resume


def check_checkpoint_dir(given: Path, directory: Path) -> None:
    """Refuse, before any round, a checkpoint folder that cannot be written.

    Parameters
    ----------
    given : Path
        The folder the user named (``--checkpoint-dir``); it must be a directory or not
        exist yet.
    directory : Path
        The run's own folder under it, created here, where one file is written and
        removed as a probe.

    Raises
    ------
    CheckpointError
        ``given`` is not a directory, or ``directory`` cannot be created or written.
    """
    if given.exists() and not given.is_dir():
        raise CheckpointError(f"{given} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"{directory} is not a writable directory ({err.strerror})") from None


def _keep_telemetry(telemetry: Path, earlier: Path | None, resume: ResumePoint) -> None:
    """The resumed run's telemetry holds its earlier rounds: copied from ``earlier``, the
    first run's, when the output folder changed."""
    if not telemetry.exists() and earlier is not None and earlier.is_file():
        telemetry.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(earlier, telemetry)
    if not telemetry.is_file():
        raise CheckpointError(
            f"resuming after round {resume.checkpoint.server_round} needs the telemetry of "
            f"the earlier rounds, {telemetry}: rerun with the first run's output folder"
        )


def _check_same_run(run_file: Path, settings: dict[str, Any]) -> str:
    """Refuse settings other than those of the run that wrote the checkpoints beside
    ``run_file``; return that run's telemetry path."""
    try:
        saved = json.loads(run_file.read_text())
        earlier, before = str(saved["telemetry"]), dict(saved["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{run_file} is unreadable ({err})") from None
    before, now = _flat(before), _flat(settings)
    differences = [
        f"{name} {before.get(name)!r} (now {value!r})"
        for name, value in now.items()
        if before.get(name) != value
    ]
    if differences:
        raise CheckpointError(
            f"the checkpoint in {run_file.parent} is of a run with {'; '.join(differences)}: "
            "resume with the same settings, or use another checkpoint dir"
        )
    return earlier


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with a group of them (``balancing``) spread into its own names, so
    that a difference names the setting, not the group."""
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if name == "balancing" and isinstance(value, dict):
            flat.update({inner: value[inner] for inner in value if inner not in settings})
        else:
            flat[name] = value
    return flat


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
