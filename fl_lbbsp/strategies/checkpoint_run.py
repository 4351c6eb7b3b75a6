"""The record of a run beside its checkpoints (:data:`RUN_FILE`): the settings that decide
its rounds and where its telemetry goes, so that a rerun resumes only as the run that
wrote the checkpoints, with the telemetry of its earlier rounds.

A runner describes its run (:class:`RunRecord`) before anything is built;
:func:`~fl_lbbsp.strategies.checkpoint.resume_from` holds that description against the
record on disk when the folder has checkpoints, keeps the telemetry of a resumed run, and
writes the record of a run that starts afresh."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RUN_FILE", "CheckpointError", "RunRecord"]


class CheckpointError(ValueError):
    """A checkpoint (or its run's record) that cannot be read or resumed by this strategy."""


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
        is recorded if the folder had no record.

        Raises
        ------
        CheckpointError
            Neither this run's telemetry nor the recorded run's is there.
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
        if not self.path.is_file():
            self.write()

    def write(self) -> None:
        """Record this run (atomically)."""
        record = {"telemetry": str(self.telemetry.resolve()), "settings": self.settings}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        os.replace(tmp, self.path)


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
