"""A run's checkpoint folder as the runner checks it before anything is built: a writable
folder, and the run described as the folder records it
(:class:`~fl_lbbsp.strategies.checkpoint_run.RunRecord`), so that a rerun resumes only as
the run that wrote the checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

from ..strategies.checkpoint import CheckpointError, RunRecord
from .config import RunSettings

__all__ = ["check_checkpoint_dir", "run_record"]

_NOT_RUN_SETTINGS = frozenset(
    {"out", "rounds", "iterations", "runtime", "parallel", "emulate_wait", "wait",
     "checkpoint_dir", "checkpoint_key", "encrypt", "eval_every", "time_dilation",
     "silo_registry"}
)  # fmt: skip
"""Config fields a resumed run may change: where output goes, how long it runs and how
the silos are scheduled, none of which changes a round's result."""


def run_record(config: RunSettings) -> RunRecord | None:
    """The run as its checkpoint folder records it, after the folder is checked
    (:func:`check_checkpoint_dir`); ``None``: the run has no checkpoint folder.

    The record (:data:`~fl_lbbsp.strategies.checkpoint_run.RUN_FILE`) holds the settings
    that decide the run (model, data, silos, partition, seed, tau, eta, B_init, balancer,
    ...; not where output goes, how long the run is or how its silos are scheduled) and
    its telemetry file: :func:`~fl_lbbsp.strategies.checkpoint.resume_from` resumes a
    checkpoint only for the run recorded beside it, with the telemetry of its earlier
    rounds (copied from the first run's output folder when ``out`` changed).

    Raises
    ------
    CheckpointError
        A checkpoint folder that cannot be written.
    """
    directory = config.checkpoint_path()
    if config.checkpoint_dir is None or directory is None:
        return None
    check_checkpoint_dir(config.checkpoint_dir, directory)
    settings = {
        k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_RUN_SETTINGS
    }
    return RunRecord(directory=directory, settings=settings, telemetry=config.telemetry_path())


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
