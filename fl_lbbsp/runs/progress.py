"""A live progress display for runs of several minutes, fed by the telemetry stream.

:class:`RoundProgress` follows a run's JSON-lines telemetry file from a background
thread (whatever runtime writes it: Ray's Simulation Engine, the in-process grid, a
cluster run) and shows, with rich: round k of N, elapsed and remaining time, and the
last round's time, its ratio to the ideal T* and the idle fraction. Nothing in the
strategies knows about it.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .summary.costs import fit_cost_line, modelled_cost_line, slowdowns_at

__all__ = ["RoundProgress", "TelemetryFollower", "round_ideal"]


class TelemetryFollower:
    """Read the events appended to a JSON-lines file since the last call.

    Parameters
    ----------
    path : str | Path
        The telemetry file; it may not exist yet, and may be restarted (truncated).
    skip_existing : bool (default: False)
        Start after what the file holds now (an earlier run's events).
    """

    def __init__(self, path: str | Path, *, skip_existing: bool = False) -> None:
        self.path = Path(path)
        self._offset = 0
        if skip_existing and self.path.is_file():
            self._offset = self.path.stat().st_size
        self._partial = b""

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        """New complete events, and whether the file was restarted (events before them
        belong to an earlier run)."""
        try:
            with self.path.open("rb") as f:
                f.seek(0, 2)
                size = f.tell()
                restarted = size < self._offset
                if restarted:
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return [], False
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events, restarted


def round_ideal(events: list[dict[str, Any]], event: dict[str, Any]) -> float | None:
    """The ideal round time T* of a train ``event``, from the run's events so far.

    FL runs (a config with ``silos`` and ``batch_size``): the report's T*, from the cost
    model's exact line or a line fitted on the compute times seen so far, with the
    round's emulated capacities. Otherwise (cluster runs) the round's own reports with
    no fixed cost: ``X / sum_i (B_i / t_i)``. ``None`` when nothing tells.
    """
    config = next((e for e in events if e.get("event") == "config"), None)
    if config is not None and "silos" in config and "batch_size" in config:
        try:
            line = modelled_cost_line(events) or fit_cost_line(events)
            total = int(config["batch_size"]) * int(config["silos"])
            return line.ideal(slowdowns_at(config, int(event["round"])), total)
        except (ValueError, KeyError, TypeError, ZeroDivisionError, ArithmeticError):
            pass
    speeds = [
        float(r["batch-size"]) / float(r["train-time"])
        for r in (event.get("silos") or {}).values()
        if r.get("batch-size") and r.get("train-time")
    ]
    global_batch = event.get("total_batch_size")
    if not speeds or not global_batch:
        return None
    return float(global_batch) / sum(speeds)


class RoundProgress:
    """Show a run's progress while it writes its telemetry file.

    Use as a context manager around the run. The display appears with the run's first
    new telemetry event (so a run refused before round 1 prints nothing but its error)
    and stops, staying as one finished line, when the block ends.

    Parameters
    ----------
    path : str | Path
        The run's telemetry file.
    total : int
        Rounds (iterations) the run will do.
    label : str
        What is running, e.g. the scheme.
    console : Console | None (default: None)
        Where to draw; ``None``: a console on stderr (stdout keeps the tables).
    refresh_seconds : float (default: 0.25)
        How often the telemetry file is read.
    unit : str (default: "round")
        What one step of ``total`` is called.
    """

    def __init__(
        self,
        *,
        path: str | Path,
        total: int,
        label: str,
        console: Console | None = None,
        refresh_seconds: float = 0.25,
        unit: str = "round",
    ) -> None:
        self.follower = TelemetryFollower(path, skip_existing=True)
        self.total = total
        self.label = label
        self.unit = unit
        self.console = console or Console(stderr=True)
        self.refresh_seconds = refresh_seconds
        self.events: list[dict[str, Any]] = []
        self.last = ""
        self.done = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            TextColumn(f"{unit}"),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[last]}"),
            console=self.console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._swapped: list[tuple[logging.StreamHandler, Any]] = []  # type: ignore[type-arg]

    def __enter__(self) -> RoundProgress:
        self._thread = threading.Thread(target=self._follow, name="fl-lbbsp-progress", daemon=True)
        self._thread.start()
        return self

    def _show(self) -> None:
        """Start drawing (once)."""
        if self._task is None:
            self._task = self._progress.add_task(self.label, total=self.total, last="")
            self._progress.start()
            self._route_logs()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.refresh()
        if self._task is not None:
            self._restore_logs()
            self._progress.stop()

    def _follow(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            self.refresh()

    def refresh(self) -> None:
        """Read the new telemetry events and update the display."""
        with self._lock:
            events, restarted = self.follower.poll()
            if restarted:
                self.events, self.done, self.last = [], 0, ""
            for event in events:
                self.observe(event)
            if events:
                self._show()
            if self._task is None:
                return
            self._progress.update(self._task, completed=self.done, last=self.last)

    def observe(self, event: dict[str, Any]) -> None:
        """Take one telemetry event into account."""
        self.events.append(event)
        if event.get("event") != "train" or not isinstance(event.get("round"), int):
            return
        self.done = max(self.done, min(int(event["round"]), self.total))
        round_time = event.get("round_time")
        if round_time is None:
            self.last = f"| {self.unit} {event['round']} skipped"
            return
        ideal = round_ideal(self.events, event)
        ratio = "" if not ideal else f" = {float(round_time) / ideal:.2f} T*"
        idle = event.get("idle_fraction")
        idle_text = "" if idle is None else f", idle {100 * float(idle):.1f}%"
        self.last = f"| last {float(round_time):.3f} s{ratio}{idle_text}"

    def _route_logs(self) -> None:
        """On a terminal rich redirects stderr above the display; point the log
        handlers that write to the real stderr at it, so log lines do not tear it."""
        if not isinstance(sys.stderr, FileProxy):
            return
        real = {sys.__stderr__, sys.stderr.rich_proxied_file}
        for name in ("fl_lbbsp", "flwr", ""):
            for handler in logging.getLogger(name or None).handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream in real:
                    self._swapped.append((handler, handler.setStream(sys.stderr)))

    def _restore_logs(self) -> None:
        for handler, stream in self._swapped:
            handler.setStream(stream)
        self._swapped.clear()
