"""Per-round telemetry as JSON lines: one object per event, appended as the run goes."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = ["TelemetryWriter", "read_telemetry", "start_telemetry"]

log = logging.getLogger("fl_lbbsp")


class TelemetryWriter:
    """Append JSON objects, one per line, to ``path`` (``None`` keeps them in memory only).

    Parameters
    ----------
    path : str | Path | None (default: None)
        JSON-lines file; its folder is created. Existing content is kept (appended to).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.events: list[dict[str, Any]] = []

    def write(self, event: dict[str, Any]) -> None:
        """Record one event and append it to the file."""
        self.events.append(event)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(event, sort_keys=True) + "\n")

    def evaluation(
        self, *, scheme: str, server_round: int, loss: float, accuracy: float, federated: bool
    ) -> None:
        """Write one ``evaluate`` event: the global model's loss and accuracy, evaluated by
        the server on the held-out split or (``federated``) by the silos on theirs."""
        event = {
            "event": "evaluate",
            "scheme": scheme,
            "round": server_round,
            "loss": loss,
            "accuracy": accuracy,
        }
        self.write({**event, "federated": True} if federated else event)

    def drop_rounds_after(self, server_round: int) -> int:
        """Remove the file's events of rounds after ``server_round`` (a run resumed from
        that round's checkpoint redoes them); return how many were removed.

        Events without a round (the run's config) stay. The file is rewritten atomically.
        """
        if self.path is None or not self.path.exists():
            return 0
        kept, dropped = [], 0
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                later = json.loads(line).get("round")
                if isinstance(later, int) and later > server_round:
                    dropped += 1
                else:
                    kept.append(line if line.endswith("\n") else line + "\n")
        if dropped:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
        return dropped


def start_telemetry(path: Path, config: BaseModel, *, resume: bool = False) -> None:
    """Start a run's telemetry file at ``path`` afresh, with the run's config as its first
    event.

    With ``resume`` (a run that resumes from a checkpoint) an existing file is kept: the
    strategy continues it and drops the events of rounds after its checkpoint.
    """
    if resume and path.exists():
        log.info("resuming from a checkpoint: telemetry %s is continued", path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    TelemetryWriter(path).write({"event": "config", **config.model_dump(mode="json")})


def read_telemetry(path: str | Path) -> list[dict[str, Any]]:
    """Read every event of a JSON-lines telemetry file."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
