"""Supervision of a local federation's processes: when a SuperNode or warm worker that died
is started again (:class:`RestartPolicy`), and one supervision step over a list of
processes (:func:`revive`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from .processes import ManagedProcess

__all__ = ["RestartPolicy", "revive"]


@dataclass
class RestartPolicy:
    """When a dead SuperNode is started again: at once the first time, then after a delay
    that doubles with every start that did not last (a node that dies while the SuperLink
    still holds it online, or a broken one, is not restarted in a tight loop).

    Parameters
    ----------
    restart : bool (default: True)
        ``False``: a dead SuperNode is logged and left out.
    first_delay : float (default: 1.0)
        Seconds before the second restart of a node whose previous start did not last.
    max_delay : float (default: 10.0)
        Longest delay between two restarts.
    stable_after : float (default: 60.0)
        A node up this long counts as healthy: its next death restarts it at once.
    """

    restart: bool = True
    first_delay: float = 1.0
    max_delay: float = 10.0
    stable_after: float = 60.0
    _failures: dict[str, int] = field(default_factory=dict, repr=False)

    def delay(self, name: str, *, uptime: float) -> float | None:
        """Seconds to wait before restarting ``name``, which died after ``uptime`` s up;
        ``None``: leave it out. Each call counts one death."""
        if not self.restart:
            return None
        failures = 0 if uptime >= self.stable_after else self._failures.get(name, 0) + 1
        self._failures[name] = failures
        if failures <= 1:
            return 0.0 if failures == 0 else self.first_delay
        return float(min(self.max_delay, self.first_delay * 2 ** (failures - 1)))


def revive(
    processes: list[ManagedProcess],
    restart_at: dict[int, float],
    restart: Callable[[int], ManagedProcess],
    *,
    left_out: str,
    policy: RestartPolicy,
    now: float,
    out: IO[str],
) -> None:
    """One supervision step over ``processes``: report each dead one once, with what
    happens next (``left_out`` when ``policy`` gives no delay), and ``restart`` it (by
    index) once its delay, kept in ``restart_at`` by index, has passed at ``now``."""
    for index, proc in enumerate(processes):
        if proc.alive():
            continue
        if index not in restart_at:
            delay = policy.delay(proc.name, uptime=now - proc.started_at)
            action = left_out if delay is None else f"restarting in {delay:g} s"
            print(
                f"{proc.name} (pid {proc.pid}) exited with code {proc.popen.returncode}; "
                f"see {proc.log_path}; {action}",
                file=out,
                flush=True,
            )
            restart_at[index] = float("inf") if delay is None else now + delay
        if now >= restart_at[index]:
            del restart_at[index]
            new = restart(index)
            print(f"{proc.name} restarted (pid {new.pid})", file=out, flush=True)
