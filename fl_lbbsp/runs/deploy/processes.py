"""The processes of a local federation: each started in its own session with its log file
and Flower home (:class:`ProcessGroup`), waited for until it is ready, supervised (a dead
one started again, :class:`RestartPolicy` and :func:`revive`), and stopped by pid with
every descendant (:func:`stop_processes`), including those a crashed parent left behind
(:meth:`ProcessGroup.leftovers`).

Nothing here knows Flower: the group starts command lines it is given.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

__all__ = [
    "ManagedProcess",
    "ProcessGroup",
    "RestartPolicy",
    "check_alive",
    "free_port",
    "port_open",
    "revive",
    "signal_tree",
    "stop_processes",
    "wait_until_ready",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class ManagedProcess:
    """A process started by a :class:`ProcessGroup`, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)
    args: tuple[str, ...] = ()
    """Command line it was started with (a restart runs it again)."""
    home: str = ""
    """Name of its FLWR_HOME under ``<workdir>/homes``."""
    started_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when it was started."""
    enter: Callable[[], None] | None = field(default=None, repr=False)
    """Run in the child before ``exec`` (e.g. entering its CPU group); a restart runs it
    again."""

    @property
    def pid(self) -> int:
        """Process id."""
        return int(self.popen.pid)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def close_log(self) -> None:
        """Close this side's handle on the log file (the process keeps its own)."""
        if self._log is not None:
            self._log.close()
            self._log = None


def check_alive(proc: ManagedProcess) -> None:
    """RuntimeError, with the end of its log, if ``proc`` has exited."""
    if not proc.alive():
        tail = "\n".join(proc.log_text().splitlines()[-20:])
        raise RuntimeError(
            f"{proc.name} exited with code {proc.popen.returncode}; its log ends:\n{tail}"
        )


