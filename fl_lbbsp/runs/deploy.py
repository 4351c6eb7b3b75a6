"""A local Flower deployment: one SuperLink and N SuperNodes on 127.0.0.1, TLS by default.

:class:`LocalFederation` starts ``flower-superlink`` and one ``flower-supernode`` per silo,
each on a free loopback port and with its own ``silo-id``, ``partition-id``,
``num-partitions`` and emulated ``slowdown`` in ``--node-config``. TLS is on unless
``insecure=True``: :func:`generate_tls` makes a throw-away CA and a server certificate for
127.0.0.1 / localhost with ``cryptography``. A Flower configuration file with one SuperLink
connection is written to ``<workdir>/flwr-home/config.toml`` so that

    FLWR_HOME=<workdir>/flwr-home flwr run examples/quickstart lbbsp-local --stream

runs an app against it without touching ``~/.flwr``. Leaving the ``with`` block (normally,
by an exception or by Ctrl-C) stops every process it started, by pid: each launched
process, and every descendant found at teardown (Flower's SuperExec, ServerApp and
ClientApp processes), SIGTERM first, SIGKILL after a grace period, then every process a
crashed parent left behind (:meth:`LocalFederation.leftovers`: descendants seen earlier,
and any process whose ``FLWR_HOME`` is one of the federation's).

With TLS, Flower's SuperNode authentication is on by default: :func:`generate_node_keys`
makes one EC key pair per silo, each public key is registered with the SuperLink
(``flwr supernode register``) before its SuperNode starts with the private key, and the
SuperLink runs with ``--enable-supernode-auth``, so a node without a registered key (one
that has the public CA file, say) is refused. :meth:`LocalFederation.supervise` restarts
a SuperNode that died (:class:`RestartPolicy`) and reports a dead SuperLink; :func:`serve`
(``fl-lbbsp deploy-local``) and :func:`run_app` use it, and :func:`run_app` reports the
run's final status (:attr:`RunOutcome.exit_code` is 0 only for ``finished:completed``).

With ``silo_registry`` (``fl-lbbsp deploy-local --silo-registry KEYDIR``, or ``auto`` to
generate the keys, which ``fl-lbbsp deploy-local`` does by default with TLS) every
SuperNode gets its own Ed25519 signing key as ``signing-key=".../silo-<id>.key"`` in its
``--node-config``, and :func:`run_app` (and the printed ``flwr run`` command) give the app
``silo-registry=".../registry.json"`` in its run config: the quickstart's silos then sign
their train replies, over the id of the instruction each answers, and its server rejects
any reply that is not signed by the silo it claims for the instruction it sent that node
(:mod:`fl_lbbsp.core.identity`). Silo ids follow
:data:`~fl_lbbsp.core.identity.SILO_ID_PATTERN`.

With ``warm_workers`` (the default; ``fl-lbbsp deploy-local --no-warm-worker`` turns it
off) every silo also gets a warm worker (:mod:`fl_lbbsp.clients.warm`): a long-lived
process holding torch, the data and the model, started before its SuperNode, supervised
and stopped with it; its folder is the SuperNode's node config ``warm-worker``. Flower
starts a new ClientApp process for every message, and the quickstart's then imports
no torch and hands the training to the worker. ``task_poll_interval`` sets how often each
SuperNode's SuperExec asks for a ClientApp to launch (Flower's
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 1 s by default; 0.2 s here).

Nothing here imports Flower: the pieces are Flower's own command-line programs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from ..clients.emulation import slowdowns_from_speeds
from ..core.identity import (
    REGISTRY_FILE,
    check_silo_id,
    check_silo_keys,
    key_file_name,
    write_silo_keys,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Flower depends on tomli
    import tomli as tomllib

__all__ = [
    "AUTO_SILO_KEYS",
    "LocalFederation",
    "ManagedProcess",
    "NodeKeys",
    "RestartPolicy",
    "RunOutcome",
    "SiloNode",
    "TlsFiles",
    "app_declares",
    "exit_code_for",
    "free_port",
    "generate_node_keys",
    "generate_tls",
    "read_run_config",
    "run_app",
    "run_status",
    "serve",
    "slowdowns_from_speeds",
    "stop_processes",
    "write_run_config",
]

CONNECTION = "lbbsp-local"
"""Name of the SuperLink connection written to the federation's Flower configuration."""

AUTO_SILO_KEYS = "auto"
"""``silo_registry`` value that generates the silos' signing keys in ``<workdir>/silo-keys``."""

_NODE_ID = re.compile(r"SuperNode ID: (\d+)")
_TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
_SOCKET_PATH_MAX = 100  # bytes of a Unix socket path (sun_path holds 104-108)


# --------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a local CA and the SuperLink's certificate signed by it."""

    ca_cert: Path
    """CA certificate: SuperNodes' ``--root-certificates``, the CLI's ``root-certificates``."""
    server_cert: Path
    """SuperLink certificate (``--ssl-certfile``), valid for 127.0.0.1 and localhost."""
    server_key: Path
    """SuperLink private key (``--ssl-keyfile``), readable by the owner only."""


