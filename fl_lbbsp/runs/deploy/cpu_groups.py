"""Real CPU capacities for a local federation: one Linux CPU group (cgroup) per silo, with a
quota, holding its SuperNode, every process the SuperNode starts (Flower's SuperExec and
ClientApp processes inherit the group) and its warm worker.

:class:`CpuGroups` makes the groups under a parent group of its own,
``fl-lbbsp-<pid>-<random>``, before the first process starts, puts each silo's processes
in by writing their pid to the group's ``cgroup.procs`` in the child, between ``fork`` and
``exec`` (:meth:`CpuGroups.join`, so that nothing the process starts escapes the group),
and removes the groups it made, by their paths, when the federation stops
(:meth:`CpuGroups.remove`): any process still in one of them (ours: nothing else was put
there) is killed first.

Both cgroup layouts are served: v1 (a ``cpu`` hierarchy, ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``) and v2 (the unified hierarchy, ``cpu.max``, the ``cpu`` controller
enabled in the parent's ``cgroup.subtree_control``). :func:`cpu_groups_problem` says, in
one line, why groups cannot be made here (not root, no ``cpu`` controller, a read-only
hierarchy), ``None`` where they can.

The quota is the CFS bandwidth limit: a silo with quota q runs at most ``q * period`` of
CPU time in every ``period`` (100 ms), whatever its threads; a silo that needs more is
throttled until the next period. It is a capacity, not a share: it holds however idle
the machine is, and cannot be exceeded, but other load on the machine can still take
CPU from a silo under its quota.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "CFS_PERIOD_US",
    "CpuGroups",
    "Hierarchy",
    "cpu_groups_problem",
    "detect_hierarchy",
    "quota_us",
]

CFS_PERIOD_US = 100_000
"""CFS bandwidth period of every group, in microseconds (the kernel's default, 100 ms)."""

_MIN_QUOTA_US = 1000  # the kernel refuses quotas under 1 ms
_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Hierarchy:
    """Where CPU groups are made: the folder of the parent group's parent, and its layout."""

    root: Path
    version: Literal[1, 2]


def detect_hierarchy(root: Path = _ROOT) -> Hierarchy | str:
    """The cgroup hierarchy with the ``cpu`` controller under ``root``, or why there is
    none (one line).

    Parameters
    ----------
    root : Path (default: /sys/fs/cgroup)
        Where cgroup file systems are mounted.
    """
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").is_file():
        return Hierarchy(root=v1, version=1)
    controllers = root / "cgroup.controllers"
    if controllers.is_file():
        if "cpu" not in controllers.read_text(encoding="utf-8").split():
            return f"the cpu controller is not available in {root} (cgroup v2)"
        return Hierarchy(root=root, version=2)
    return f"no cgroup cpu controller mounted under {root}"


def cpu_groups_problem(root: Path = _ROOT) -> str | None:
    """Why CPU groups cannot be made here, in one line; ``None`` if they can (a trial group
    is made and removed)."""
    found = detect_hierarchy(root)
    if isinstance(found, str):
        return found
    trial = found.root / f"fl-lbbsp-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        trial.mkdir()
    except OSError as err:
        who = "" if os.geteuid() == 0 else " (not root)"
        return f"cannot make a CPU group in {found.root}{who}: {err.strerror or err}"
    with contextlib.suppress(OSError):
        trial.rmdir()
    return None


def quota_us(fraction: float, period_us: int = CFS_PERIOD_US) -> int:
    """The CFS quota in microseconds per ``period_us`` of a fraction of one core.

    Raises
    ------
    ValueError
        ``fraction`` not finite and positive, or under the kernel's 1 ms per period.
    """
    if not (0 < fraction < float("inf")):
        raise ValueError(f"CPU quota must be finite and positive, got {fraction!r}")
    quota = round(fraction * period_us)
    if quota < _MIN_QUOTA_US:
        raise ValueError(
            f"CPU quota {fraction:g} is below the kernel's minimum "
            f"{_MIN_QUOTA_US / period_us:g} of a core"
        )
    return quota


class CpuGroups:
    """One CPU group with a quota per silo, under a parent group this object makes and
    removes.

    Parameters
    ----------
    quotas : Sequence[tuple[str, float]]
        ``(silo_id, fraction of one core)`` of each silo, e.g. ``[("silo-0", 1.0),
        ("silo-1", 0.5)]``.
    hierarchy : Hierarchy | None (default: None)
        Where to make the groups; ``None``: :func:`detect_hierarchy` of /sys/fs/cgroup.
    name : str | None (default: None)
        The parent group's name; ``None``: ``fl-lbbsp-<pid>-<random>``.
    weight : float (default: 1.0)
        Each silo's CPU weight against the machine's other work, in ordinary processes:
        the parent group weighs ``weight`` times the silos' count of them (v1
        ``cpu.shares``, 1024 a process; v2 ``cpu.weight``, 100 a process), each silo's
        group one share of it. A group alone weighs like one process, which would make
        the silos together compete for the CPU like a single process; 1 lets each silo
        compete like the process it would be outside a group. Within its quota only: the
        quota bounds it whatever its weight.

    Raises
    ------
    ValueError
        A quota that is not a usable fraction (:func:`quota_us`), or no hierarchy.
    """

    def __init__(
        self,
        quotas: Sequence[tuple[str, float]],
        *,
        hierarchy: Hierarchy | None = None,
        name: str | None = None,
        weight: float = 1.0,
    ) -> None:
        if not (0 < weight < float("inf")):
            raise ValueError(f"weight must be finite and positive, got {weight!r}")
        self.weight = weight
        self.quotas = {silo: float(q) for silo, q in quotas}
        for q in self.quotas.values():
            quota_us(q)
        if hierarchy is None:
            found = detect_hierarchy()
            if isinstance(found, str):
                raise ValueError(found)
            hierarchy = found
        self.hierarchy = hierarchy
        self.name = name or f"fl-lbbsp-{os.getpid()}-{secrets.token_hex(4)}"
        self.parent = hierarchy.root / self.name
        """The parent group (removed last)."""
        self.made: list[Path] = []
        """The groups made so far, in the order they were made."""

    def path(self, silo_id: str) -> Path:
        """The group of silo ``silo_id``."""
        return self.parent / silo_id

    def create(self) -> None:
        """Make the parent group and one group per silo with its quota.

        Raises
        ------
        OSError
            A group or quota the kernel refused (the groups made so far stay in
            :attr:`made`, for :meth:`remove`).
        """
        self.parent.mkdir()
        self.made.append(self.parent)
        v1 = self.hierarchy.version == 1
        unit, weight_file = (1024, "cpu.shares") if v1 else (100, "cpu.weight")
        total = round(self.weight * unit * len(self.quotas))
        _write(self.parent / weight_file, min(total, 262144 if v1 else 10000))
        if not v1:
            _write(self.parent / "cgroup.subtree_control", "+cpu")
        for silo, fraction in self.quotas.items():
            group = self.path(silo)
            group.mkdir()
            self.made.append(group)
            quota = quota_us(fraction)
            if v1:
                _write(group / "cpu.cfs_period_us", CFS_PERIOD_US)
                _write(group / "cpu.cfs_quota_us", quota)
            else:
                _write(group / "cpu.max", f"{quota} {CFS_PERIOD_US}")

    def quota_of(self, silo_id: str) -> float:
        """The quota the kernel holds for silo ``silo_id``'s group, as a fraction of a core
        (read back from the group's files)."""
        group = self.path(silo_id)
        if self.hierarchy.version == 1:
            quota = int((group / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
            period = int((group / "cpu.cfs_period_us").read_text(encoding="utf-8"))
        else:
            text, period_text = (group / "cpu.max").read_text(encoding="utf-8").split()
            quota, period = (-1 if text == "max" else int(text)), int(period_text)
        return quota / period if quota > 0 else float("inf")

    def join(self, silo_id: str | None) -> Callable[[], None] | None:
        """What a child process runs before ``exec`` to enter silo ``silo_id``'s group
        (``None``: the silo has no group). It writes the child's own pid to the group's
        ``cgroup.procs``; a failure makes the start fail (``subprocess`` raises it)."""
        if silo_id is None or silo_id not in self.quotas:
            return None
        procs = str(self.path(silo_id) / "cgroup.procs")

        def enter() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return enter

    def members(self) -> list[int]:
        """Pids of the processes in the groups made (their ``cgroup.procs``)."""
        pids: list[int] = []
        for group in self.made:
            with contextlib.suppress(OSError):
                text = (group / "cgroup.procs").read_text(encoding="utf-8")
                pids += [int(p) for p in text.split()]
        return pids

    def remove(self, *, timeout: float = 5.0) -> list[Path]:
        """Remove the groups made, silos' first, the parent last; kill (SIGKILL) any
        process still in one of them and wait up to ``timeout`` s for it to go.

        Returns
        -------
        list of Path
            The groups that could not be removed (empty: none is left).
        """
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for group in [*reversed(self.made)]:
                try:
                    group.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as err:
                    if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                        raise
                    continue
                self.made.remove(group)
            if not self.made or time.monotonic() >= deadline:
                return list(self.made)
            time.sleep(0.05)


def _write(path: Path, value: object) -> None:
    """Write one value to a cgroup control file."""
    path.write_text(str(value), encoding="utf-8")