def wait_until_ready(
    pending: Mapping[str, ManagedProcess],
    ready: Callable[[str, ManagedProcess], bool],
    *,
    timeout: float,
    interval: float = 0.2,
) -> list[str]:
    """Poll ``ready(key, process)`` every ``interval`` s for each pending key until all are
    ready or ``timeout`` s have passed; return the keys still not ready.

    Raises
    ------
    RuntimeError
        A pending process exited first (:func:`check_alive`).
    """
    left = dict(pending)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for key, proc in list(left.items()):
            check_alive(proc)
            if ready(key, proc):
                del left[key]
        if left:
            time.sleep(interval)
    return sorted(left)


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to process ``pid`` and every descendant it has now."""
    targets: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        targets = [root, *root.children(recursive=True)]
    for target in targets:
        with contextlib.suppress(psutil.Error):
            target.send_signal(sig)


def stop_processes(pids: Sequence[int], *, grace: float = 5.0) -> list[int]:
    """SIGTERM each pid and its descendants, wait ``grace`` s, SIGKILL what is left.

    Parameters
    ----------
    pids : sequence of int
        Processes to stop; their descendants are found (parent links) before any signal.
    grace : float (default: 5.0)
        Seconds between SIGTERM and SIGKILL.

    Returns
    -------
    list of int
        The pids that were still alive when SIGKILL was sent.
    """
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        # Descendants first: Flower's SuperLink starts its SuperExec in a new session,
        # so only the parent/child links (read before anything is stopped) reach it.
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                procs[child.pid] = child
        procs[pid] = root
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in alive]


class ProcessGroup:
    """The processes one federation starts, and every process they start in turn.

    Each process runs in its own session (its descendants are found by parent links),
    writes to ``<workdir>/logs/<name>.log`` and has its own Flower home,
    ``<workdir>/homes/<home>``; on Linux it gets SIGTERM when this process dies.

    Parameters
    ----------
    workdir : Path
        The federation's folder (``logs`` and ``homes`` are under it).
    environment : callable
        The environment of every process started (its ``FLWR_HOME`` is set here), read
        at every start.
    """

    def __init__(self, workdir: Path, environment: Callable[[], dict[str, str]]) -> None:
        self.workdir = workdir
        self._environment = environment
        self.started: list[ManagedProcess] = []
        """The processes started directly, in the order they were started."""
        self._seen: dict[int, float] = {}  # pid -> create time of every process seen

    def spawn(
        self,
        name: str,
        args: Sequence[str],
        home: str,
        *,
        append: bool = False,
        enter: Callable[[], None] | None = None,
    ) -> ManagedProcess:
        """Start ``args`` as ``name`` with Flower home ``home``; with ``append`` its log
        continues the file of an earlier start; ``enter`` runs in the child before
        ``exec`` (:meth:`CpuGroups.join <fl_lbbsp.runs.deploy.cpu_groups.CpuGroups.join>`:
        the process and everything it starts then run in a CPU group)."""
        env = self._environment()
        env["FLWR_HOME"] = str(self.workdir / "homes" / home)
        log_path = self.workdir / "logs" / f"{name}.log"
        log = log_path.open("ab" if append else "wb")
        if append:
            log.write(b"\n----- restarted by fl_lbbsp -----\n")
            log.flush()
        popen = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_child_setup(enter),
        )
        proc = ManagedProcess(name=name, popen=popen, log_path=log_path, _log=log,
                              args=tuple(args), home=home, enter=enter)  # fmt: skip
        self.started.append(proc)
        return proc

    def restart(self, old: ManagedProcess) -> ManagedProcess:
        """Start a process that exited again, with its command line and home; its log
        continues in the same file.

        Raises
        ------
        RuntimeError
            ``old`` is still running.
        """
        if old.alive():
            raise RuntimeError(f"{old.name} (pid {old.pid}) is still running")
        old.close_log()
        return self.spawn(old.name, old.args, old.home, append=True, enter=old.enter)

    def pids(self) -> list[int]:
        """Pids of the processes started directly."""
        return [p.pid for p in self.started]

    def tree(self) -> list[int]:
        """Pids of the processes started and of all their current descendants."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                found += [pid, *(c.pid for c in proc.children(recursive=True))]
        return found

    def remember(self) -> None:
        """Note every process of the group now running (descendants included), so that
        :meth:`stop` finds them even after their parent died (a SuperLink killed outright
        leaves its SuperExec and ServerApp behind, reparented)."""
        for pid in self.tree():
            with contextlib.suppress(psutil.Error):
                self._seen.setdefault(pid, psutil.Process(pid).create_time())

    def leftovers(self) -> list[int]:
        """Pids of processes of the group still running that are not a process started
        directly or one of their descendants: those seen by :meth:`remember` and those
        whose environment names a Flower home of the group (orphans of a crash)."""
        current = set(self.tree())
        found: set[int] = set()
        for pid, created in self._seen.items():
            with contextlib.suppress(psutil.Error):
                if pid not in current and psutil.Process(pid).create_time() == created:
                    found.add(pid)
        homes = str(self.workdir / "homes") + os.sep
        me = os.getpid()
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in current or proc.pid == me:
                continue
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("FLWR_HOME", "").startswith(homes):
                    found.add(proc.pid)
        return sorted(found)

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop every process started, the last started first, then any process of the
        group left behind (:meth:`leftovers`), and close the log files."""
        self.remember()
        last_first = [*reversed(self.started)]
        stop_processes([p.pid for p in last_first if p.alive()], grace=grace)
        left = self.leftovers()
        if left:
            stop_processes(left, grace=grace)
        for proc in last_first:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace)
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.popen.wait()
            proc.close_log()


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


def _child_setup(enter: Callable[[], None] | None) -> Callable[[], None] | None:
    """What a child runs before ``exec``: :func:`_die_with_parent` on Linux, then
    ``enter``."""
    steps = [_die_with_parent] if sys.platform == "linux" else []
    steps += [enter] if enter is not None else []
    if len(steps) <= 1:
        return steps[0] if steps else None

    def setup() -> None:
        for step in steps:
            step()

    return setup


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the parent dies (Linux ``prctl``).

    Teardown by pid covers every way out of a ``with`` block; this covers the parent being
    killed outright (SIGKILL, a CI timeout), which would otherwise leave the SuperLink
    and SuperNodes running in their own sessions.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