def generate_tls(
    folder: str | Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    valid_days: int = 30,
) -> TlsFiles:
    """Create a CA and a server certificate for ``hosts`` in ``folder``.

    Parameters
    ----------
    folder : str | Path
        Where ``ca.pem``, ``ca.key``, ``server.pem`` and ``server.key`` are written
        (created if missing; keys get mode 0600).
    hosts : sequence of str (default: ("127.0.0.1", "localhost"))
        Subject alternative names of the server certificate: IP addresses or DNS names.
    valid_days : int (default: 30)
        Validity of both certificates.

    Returns
    -------
    TlsFiles
        Paths of the CA certificate and the server certificate and key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if valid_days <= 0:
        raise ValueError(f"valid_days must be positive, got {valid_days!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fl_lbbsp local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    files = TlsFiles(
        ca_cert=out / "ca.pem", server_cert=out / "server.pem", server_key=out / "server.key"
    )
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out / "ca.key", ca_key)
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.server_key, server_key)
    return files


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's authentication key pair (Flower's SuperNode authentication)."""

    private_key: Path
    """OpenSSH private key (``flower-supernode --auth-supernode-private-key``), mode 0600."""
    public_key: Path
    """OpenSSH public key, registered with ``flwr supernode register``."""


def generate_node_keys(folder: str | Path, names: Sequence[str]) -> dict[str, NodeKeys]:
    """Create one EC (NIST P-384) key pair per SuperNode in ``folder``.

    Parameters
    ----------
    folder : str | Path
        Where ``<name>`` and ``<name>.pub`` are written (created if missing; private
        keys get mode 0600).
    names : sequence of str
        One key pair per name (the silo ids).

    Returns
    -------
    dict of str to NodeKeys
        The key files of each name.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, NodeKeys] = {}
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("."):
            raise ValueError(f"silo id {name!r} cannot name a key file")
        key = ec.generate_private_key(ec.SECP384R1())
        files = NodeKeys(private_key=out / name, public_key=out / f"{name}.pub")
        files.private_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
        files.private_key.chmod(0o600)
        files.public_key.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        )
        found[name] = files
    return found


# ------------------------------------------------------------------- processes
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class ManagedProcess:
    """A process started by :class:`LocalFederation`, with its log file."""

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


@dataclass(frozen=True)
class SiloNode:
    """One SuperNode of the federation: which silo it is and how slow it pretends to be."""

    silo_id: str
    partition_id: int
    slowdown: float
    port: int
    """Port of the SuperNode's own Runtime API (its ClientApps connect to it)."""


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


def exit_code_for(status: str | None) -> int:
    """Exit code for a run's final status: 0 for ``finished:completed``, else 1.

    Parameters
    ----------
    status : str | None
        Flower's run status (``finished:completed``, ``finished:failed``,
        ``finished:stopped``, ``running``, ...); ``None`` when it could not be read (the
        SuperLink is gone, the run never started).
    """
    return 0 if status == "finished:completed" else 1


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


