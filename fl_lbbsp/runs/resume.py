"""A run's checkpoint folder as the runner checks it before anything is built: a writable
folder, and the run described as the folder records it (:class:`RunRecord`, the file
:data:`RUN_FILE`: the settings that decide its rounds and where its telemetry goes), so
that a rerun resumes only as the run that wrote the checkpoints, with the telemetry of its
earlier rounds (:func:`resume_run`)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord

from ..strategies.checkpoint import Checkpoint, CheckpointError
from ..strategies.checkpointing import Checkpointable, resume_from, store_of
from ..telemetry import read_telemetry
from .config import RunSettings

__all__ = ["RUN_FILE", "RunRecord", "resume_run", "run_record"]

RUN_FILE = "run.json"
"""File beside a run's checkpoints recording the settings that decide the run."""


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as its checkpoint folder records it.

    Attributes
    ----------
    directory : Path
        The run's checkpoint folder (the record is :data:`RUN_FILE` in it).
    settings : dict
        The settings that decide the run's rounds (JSON values); a group of them (such
        as ``balancing``) is compared setting by setting.
    telemetry : Path
        The run's JSON-lines telemetry file.
    """

    directory: Path
    settings: dict[str, Any]
    telemetry: Path

    @property
    def path(self) -> Path:
        """The record's file."""
        return self.directory / RUN_FILE

    def check_same(self) -> Path | None:
        """Refuse settings other than those of the run recorded on disk; return that
        run's telemetry file (``None``: no run is recorded).

        Raises
        ------
        CheckpointError
            The record cannot be read, or names settings other than these (each
            differing setting named with both values).
        """
        if not self.path.is_file():
            return None
        try:
            saved = json.loads(self.path.read_text())
            earlier, before = str(saved["telemetry"]), dict(saved["settings"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{self.path} is unreadable ({err})") from None
        before, now = _flat(before), _flat(self.settings)
        differences = [
            f"{name} {before.get(name)!r} (now {value!r})"
            for name, value in now.items()
            if before.get(name) != value
        ]
        if differences:
            raise CheckpointError(
                f"the checkpoint in {self.directory} is of a run with "
                f"{'; '.join(differences)}: resume with the same settings, or use another "
                "checkpoint dir"
            )
        return Path(earlier)

    def keep(self, earlier: Path | None, *, after_round: int) -> None:
        """A run resumed after ``after_round`` keeps the telemetry of its earlier rounds
        (copied from ``earlier``, the recorded run's, when the output folder changed), and
        is recorded as the run whose telemetry the next resume continues.

        Raises
        ------
        CheckpointError
            Neither this run's telemetry nor the recorded run's is there, or this run's
            ends before ``after_round`` (another output folder holds the rounds since).
        """
        telemetry = self.telemetry
        if not telemetry.exists() and earlier is not None and earlier.is_file():
            telemetry.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(earlier, telemetry)
        if not telemetry.is_file():
            raise CheckpointError(
                f"resuming after round {after_round} needs the telemetry of the earlier "
                f"rounds, {telemetry}: rerun with the first run's output folder"
            )
        if (last := _last_round(telemetry)) < after_round:
            where = (
                f"the last run's output folder ({earlier.parent})"
                if earlier is not None and earlier.resolve() != telemetry.resolve()
                else "the output folder of the run that wrote them"
            )
            raise CheckpointError(
                f"the telemetry in {telemetry} ends at round {last}, the checkpoint after "
                f"round {after_round}: rerun with {where}, so that the report covers every "
                "round"
            )
        self.write()

    def write(self) -> None:
        """Record this run (atomically)."""
        record = {"telemetry": str(self.telemetry.resolve()), "settings": self.settings}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        os.replace(tmp, self.path)


def _last_round(telemetry: Path) -> int:
    """The last training round the telemetry file records (0: none)."""
    events = read_telemetry(telemetry)
    rounds = [e.get("round") for e in events if e.get("event") in ("train", "skipped")]
    return max((r for r in rounds if isinstance(r, int)), default=0)


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with a group of them (``balancing``, its ``tuning``) spread into its
    own names, so that a difference names the setting, not the group."""
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if name in ("balancing", "tuning") and isinstance(value, dict):
            inner = _flat(value)
            flat.update({k: v for k, v in inner.items() if k not in settings})
        else:
            flat[name] = value
    return flat


_NOT_RUN_SETTINGS = frozenset(
    {"out", "rounds", "iterations", "runtime", "parallel", "emulate_wait", "wait",
     "checkpoint_dir", "checkpoint_key", "encrypt", "eval_every", "time_dilation",
     "silo_registry", "spend_saved_time"}
)  # fmt: skip
"""Config fields a resumed run may change: where output goes, how long it runs and how
the silos are scheduled, none of which changes a round's result."""


def run_record(config: RunSettings) -> RunRecord | None:
    """The run as its checkpoint folder records it (:data:`RUN_FILE`: the settings that
    decide the run and its telemetry file), once the folder the user named
    (``--checkpoint-dir``) is a directory or absent and the run's own folder under it is
    created and writable (one file written and removed as a probe); ``None``: no
    checkpoint folder.

    Raises
    ------
    CheckpointError
        A checkpoint folder that is not a directory or cannot be created or written.
    """
    given, directory = config.checkpoint_dir, config.checkpoint_path()
    if given is None or directory is None:
        return None
    if given.exists() and not given.is_dir():
        raise CheckpointError(f"{given} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"{directory} is not a writable directory ({err.strerror})") from None
    settings = {
        k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_RUN_SETTINGS
    }
    return RunRecord(directory=directory, settings=settings, telemetry=config.telemetry_path())


def resume_run(
    strategy: Checkpointable,
    record: RunRecord | None,
    *,
    max_silos: int,
    initial_arrays: ArrayRecord,
) -> Checkpoint | None:
    """Where a runner's run resumes (:func:`~fl_lbbsp.strategies.checkpointing.resume_from`
    with the federation's size and the initial model), held against its ``record``: a
    folder with checkpoints must record the same run (checked first), a resumed run keeps
    the telemetry of its earlier rounds, and a run that starts afresh is recorded.

    Raises
    ------
    CheckpointError
        As :func:`~fl_lbbsp.strategies.checkpointing.resume_from` and
        :meth:`RunRecord.check_same`.
    """
    store = store_of(strategy)
    fresh = store is None or not store.rounds()
    earlier = None if record is None or fresh else record.check_same()
    resume = resume_from(strategy, store=store, max_silos=max_silos, initial_arrays=initial_arrays)
    if record is not None and resume is None:
        record.write()
    elif record is not None and resume is not None:
        record.keep(earlier, after_round=resume.server_round)
    return resume
