"""A local Flower deployment: one SuperLink and N SuperNodes on 127.0.0.1, TLS by default.

:class:`LocalFederation` starts Flower's own programs (nothing here imports Flower):
``flower-superlink`` and one ``flower-supernode`` per silo, each on a free loopback port
with its silo's ``--node-config``, and writes a SuperLink connection to
``<workdir>/flwr-home/config.toml``, so that

    FLWR_HOME=<workdir>/flwr-home flwr run examples/quickstart lbbsp-local --stream

runs an app against it without touching ``~/.flwr``. Leaving the ``with`` block (normally,
by an exception or by Ctrl-C) stops every process it started, by pid, with every
descendant (Flower's SuperExec, ServerApp and ClientApp processes) and every process a
crashed parent left behind (:meth:`.processes.ProcessGroup.leftovers`).

Around the silos, each optional (see :class:`LocalFederation`): SuperNode authentication
with TLS (:func:`~.tls.generate_node_keys`, so that a node holding only the CA file is
refused), signed replies (:mod:`fl_lbbsp.security.identity`), a warm worker per silo
(:mod:`fl_lbbsp.clients.warm`: Flower starts a ClientApp process for every message, and
the worker keeps torch, the data and the model), a CPU group per silo
(:mod:`.cpu_groups`), a rate-limited link per silo (:mod:`.link`), and restarts of dead
SuperNodes and workers (:meth:`LocalFederation.supervise`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from ...clients.warm import SOCKET_FILE, socket_answers
from ...security.identity import REGISTRY_FILE
from ...security.silo_keys import check_silo_keys, write_silo_keys
from .cpu_groups import CpuGroups, cpu_groups_problem, detect_hierarchy
from .flower_cli import (
    flower_config,
    register_node_key,
    registered_node_ids,
    superlink_args,
    supernode_args,
)
from .link import link_args
from .processes import (
    ManagedProcess,
    ProcessGroup,
    RestartPolicy,
    free_port,
    port_open,
    revive,
    signal_tree,
    wait_until_ready,
)
from .silos import SiloNode, WarmFolders, node_config, silo_nodes, worker_args
from .tls import NodeKeys, TlsFiles, generate_node_keys, generate_tls

__all__ = ["AUTO_SILO_KEYS", "CONNECTION", "LocalFederation"]

CONNECTION = "lbbsp-local"
"""Name of the SuperLink connection written to the federation's Flower configuration."""

AUTO_SILO_KEYS = "auto"
"""``silo_registry`` value that generates the silos' signing keys in ``<workdir>/silo-keys``."""

_TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
# The folder holding the fl_lbbsp package, which child processes import as this one does
# (a source checkout or an installed copy alike); fl_lbbsp/ itself on the path would
# shadow packages such as `datasets`.
_PACKAGE_ROOT = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]