class LocalFederation:
    """SuperLink plus one SuperNode per silo on 127.0.0.1, torn down on exit.

    Use it as a context manager; the federation is up (every SuperNode registered with
    the SuperLink) when the ``with`` block starts, and every process it started is
    stopped when the block ends, whatever the reason.

    Parameters
    ----------
    workdir : str | Path
        Folder for certificates, logs, the Flower homes and the Flower configuration.
    num_silos : int (default: 3)
        Number of SuperNodes; silo i gets ``partition-id=i`` and
        ``num-partitions=num_silos``.
    slowdowns : sequence of float | None (default: None)
        Emulated slowdown factor of each silo (k >= 1: the silo computes for t, waits
        (k - 1) t and reports k t). ``None``: 1 for every silo.
    silo_ids : sequence of str | None (default: None)
        Stable ``silo-id`` of each silo (:data:`~fl_lbbsp.core.identity.SILO_ID_PATTERN`).
        ``None``: ``silo-0``, ``silo-1``, ...
    insecure : bool (default: False)
        Run without TLS. By default a CA and a server certificate are generated in
        ``<workdir>/tls`` and every connection to the SuperLink is TLS.
    node_auth : bool | None (default: None)
        Flower's SuperNode authentication: one key pair per silo in ``<workdir>/node-keys``,
        each public key registered with the SuperLink (``flwr supernode register``)
        before its SuperNode starts, the SuperLink started with
        ``--enable-supernode-auth``; a node with any other key (or none) cannot join.
        ``None``: on with TLS, off with ``insecure`` (Flower requires TLS for it).
    serialize_compute : bool (default: True)
        Give every SuperNode ``compute-lock=<workdir>/compute.lock`` in its node config:
        the quickstart's silos then take turns computing (like the simulation's
        ``--parallel 1``), so that silos sharing this machine's cores do not slow each
        other down, noise the emulation would multiply by each silo's slowdown.
    node_config : Mapping[str, str | int | float] | None (default: None)
        Extra ``--node-config`` entries given to every SuperNode.
    silo_registry : str | Path | None (default: None)
        Signed replies: a key folder of ``fl-lbbsp keys silos`` (``registry.json`` and a
        ``silo-<id>.key`` for every silo id, checked here), or ``"auto"``
        (:data:`AUTO_SILO_KEYS`) to generate one in ``<workdir>/silo-keys`` at start.
        Each SuperNode gets ``signing-key=<folder>/silo-<id>.key`` in its node config;
        :meth:`app_run_config` gives the app ``silo-registry=<folder>/registry.json``
        (:func:`run_app` passes it). ``None``: replies are unsigned.
    connection : str (default: "lbbsp-local")
        Name of the SuperLink connection in the written Flower configuration.
    env : Mapping[str, str] | None (default: None)
        Extra environment variables for every process.
    startup_timeout : float (default: 90.0)
        Seconds to wait for the SuperLink to listen and every SuperNode to register.
    warm_workers : bool (default: True)
        Start a warm silo worker (:mod:`fl_lbbsp.clients.warm`) beside every SuperNode,
        in ``<workdir>/warm/<silo-id>`` (a short folder under the system's temporary
        folder when that path is too long for a Unix socket), given to the SuperNode as
        node config ``warm-worker``. ``False``: every ClientApp process trains itself.
    task_poll_interval : float | None (default: 0.2)
        Seconds between a SuperExec's requests for work (Flower's
        ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 0.01-60; unset: Flower's 1 s). An
        explicit ``env`` entry wins. ``None``: Flower's default.
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
        serialize_compute: bool = True,
        node_config: Mapping[str, str | int | float] | None = None,
        silo_registry: str | Path | None = None,
        connection: str = CONNECTION,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 90.0,
        warm_workers: bool = True,
        task_poll_interval: float | None = 0.2,
    ) -> None:
        if num_silos <= 0:
            raise ValueError(f"num_silos must be positive, got {num_silos!r}")
        slowdowns = tuple(slowdowns) if slowdowns is not None else (1.0,) * num_silos
        if len(slowdowns) != num_silos:
            raise ValueError(f"{len(slowdowns)} slowdowns given for {num_silos} silos")
        if any(not (1.0 <= k < float("inf")) for k in slowdowns):
            raise ValueError(f"slowdowns must be finite and >= 1, got {list(slowdowns)}")
        ids = list(silo_ids) if silo_ids is not None else [f"silo-{i}" for i in range(num_silos)]
        for silo in ids:
            check_silo_id(silo)  # IdentityError (a ValueError): ids go into paths and logs
        if len(ids) != num_silos or len(set(ids)) != num_silos:
            raise ValueError(f"need {num_silos} distinct silo ids, got {ids}")
        self.workdir = Path(workdir).resolve()
        self.num_silos = num_silos
        self._generate_silo_keys = str(silo_registry) == AUTO_SILO_KEYS
        self.silo_keys: Path | None = None
        """Folder of the silos' signing keys and ``registry.json`` (None: unsigned)."""
        if self._generate_silo_keys:
            self.silo_keys = self.workdir / "silo-keys"
        elif silo_registry is not None:
            self.silo_keys = Path(silo_registry).resolve()
            check_silo_keys(self.silo_keys, ids)  # IdentityError (a ValueError) if unusable
        self.insecure = insecure
        if node_auth and insecure:
            raise ValueError("SuperNode authentication needs TLS: drop insecure or node_auth")
        self.node_auth = (not insecure) if node_auth is None else node_auth
        self.node_keys: dict[str, NodeKeys] = {}
        self.connection = connection
        self.startup_timeout = startup_timeout
        self._extra_node_config = dict(node_config or {})
        if serialize_compute:
            lock = str(self.workdir / "compute.lock")
            self._extra_node_config = {"compute-lock": lock, **self._extra_node_config}
        self._extra_env = dict(env or {})
        if task_poll_interval is not None:
            if not 0.01 <= task_poll_interval <= 60:
                raise ValueError(
                    f"task_poll_interval must be in [0.01, 60], got {task_poll_interval}"
                )
            self._extra_env.setdefault(_TASK_POLL_ENV, f"{task_poll_interval:g}")
        self.warm_workers = warm_workers
        self.workers: list[ManagedProcess] = []
        """The silos' warm workers (empty without ``warm_workers``), in silo order."""
        self._warm_root: Path | None = None
        self._worker_restart_at: dict[int, float] = {}
        self.host = "127.0.0.1"
        self.port = 0
        self.tls: TlsFiles | None = None
        self.silos = [
            SiloNode(silo_id=s, partition_id=i, slowdown=float(k), port=0)
            for i, (s, k) in enumerate(zip(ids, slowdowns, strict=True))
        ]
        self.superlink: ManagedProcess | None = None
        self.supernodes: list[ManagedProcess] = []
        self.node_ids: dict[str, int] = {}
        self._started: list[ManagedProcess] = []
        self._seen: dict[int, float] = {}  # pid -> create time of every process seen
        self._restart_at: dict[int, float] = {}  # silo index -> when to start it again

    # ---------------------------------------------------------------- public
    @property
    def address(self) -> str:
        """``host:port`` of the SuperLink (Fleet, Control and Runtime APIs)."""
        return f"{self.host}:{self.port}"

    @property
    def flwr_home(self) -> Path:
        """FLWR_HOME holding the Flower configuration with the SuperLink connection."""
        return self.workdir / "flwr-home"

    @property
    def bin_dir(self) -> Path:
        """Folder of the Flower programs (the running interpreter's)."""
        return Path(sys.executable).parent

    def environment(self) -> dict[str, str]:
        """Environment for ``flwr`` commands against this federation."""
        env = self._base_env()
        env["FLWR_HOME"] = str(self.flwr_home)
        return env

    @property
    def registry_file(self) -> Path | None:
        """The silo registry the app's server checks signatures with (None: unsigned)."""
        return None if self.silo_keys is None else self.silo_keys / REGISTRY_FILE

    def app_run_config(self) -> dict[str, str]:
        """Run-config entries the federation gives an app: ``silo-registry`` with signed
        replies, else none (Flower refuses keys an app does not declare)."""
        registry = self.registry_file
        return {} if registry is None else {"silo-registry": str(registry)}

    def run_command(self, app: str | Path, *extra: str) -> list[str]:
        """``flwr run APP CONNECTION *extra`` against this federation."""
        return [str(self.bin_dir / "flwr"), "run", str(app), self.connection, *extra]

    def pids(self) -> list[int]:
        """Pids of the processes started directly (SuperLink first)."""
        return [p.pid for p in self._started]

    def process_tree(self) -> list[int]:
        """Pids of the processes started and of all their current descendants."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                found += [pid, *(c.pid for c in proc.children(recursive=True))]
        return found

    def start(self) -> LocalFederation:
        """Start the SuperLink and the SuperNodes; wait until every node registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if not self.insecure:
            self.tls = generate_tls(self.workdir / "tls", hosts=(self.host, "localhost"))
        if self.node_auth:
            names = [s.silo_id for s in self.silos]
            self.node_keys = generate_node_keys(self.workdir / "node-keys", names)
        if self._generate_silo_keys and self.silo_keys is not None:
            ids = [s.silo_id for s in self.silos]
            write_silo_keys(self.silo_keys, ids, overwrite=True)
        self.port = free_port(self.host)
        self._write_flower_config()
        try:
            self.superlink = self._spawn("superlink", self._superlink_args(), "superlink")
            self._wait_for_superlink()
            if self.node_auth:
                for silo in self.silos:
                    self._register(silo.silo_id)
            if self.warm_workers:
                for i, silo in enumerate(self.silos):
                    self.workers.append(
                        self._spawn(
                            f"{silo.silo_id}-worker", self._worker_args(silo.silo_id), f"worker-{i}"
                        )
                    )
            for i, silo in enumerate(self.silos):
                silo = SiloNode(
                    silo_id=silo.silo_id,
                    partition_id=silo.partition_id,
                    slowdown=silo.slowdown,
                    port=free_port(self.host),
                )
                self.silos[i] = silo
                self.supernodes.append(
                    self._spawn(silo.silo_id, self._supernode_args(silo), f"node-{i}")
                )
            self._wait_for_supernodes()
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def processes(self) -> list[ManagedProcess]:
        """The processes started directly, SuperLink first."""
        return list(self._started)

    def kill_silo(self, index: int, *, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (a crash by default) to SuperNode ``index`` and its descendants."""
        proc = self.supernodes[index]
        targets: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(proc.pid)
            targets = [root, *root.children(recursive=True)]
        for target in targets:
            with contextlib.suppress(psutil.Error):
                target.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)

    def restart_silo(self, index: int) -> ManagedProcess:
        """Start SuperNode ``index`` again with its command line, key and port; its log
        continues in the same file."""
        return self._restart(self.supernodes, index)

    def restart_worker(self, index: int) -> ManagedProcess:
        """Start silo ``index``'s warm worker again (same folder; a new token); its log
        continues in the same file."""
        return self._restart(self.workers, index)

    def _restart(self, processes: list[ManagedProcess], index: int) -> ManagedProcess:
        """Start ``processes[index]`` again with its command line and home; its log
        continues in the same file."""
        old = processes[index]
        if old.alive():
            raise RuntimeError(f"{old.name} (pid {old.pid}) is still running")
        if old._log is not None:
            old._log.close()
            old._log = None
        processes[index] = self._spawn(old.name, list(old.args), old.home, append=True)
        return processes[index]

    def warm_folder(self, silo_id: str) -> Path:
        """Folder of a silo's warm worker (its socket and token): node config
        ``warm-worker`` of its SuperNode."""
        if self._warm_root is None:
            root = self.workdir / "warm"
            longest = max(len(os.fsencode(root / s.silo_id / "worker.sock")) for s in self.silos)
            if longest > _SOCKET_PATH_MAX:
                root = Path(tempfile.mkdtemp(prefix="lbbsp-warm-"))
            self._warm_root = root
        return self._warm_root / silo_id

    def remember(self) -> None:
        """Note every process of the federation now running (its descendants included),
        so that :meth:`stop` finds them even after their parent died (a SuperLink killed
        outright leaves its SuperExec and ServerApp behind, reparented)."""
        for pid in self.process_tree():
            with contextlib.suppress(psutil.Error):
                self._seen.setdefault(pid, psutil.Process(pid).create_time())

    def leftovers(self) -> list[int]:
        """Pids of processes of this federation still running that are not the SuperLink,
        a SuperNode or their descendants: those seen by :meth:`remember` and those whose
        environment names a Flower home of this federation (orphans of a crash)."""
        current = set(self.process_tree())
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
        self.remember()
        if self.superlink is not None and not self.superlink.alive():
            code = self.superlink.popen.returncode
            return f"superlink exited with code {code}; see {self.superlink.log_path}"
        self._revive(self.supernodes, self._restart_at, self.restart_silo, "left out",
                     policy, now, out)  # fmt: skip
        self._revive(self.workers, self._worker_restart_at, self.restart_worker,
                     "its silo trains in its ClientApp processes", policy, now, out)  # fmt: skip
        return None

    @staticmethod
    def _revive(
        processes: list[ManagedProcess],
        restart_at: dict[int, float],
        restart: Callable[[int], ManagedProcess],
        left_out: str,
        policy: RestartPolicy,
        now: float,
        out: IO[str],
    ) -> None:
        """Report each dead process of ``processes`` once, with what happens next
        (``left_out`` when ``policy`` gives no delay), and ``restart`` it once its delay
        (kept in ``restart_at``, by index) has passed."""
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

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop every process started, SuperNodes first, then any process of the
        federation left behind (:meth:`leftovers`), and close the log files."""
        self.remember()
        nodes_first = [*reversed(self._started)]
        stop_processes([p.pid for p in nodes_first if p.alive()], grace=grace)
        left = self.leftovers()
        if left:
            stop_processes(left, grace=grace)
        for proc in nodes_first:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace)
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.popen.wait()
            if proc._log is not None:
                proc._log.close()
                proc._log = None
        root = self._warm_root
        if root is not None and not root.is_relative_to(self.workdir):
            shutil.rmtree(root, ignore_errors=True)  # a short temporary folder of ours

    def describe(self) -> str:
        """What runs where, and the command to run an app against it."""
        lines = [
            f"SuperLink  {self.address}  "
            + ("INSECURE (no TLS)" if self.tls is None else f"TLS, CA {self.tls.ca_cert}")
            + (
                f", SuperNode authentication (keys in {self.workdir / 'node-keys'})"
                if self.node_auth
                else ", SuperNode authentication OFF: any node can join"
            )
            + (f"  pid {self.superlink.pid}" if self.superlink else ""),
        ]
        for silo, proc in zip(self.silos, self.supernodes, strict=False):
            lines.append(
                f"SuperNode  silo-id={silo.silo_id} partition-id={silo.partition_id}/"
                f"{self.num_silos} slowdown={silo.slowdown:g} (emulated)  pid {proc.pid}"
            )
        for silo, proc in zip(self.silos, self.workers, strict=False):
            lines.append(
                f"warm worker  silo-id={silo.silo_id}  {self.warm_folder(silo.silo_id)}  "
                f"pid {proc.pid}"
            )
        if self.silo_keys is not None:
            lines.append(
                f"signed replies: each SuperNode's signing-key in {self.silo_keys}, "
                f"the server's silo-registry {self.registry_file}"
            )
        else:
            lines.append("unsigned replies: silo identities are unverified")
        command = (
            f"  FLWR_HOME={self.flwr_home} {self.bin_dir / 'flwr'} run examples/quickstart "
            f"{self.connection} --stream"
        )
        overrides = " ".join(f"{k}={_toml(v)}" for k, v in self.app_run_config().items())
        if overrides:
            command += f" --run-config {shlex.quote(overrides)}"
        lines += [
            f"logs: {self.workdir / 'logs'}",
            "",
            "Run the quickstart app against it (from the repository root):",
            command,
        ]
        return "\n".join(lines)

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- helpers
    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        # Child processes import the same fl_lbbsp as this one (a source checkout or
        # an installed copy alike).
        # (the folder holding the fl_lbbsp package: this file is fl_lbbsp/runs/deploy.py;
        # fl_lbbsp/ itself on the path would shadow packages such as `datasets`)
        package_root = str(Path(__file__).resolve().parents[2])
        paths = [package_root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_TELEMETRY_ENABLED"] = "0"
        env.update(self._extra_env)
        return env

    def _register(self, silo_id: str) -> None:
        """Register a silo's public key with the SuperLink (``flwr supernode register``)."""
        keys = self.node_keys[silo_id]
        args = [str(self.bin_dir / "flwr"), "supernode", "register", str(keys.public_key)]
        args += [self.connection, "--name", silo_id, "--format", "json"]
        res = subprocess.run(
            args,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=self.startup_timeout,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"registering {silo_id}'s public key failed (exit {res.returncode}): "
                f"{_strip_ansi(res.stdout + res.stderr).strip()[-2000:]}"
            )

    def _spawn(
        self, name: str, args: list[str], home: str, *, append: bool = False
    ) -> ManagedProcess:
        env = self._base_env()
        env["FLWR_HOME"] = str(self.workdir / "homes" / home)
        log_path = self.workdir / "logs" / f"{name}.log"
        log = log_path.open("ab" if append else "wb")
        if append:
            log.write(b"\n----- restarted by fl_lbbsp -----\n")
            log.flush()
        popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        proc = ManagedProcess(
            name=name, popen=popen, log_path=log_path, _log=log, args=tuple(args), home=home
        )
        self._started.append(proc)
        return proc

    def _superlink_args(self) -> list[str]:
        args = [
            str(self.bin_dir / "flower-superlink"),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--isolation",
            "subprocess",
            "--disable-runtime-dependency-installation",
        ]
        if self.tls is None:
            return [*args, "--insecure"]
        if self.node_auth:
            args.append("--enable-supernode-auth")
        return [
            *args,
            "--ssl-ca-certfile",
            str(self.tls.ca_cert),
            "--ssl-certfile",
            str(self.tls.server_cert),
            "--ssl-keyfile",
            str(self.tls.server_key),
        ]

    def _supernode_args(self, silo: SiloNode) -> list[str]:
        config: dict[str, str | int | float] = {
            "silo-id": silo.silo_id,
            "partition-id": silo.partition_id,
            "num-partitions": self.num_silos,
            "slowdown": silo.slowdown,
            **self._extra_node_config,
        }
        if self.silo_keys is not None:
            config["signing-key"] = str(self.silo_keys / key_file_name(silo.silo_id))
        if self.warm_workers:
            config["warm-worker"] = str(self.warm_folder(silo.silo_id))
        args = [
            str(self.bin_dir / "flower-supernode"),
            "--superlink",
            self.address,
            "--node-config",
            " ".join(f"{k}={_toml(v)}" for k, v in config.items()),
            "--host",
            self.host,
            "--port",
            str(silo.port),
            "--isolation",
            "subprocess",
        ]
        if self.tls is None:
            return [*args, "--insecure"]
        if self.node_auth:
            args += ["--auth-supernode-private-key", str(self.node_keys[silo.silo_id].private_key)]
        return [*args, "--root-certificates", str(self.tls.ca_cert)]

    def _worker_args(self, silo_id: str) -> list[str]:
        folder = self.warm_folder(silo_id)
        return [sys.executable, "-m", "fl_lbbsp.clients.warm", "--folder", str(folder)]

    def _wait_for_workers(self) -> None:
        """Wait until every warm worker answers on its socket (it imports torch first)."""
        deadline = time.monotonic() + self.startup_timeout
        pending = {
            str(self.warm_folder(s.silo_id) / "worker.sock"): proc
            for s, proc in zip(self.silos, self.workers, strict=False)
        }
        while pending and time.monotonic() < deadline:
            for path, proc in list(pending.items()):
                self._check_alive(proc)
                with (
                    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe,
                    contextlib.suppress(OSError),
                ):
                    probe.connect(path)
                    del pending[path]
            time.sleep(0.2)
        if pending:
            raise TimeoutError(f"warm workers {sorted(pending)} did not start in time")

    def _write_flower_config(self) -> None:
        lines = [
            "[superlink]",
            f'default = "{self.connection}"',
            "",
            f"[superlink.{self.connection}]",
            f'address = "{self.address}"',
        ]
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls.ca_cert}"')
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _check_alive(self, proc: ManagedProcess) -> None:
        if not proc.alive():
            tail = "\n".join(proc.log_text().splitlines()[-20:])
            raise RuntimeError(
                f"{proc.name} exited with code {proc.popen.returncode}; its log ends:\n{tail}"
            )

    def _wait_for_superlink(self) -> None:
        assert self.superlink is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            self._check_alive(self.superlink)
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=0.5),
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"SuperLink not listening on {self.address} after startup timeout")

    def _wait_for_supernodes(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = dict(zip((s.silo_id for s in self.silos), self.supernodes, strict=True))
        while pending and time.monotonic() < deadline:
            for silo_id, proc in list(pending.items()):
                self._check_alive(proc)
                match = _NODE_ID.search(_strip_ansi(proc.log_text()))
                if match:
                    self.node_ids[silo_id] = int(match.group(1))
                    del pending[silo_id]
            time.sleep(0.2)
        if pending:
            raise TimeoutError(f"SuperNodes {sorted(pending)} did not register in time")


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


def _toml(value: str | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def serve(
    federation: LocalFederation,
    *,
    check_every: float = 1.0,
    policy: RestartPolicy | None = None,
    app: str | Path | None = None,
    run_config: str | Path | None = None,
    run_timeout: float = 24 * 3600.0,
) -> int:
    """Start ``federation``, print how to use it, keep it up until Ctrl-C or SIGTERM (or,
    with ``app``, until that app's run ended), supervising it all along.

    A SuperNode that dies is logged and started again (``policy``); the federation stops
    only on Ctrl-C / SIGTERM, at the end of ``app``'s run, or when the SuperLink dies.
    Every process is stopped on the way out, whatever ends it, the ServerApp and any
    other process a dead SuperLink left behind included.

    Parameters
    ----------
    federation : LocalFederation
        The federation to start (not started yet).
    check_every : float (default: 1.0)
        Seconds between two supervision steps.
    policy : RestartPolicy | None (default: None)
        Whether and when dead SuperNodes are restarted; ``None``: ``RestartPolicy()``.
    app : str | Path | None (default: None)
        A Flower app to run on the federation (``flwr run APP --stream``) once it is up;
        its final status decides the exit code.
    run_config : str | Path | None (default: None)
        TOML file of run-config overrides for ``app``, merged with the federation's own
        (:meth:`LocalFederation.app_run_config`) into one ``flwr run --run-config`` file.
    run_timeout : float (default: 86400.0)
        Seconds before ``app``'s run is stopped.

    Returns
    -------
    int
        Without ``app``: 0 after Ctrl-C / SIGTERM, 1 if the SuperLink exited on its own.
        With ``app``: 0 if the run ended ``finished:completed``, else 1.
    """
    policy = RestartPolicy() if policy is None else policy

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT explicitly too: a shell starting this in the background ignores it otherwise.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with federation:
            print(federation.describe(), flush=True)
            if app is not None:
                overrides = None if run_config is None else read_run_config(run_config)
                print(f"\nrunning {app}; Ctrl-C stops it and the federation.", flush=True)
                outcome = run_app(
                    federation,
                    app,
                    run_config=overrides,
                    timeout=run_timeout,
                    policy=policy,
                    check_every=check_every,
                    echo=sys.stdout,
                )
                print(outcome.summary(), file=sys.stderr, flush=True)
                return outcome.exit_code
            print("\nCtrl-C stops the SuperLink and every SuperNode.", flush=True)
            while True:
                reason = federation.supervise(policy)
                if reason is not None:
                    print(f"{reason}. Stopping everything.", file=sys.stderr, flush=True)
                    return 1
                time.sleep(check_every)
    except KeyboardInterrupt:
        print("\nstopping the federation ...", file=sys.stderr, flush=True)
        return 0 if app is None else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class RunOutcome:
    """How a ``flwr run --stream`` against a :class:`LocalFederation` ended."""

    run_id: int | None
    """Run id printed by ``flwr run`` (None if it did not start)."""
    returncode: int | None
    """Exit code of ``flwr run`` (None when it was stopped: timeout, SuperLink died)."""
    status: str | None
    """Run status from ``flwr ls`` (``finished:completed`` on success; None when it could
    not be read)."""
    output: str
    """What ``flwr run`` printed: the run's log stream."""
    seconds: float
    """Wall-clock seconds from ``flwr run`` to the end of the stream."""
    stopped: str | None = None
    """Why the run was cut short by this side (timeout, the SuperLink died), else None."""

    @property
    def completed(self) -> bool:
        """Whether the run ended ``finished:completed``."""
        return self.status == "finished:completed"

    @property
    def exit_code(self) -> int:
        """0 if the run completed, 1 otherwise (:func:`exit_code_for`)."""
        return exit_code_for(self.status)

    def summary(self) -> str:
        """One line: the run, its final status and, if cut short, why."""
        run = "run" if self.run_id is None else f"run {self.run_id}"
        status = self.status or "unknown (not readable from the SuperLink)"
        why = f"; {self.stopped}" if self.stopped else ""
        return f"{run} ended {status} after {self.seconds:.0f} s{why}"


def app_declares(app: str | Path, key: str) -> bool:
    """Whether the Flower app in folder ``app`` declares run-config ``key`` in its
    ``pyproject.toml`` (``[tool.flwr.app.config]``); ``False`` if it cannot be read."""
    try:
        with (Path(app) / "pyproject.toml").open("rb") as handle:
            project = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return False
    config = project.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return isinstance(config, dict) and key in config


def read_run_config(path: str | Path) -> dict[str, str | int | float | bool]:
    """Run-config overrides from a TOML file, nested tables flattened to dotted keys as
    Flower does (so that they can be merged with the federation's own entries).

    Raises
    ------
    ValueError
        The file is not TOML, or holds a value that is not a string, number or bool.
    """
    found: dict[str, str | int | float | bool] = {}

    def _flatten(table: Mapping[str, object], prefix: str) -> None:
        for key, value in table.items():
            if isinstance(value, Mapping):
                _flatten(value, f"{prefix}{key}.")
            elif isinstance(value, str | int | float | bool):
                found[f"{prefix}{key}"] = value
            else:
                raise ValueError(f"{path}: run-config {prefix}{key} is a {type(value).__name__}")

    with Path(path).open("rb") as handle:
        _flatten(tomllib.load(handle), "")
    return found


def write_run_config(path: str | Path, values: Mapping[str, str | int | float | bool]) -> Path:
    """Write run-config overrides as a TOML file for ``flwr run --run-config FILE``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in values.items()), "utf-8")
    return target


def run_app(
    federation: LocalFederation,
    app: str | Path,
    *,
    run_config: Mapping[str, str | int | float | bool] | None = None,
    timeout: float = 600.0,
    name: str = "run",
    extra_args: Sequence[str] = (),
    policy: RestartPolicy | None = None,
    check_every: float = 1.0,
    echo: IO[str] | None = None,
) -> RunOutcome:
    """Run a Flower app on ``federation`` with ``flwr run --stream`` and wait for its end.

    Parameters
    ----------
    federation : LocalFederation
        A started federation.
    app : str | Path
        Folder of the Flower app (with its ``pyproject.toml``).
    run_config : Mapping | None (default: None)
        Run-config overrides (keys of the app's ``[tool.flwr.app.config]``), on top of
        the federation's own (:meth:`LocalFederation.app_run_config`: its
        ``silo-registry`` with signed replies).
    timeout : float (default: 600.0)
        Seconds before ``flwr run`` is stopped (by pid).
    name : str (default: "run")
        Stem of the run-config file and of the stream's log in the federation's folder.
    extra_args : sequence of str (default: ())
        More ``flwr run`` arguments (not ``--run-config``: give ``run_config``).
    policy : RestartPolicy | None (default: None)
        Supervise the federation while the run lasts: restart dead SuperNodes as this
        says, and stop the run when the SuperLink dies. ``None``: no supervision.
    check_every : float (default: 1.0)
        Seconds between two checks of the run (and supervision steps).
    echo : IO[str] | None (default: None)
        Where the run's stream is copied as it comes (``None``: nowhere).

    Returns
    -------
    RunOutcome
        Its ``status`` is the run's final status (``finished:completed``,
        ``finished:failed``, ...); ``exit_code`` is 0 only for a completed run.
    """
    args = [*federation.run_command(app, "--stream"), *extra_args]
    overrides = {**federation.app_run_config(), **(run_config or {})}
    if overrides:
        path = write_run_config(federation.workdir / f"{name}.toml", overrides)
        args += ["--run-config", str(path)]
    stream = federation.workdir / "logs" / f"{name}-flwr-run.log"
    stream.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    stopped: str | None = None
    with stream.open("wb") as sink, stream.open("rb") as source:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=federation.environment(),
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if echo is not None:
                    echo.write(_strip_ansi(source.read().decode("utf-8", errors="replace")))
                    echo.flush()
                if time.monotonic() - start > timeout:
                    stopped = f"stopped after the {timeout:g} s timeout"
                    break
                if policy is not None:
                    stopped = federation.supervise(policy)
                    if stopped is not None:
                        break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=check_every)
        finally:
            if proc.poll() is None:
                stop_processes([proc.pid])
                proc.wait()
        if echo is not None:
            echo.write(_strip_ansi(source.read().decode("utf-8", errors="replace")))
            echo.flush()
    returncode = None if stopped is not None else proc.returncode
    superlink = federation.superlink
    if stopped is None and superlink is not None and not superlink.alive():
        # flwr run noticed first (its stream broke): report the cause all the same
        code = superlink.popen.returncode
        stopped = f"superlink exited with code {code}; see {superlink.log_path}"
    seconds = time.monotonic() - start
    output = _strip_ansi(stream.read_text(encoding="utf-8", errors="replace"))
    match = re.search(r"Successfully started run (\d+)", output)
    run_id = int(match.group(1)) if match else None
    superlink_up = superlink is None or superlink.alive()
    status = None if run_id is None or not superlink_up else run_status(federation, run_id)
    return RunOutcome(run_id, returncode, status, output, seconds, stopped)


def run_status(federation: LocalFederation, run_id: int) -> str | None:
    """Status of a run (``finished:completed``, ``running``, ...) from ``flwr ls``."""
    args = [
        str(federation.bin_dir / "flwr"),
        "ls",
        federation.connection,
        "--run-id",
        str(run_id),
        "--format",
        "json",
    ]
    try:
        res = subprocess.run(
            args, env=federation.environment(), capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return None
    with contextlib.suppress(ValueError, KeyError, IndexError):
        return str(json.loads(res.stdout)["runs"][0]["status"])
    return None