class LocalFederation:
    """SuperLink plus one SuperNode per silo on 127.0.0.1, torn down on exit: a context
    manager, up (every SuperNode registered) when the ``with`` block starts, every process
    it started stopped when the block ends, whatever the reason.

    Parameters
    ----------
    workdir : str | Path
        Folder for certificates, keys, logs, the Flower homes and configuration.
    num_silos : int (default: 3)
        SuperNodes; silo i gets ``partition-id=i`` and ``num-partitions=num_silos``.
    slowdowns : sequence of float | None (default: None)
        Emulated slowdown k >= 1 of each silo (it computes for t, waits (k - 1) t and
        reports k t). ``None``: 1 for every silo.
    silo_ids : sequence of str | None (default: None)
        Each silo's ``silo-id``. ``None``: ``silo-0``, ``silo-1``, ...
    insecure : bool (default: False)
        No TLS. By default a CA and a server certificate are made in ``<workdir>/tls``.
    node_auth : bool | None (default: None)
        SuperNode authentication, keys in ``<workdir>/node-keys``. ``None``: on with TLS,
        off with ``insecure`` (Flower requires TLS for it).
    serialize_compute : bool | None (default: None)
        Node config ``compute-lock=<workdir>/compute-slots``: the quickstart's silos take
        turns computing (like the simulation's ``--parallel 1``), so that silos sharing
        this machine do not slow each other down, noise their slowdowns would multiply.
        ``None``: on, unless ``cpu_quotas`` are given (a quota is the silo's capacity;
        silos computing in turns would add up their times).
    node_config : Mapping[str, str | int | float] | None (default: None)
        Extra ``--node-config`` entries of every SuperNode.
    silo_registry : str | Path | None (default: None)
        Signed replies: a key folder of ``fl-lbbsp keys silos`` (checked here), or
        ``"auto"`` (:data:`AUTO_SILO_KEYS`) to make one in ``<workdir>/silo-keys`` at
        start. ``None``: replies are unsigned.
    connection : str (default: "lbbsp-local")
        Name of the SuperLink connection in the written Flower configuration.
    env : Mapping[str, str] | None (default: None)
        Extra environment variables of every process.
    startup_timeout : float (default: 90.0)
        Seconds to wait for the SuperLink to listen and every SuperNode to register.
    warm_workers : bool (default: True)
        A warm silo worker beside every SuperNode. ``False``: every ClientApp process
        trains itself.
    task_poll_interval : float | None (default: 0.2)
        Seconds between a SuperExec's requests for work (0.01-60); an ``env`` entry wins.
        ``None``: Flower's default (1 s).
    cpu_quotas : sequence of float | None (default: None)
        Each silo's CPU quota, a fraction of one core (1: a core, 0.25: a quarter): its
        SuperNode, the processes it starts and its warm worker run in a CPU group with
        that quota (:class:`~.cpu_groups.CpuGroups`). ``None``: no groups.
    link_mbps : sequence of float | None | None (default: None)
        Each silo's link rate to the SuperLink in Mbit/s (``None`` in the list: not
        limited): its SuperNode connects through a rate-limited proxy (:mod:`.link`).
    cpu_weight : float (default: 1.0)
        With ``cpu_quotas``: each silo's CPU weight against the machine's other work, in
        ordinary processes (:class:`~.cpu_groups.CpuGroups`' ``weight``).
    cgroup_root : str | Path (default: "/sys/fs/cgroup")
        Where the cgroup file systems are mounted.

    Raises
    ------
    ValueError
        Settings that cannot be used; with ``cpu_quotas``, where CPU groups cannot be
        made here (:func:`~.cpu_groups.cpu_groups_problem`: the message says why).
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        num_silos: int = 3,
        slowdowns: Sequence[float] | None = None,
        silo_ids: Sequence[str] | None = None,
        insecure: bool = False,
        node_auth: bool | None = None,
        serialize_compute: bool | None = None,
        node_config: Mapping[str, str | int | float] | None = None,
        silo_registry: str | Path | None = None,
        connection: str = CONNECTION,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 90.0,
        warm_workers: bool = True,
        task_poll_interval: float | None = 0.2,
        cpu_quotas: Sequence[float] | None = None,
        link_mbps: Sequence[float | None] | None = None,
        cpu_weight: float = 1.0,
        cgroup_root: str | Path = "/sys/fs/cgroup",
    ) -> None:
        self.silos = silo_nodes(
            num_silos, slowdowns, silo_ids, cpu_quotas=cpu_quotas, link_mbps=link_mbps
        )
        self.num_silos = num_silos
        self.workdir = Path(workdir).resolve()
        ids = [s.silo_id for s in self.silos]
        self._generate_silo_keys = str(silo_registry) == AUTO_SILO_KEYS
        self.silo_keys = signing_keys_folder(silo_registry, workdir=self.workdir, silo_ids=ids)
        """Folder of the silos' signing keys and ``registry.json`` (None: unsigned)."""
        self.registry_file = None if self.silo_keys is None else self.silo_keys / REGISTRY_FILE
        """The silo registry the app's server checks signatures with (None: unsigned)."""
        self.flwr_home = self.workdir / "flwr-home"
        """FLWR_HOME holding the Flower configuration with the SuperLink connection."""
        self.bin_dir = Path(sys.executable).parent
        """Folder of the Flower programs (the running interpreter's)."""
        if node_auth and insecure:
            raise ValueError("SuperNode authentication needs TLS: drop insecure or node_auth")
        self.insecure = insecure
        self.node_auth = (not insecure) if node_auth is None else node_auth
        self.node_keys: dict[str, NodeKeys] = {}
        self.connection = connection
        self.startup_timeout = startup_timeout
        self.cpu_groups: CpuGroups | None = None
        """The silos' CPU groups (``None``: no quotas)."""
        if cpu_quotas is not None:
            problem = cpu_groups_problem(Path(cgroup_root))
            if problem is not None:
                raise ValueError(f"CPU quotas need CPU groups: {problem}")
            hierarchy = detect_hierarchy(Path(cgroup_root))
            assert not isinstance(hierarchy, str)  # no problem: there is one
            self.cpu_groups = CpuGroups(
                [(s.silo_id, s.cpu_quota or 0.0) for s in self.silos],
                hierarchy=hierarchy,
                weight=cpu_weight,
            )
        if serialize_compute is None:
            serialize_compute = cpu_quotas is None
        lock = {"compute-lock": str(self.workdir / "compute-slots")} if serialize_compute else {}
        self._extra_node_config = {**lock, **(node_config or {})}
        self._extra_env = {**_task_poll_env(task_poll_interval), **(env or {})}
        self.warm_workers = warm_workers
        self._warm = WarmFolders(self.workdir, ids)
        self.host, self.port = "127.0.0.1", 0
        self.tls: TlsFiles | None = None
        self.processes = ProcessGroup(self.workdir, self._base_env)
        """Every process of the federation (its log, Flower home and descendants)."""
        self.superlink: ManagedProcess | None = None
        self.supernodes: list[ManagedProcess] = []
        self.workers: list[ManagedProcess] = []
        """The silos' warm workers (empty without ``warm_workers``), in silo order."""
        self.links: dict[str, ManagedProcess] = {}
        """The link proxy of each silo with a limited link, by silo id."""
        self._link_ports: dict[str, int] = {}
        self.node_ids: dict[str, int] = {}
        self._restart_at: dict[int, float] = {}  # silo index -> when to start it again
        self._worker_restart_at: dict[int, float] = {}

    # ---------------------------------------------------------------- public
    @property
    def address(self) -> str:
        """``host:port`` of the SuperLink (Fleet, Control and Runtime APIs)."""
        return f"{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        """Environment for ``flwr`` commands against this federation."""
        return {**self._base_env(), "FLWR_HOME": str(self.flwr_home)}

    def app_run_config(self) -> dict[str, str]:
        """Run-config entries the federation gives an app: ``silo-registry`` with signed
        replies, else none (Flower refuses keys an app does not declare)."""
        registry = self.registry_file
        return {} if registry is None else {"silo-registry": str(registry)}

    def run_command(self, app: str | Path, *extra: str) -> list[str]:
        """``flwr run APP CONNECTION *extra`` against this federation."""
        return [str(self.bin_dir / "flwr"), "run", str(app), self.connection, *extra]

    def process_tree(self) -> list[int]:
        """Pids of the processes started and of all their current descendants."""
        return self.processes.tree()

    def leftovers(self) -> list[int]:
        """Pids of processes of this federation still running that are not the SuperLink,
        a SuperNode or their descendants (:meth:`ProcessGroup.leftovers`)."""
        return self.processes.leftovers()

    def start(self) -> LocalFederation:
        """Start the SuperLink and the SuperNodes; wait until every node registered."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        ids = [s.silo_id for s in self.silos]
        if not self.insecure:
            self.tls = generate_tls(self.workdir / "tls", hosts=(self.host, "localhost"))
        if self.node_auth:
            self.node_keys = generate_node_keys(self.workdir / "node-keys", ids)
        if self._generate_silo_keys and self.silo_keys is not None:
            write_silo_keys(self.silo_keys, ids, overwrite=True)
        self.port = free_port(self.host)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        config = flower_config(self.connection, self.address, self.tls)
        (self.flwr_home / "config.toml").write_text(config, encoding="utf-8")
        try:
            if self.cpu_groups is not None:
                self.cpu_groups.create()
            args = superlink_args(
                self.bin_dir, host=self.host, port=self.port, tls=self.tls, node_auth=self.node_auth
            )
            self.superlink = self.processes.spawn("superlink", args, "superlink")
            self._wait_for_superlink()
            for silo_id, keys in self.node_keys.items():
                register_node_key(
                    self.bin_dir,
                    keys.public_key,
                    connection=self.connection,
                    name=silo_id,
                    env=self.environment(),
                    timeout=self.startup_timeout,
                )
            if self.warm_workers:
                for i, silo_id in enumerate(ids):
                    args = worker_args(self.warm_folder(silo_id))
                    self.workers.append(
                        self.processes.spawn(
                            f"{silo_id}-worker", args, f"worker-{i}", enter=self._enter(silo_id)
                        )
                    )
            self._start_links()
            for i, silo in enumerate(self.silos):
                self.silos[i] = silo = replace(silo, port=free_port(self.host))
                args = self._supernode_args(silo)
                self.supernodes.append(
                    self.processes.spawn(
                        silo.silo_id, args, f"node-{i}", enter=self._enter(silo.silo_id)
                    )
                )
            self._wait_for_supernodes()
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def kill_silo(self, index: int, *, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (a crash by default) to SuperNode ``index`` and its descendants."""
        proc = self.supernodes[index]
        signal_tree(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)

    def restart_silo(self, index: int) -> ManagedProcess:
        """Start SuperNode ``index`` again with its command line, key and port; its log
        continues in the same file."""
        self.supernodes[index] = self.processes.restart(self.supernodes[index])
        return self.supernodes[index]

    def restart_worker(self, index: int) -> ManagedProcess:
        """Start silo ``index``'s warm worker again (same folder; a new token); its log
        continues in the same file."""
        self.workers[index] = self.processes.restart(self.workers[index])
        return self.workers[index]

    def warm_folder(self, silo_id: str) -> Path:
        """Folder of a silo's warm worker (its socket and token): node config
        ``warm-worker`` of its SuperNode."""
        return self._warm.folder(silo_id)

    def supervise(
        self, policy: RestartPolicy, *, log: IO[str] | None = None, now: float | None = None
    ) -> str | None:
        """One supervision step: restart SuperNodes and warm silo workers that died (when
        ``policy`` says so and its delay has passed), report the SuperLink's death.

        Parameters
        ----------
        policy : RestartPolicy
            Whether and when a dead SuperNode or worker is started again.
        log : IO[str] | None (default: None)
            Where a death or restart is reported, one line each (default: stderr).
        now : float | None (default: None)
            ``time.monotonic()`` (a parameter for tests).

        Returns
        -------
        str | None
            Why the federation must stop (the SuperLink exited), else ``None``.
        """
        out = sys.stderr if log is None else log
        now = time.monotonic() if now is None else now
        self.processes.remember()
        if self.superlink is not None and not self.superlink.alive():
            code = self.superlink.popen.returncode
            return f"superlink exited with code {code}; see {self.superlink.log_path}"
        revive(self.supernodes, self._restart_at, self.restart_silo, left_out="left out",
               policy=policy, now=now, out=out)  # fmt: skip
        revive(self.workers, self._worker_restart_at, self.restart_worker, policy=policy,
               left_out="its silo trains in its ClientApp processes", now=now, out=out)  # fmt: skip
        return None

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop every process started, SuperNodes first, then any process of the
        federation left behind (:meth:`leftovers`), and close the log files."""
        try:
            self.processes.stop(grace=grace)
        finally:
            self._warm.remove()
            if self.cpu_groups is not None:
                left = self.cpu_groups.remove(timeout=grace)
                if left:
                    names = ", ".join(map(str, left))
                    print(f"fl-lbbsp: CPU groups left behind: {names}", file=sys.stderr)

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- helpers
    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        paths = [str(_PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_TELEMETRY_ENABLED"] = "0"
        env.update(self._extra_env)
        return env

    def _enter(self, silo_id: str) -> Callable[[], None] | None:
        """What a process of silo ``silo_id`` runs before ``exec``: entering its CPU group
        (``None``: no groups)."""
        return None if self.cpu_groups is None else self.cpu_groups.join(silo_id)

    def _start_links(self) -> None:
        """Start a link proxy for every silo with a limited link; wait until each listens."""
        for silo in self.silos:
            if silo.link_mbps is None:
                continue
            port = self._link_ports[silo.silo_id] = free_port(self.host)
            args = link_args((self.host, port), (self.host, self.port), mbps=silo.link_mbps)
            self.links[silo.silo_id] = self.processes.spawn(
                f"{silo.silo_id}-link", args, f"link-{silo.silo_id}"
            )
        pending = {silo: proc for silo, proc in self.links.items()}
        late = wait_until_ready(
            pending,
            lambda silo, _: port_open(self.host, self._link_ports[silo]),
            timeout=self.startup_timeout,
        )
        if late:
            raise TimeoutError(f"link proxies of {late} not listening after startup timeout")

    def superlink_for(self, silo_id: str) -> str:
        """``host:port`` silo ``silo_id``'s SuperNode connects to: its link proxy's, or
        the SuperLink's."""
        port = self._link_ports.get(silo_id)
        return self.address if port is None else f"{self.host}:{port}"

    def _supernode_args(self, silo: SiloNode) -> list[str]:
        warm = self.warm_folder(silo.silo_id) if self.warm_workers else None
        config = node_config(silo, num_silos=self.num_silos, extra=self._extra_node_config,
                             signing_keys=self.silo_keys, warm_folder=warm)  # fmt: skip
        with_key = self.node_auth and self.tls is not None
        return supernode_args(
            self.bin_dir,
            superlink=self.superlink_for(silo.silo_id),
            node_config=config,
            host=self.host,
            port=silo.port,
            tls=self.tls,
            auth_key=self.node_keys[silo.silo_id].private_key if with_key else None,
        )

    def _wait_for_superlink(self) -> None:
        assert self.superlink is not None
        up = wait_until_ready(
            {"superlink": self.superlink},
            lambda _, proc: port_open(self.host, self.port),
            timeout=self.startup_timeout,
        )
        if up:
            raise TimeoutError(f"SuperLink not listening on {self.address} after startup timeout")

    def _wait_for_supernodes(self) -> None:
        pending = dict(zip((s.silo_id for s in self.silos), self.supernodes, strict=True))
        self.node_ids.update(registered_node_ids(pending, timeout=self.startup_timeout))

    def _wait_for_workers(self) -> None:
        """Wait until every warm worker answers on its socket (it imports torch first)."""
        sockets = (str(self.warm_folder(s.silo_id) / SOCKET_FILE) for s in self.silos)
        pending = dict(zip(sockets, self.workers, strict=False))
        late = wait_until_ready(
            pending, lambda path, _: socket_answers(path), timeout=self.startup_timeout
        )
        if late:
            raise TimeoutError(f"warm workers {late} did not start in time")


def signing_keys_folder(
    silo_registry: str | Path | None, *, workdir: Path, silo_ids: Sequence[str]
) -> Path | None:
    """The folder of the silos' signing keys: ``<workdir>/silo-keys`` (made at start) for
    :data:`AUTO_SILO_KEYS`, else the key folder given, checked to hold a key of every silo
    (``None``: replies are unsigned).

    Raises
    ------
    IdentityError
        A given folder without a usable registry and key of every silo (a ValueError).
    """
    if str(silo_registry) == AUTO_SILO_KEYS:
        return workdir / "silo-keys"
    if silo_registry is None:
        return None
    folder = Path(silo_registry).resolve()
    check_silo_keys(folder, silo_ids)
    return folder


def _task_poll_env(interval: float | None) -> dict[str, str]:
    """Flower's SuperExec task poll interval as an environment entry (``None``: none)."""
    if interval is None:
        return {}
    if not 0.01 <= interval <= 60:
        raise ValueError(f"task_poll_interval must be in [0.01, 60], got {interval}")
    return {_TASK_POLL_ENV: f"{interval:g}"}
