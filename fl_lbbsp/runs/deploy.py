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
ClientApp processes), SIGTERM first, SIGKILL after a grace period.

Nothing here imports Flower: the pieces are Flower's own command-line programs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from ..clients.emulation import slowdowns_from_speeds

__all__ = [
    "LocalFederation",
    "ManagedProcess",
    "RunOutcome",
    "SiloNode",
    "TlsFiles",
    "free_port",
    "generate_tls",
    "run_app",
    "run_status",
    "serve",
    "slowdowns_from_speeds",
    "stop_processes",
    "write_run_config",
]

CONNECTION = "lbbsp-local"
"""Name of the SuperLink connection written to the federation's Flower configuration."""

_NODE_ID = re.compile(r"SuperNode ID: (\d+)")


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
        Stable ``silo-id`` of each silo. ``None``: ``silo-0``, ``silo-1``, ...
    insecure : bool (default: False)
        Run without TLS. By default a CA and a server certificate are generated in
        ``<workdir>/tls`` and every connection to the SuperLink is TLS.
    serialize_compute : bool (default: True)
        Give every SuperNode ``compute-lock=<workdir>/compute.lock`` in its node config:
        the quickstart's silos then take turns computing (like the simulation's
        ``--parallel 1``), so that silos sharing this machine's cores do not slow each
        other down, noise the emulation would multiply by each silo's slowdown.
    node_config : Mapping[str, str | int | float] | None (default: None)
        Extra ``--node-config`` entries given to every SuperNode.
    connection : str (default: "lbbsp-local")
        Name of the SuperLink connection in the written Flower configuration.
    env : Mapping[str, str] | None (default: None)
        Extra environment variables for every process.
    startup_timeout : float (default: 90.0)
        Seconds to wait for the SuperLink to listen and every SuperNode to register.
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        num_silos: int = 3,
        slowdowns: Sequence[float] | None = None,
        silo_ids: Sequence[str] | None = None,
        insecure: bool = False,
        serialize_compute: bool = True,
        node_config: Mapping[str, str | int | float] | None = None,
        connection: str = CONNECTION,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 90.0,
    ) -> None:
        if num_silos <= 0:
            raise ValueError(f"num_silos must be positive, got {num_silos!r}")
        slowdowns = tuple(slowdowns) if slowdowns is not None else (1.0,) * num_silos
        if len(slowdowns) != num_silos:
            raise ValueError(f"{len(slowdowns)} slowdowns given for {num_silos} silos")
        if any(not (1.0 <= k < float("inf")) for k in slowdowns):
            raise ValueError(f"slowdowns must be finite and >= 1, got {list(slowdowns)}")
        ids = list(silo_ids) if silo_ids is not None else [f"silo-{i}" for i in range(num_silos)]
        if len(ids) != num_silos or len(set(ids)) != num_silos:
            raise ValueError(f"need {num_silos} distinct silo ids, got {ids}")
        self.workdir = Path(workdir).resolve()
        self.num_silos = num_silos
        self.insecure = insecure
        self.connection = connection
        self.startup_timeout = startup_timeout
        self._extra_node_config = dict(node_config or {})
        if serialize_compute:
            lock = str(self.workdir / "compute.lock")
            self._extra_node_config = {"compute-lock": lock, **self._extra_node_config}
        self._extra_env = dict(env or {})
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
        self.port = free_port(self.host)
        self._write_flower_config()
        try:
            self.superlink = self._spawn("superlink", self._superlink_args(), "superlink")
            self._wait_for_superlink()
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

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop every process started, SuperNodes first, and close the log files."""
        nodes_first = [*reversed(self._started)]
        stop_processes([p.pid for p in nodes_first if p.alive()], grace=grace)
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

    def describe(self) -> str:
        """What runs where, and the command to run an app against it."""
        lines = [
            f"SuperLink  {self.address}  "
            + ("INSECURE (no TLS)" if self.tls is None else f"TLS, CA {self.tls.ca_cert}")
            + (f"  pid {self.superlink.pid}" if self.superlink else ""),
        ]
        for silo, proc in zip(self.silos, self.supernodes, strict=False):
            lines.append(
                f"SuperNode  silo-id={silo.silo_id} partition-id={silo.partition_id}/"
                f"{self.num_silos} slowdown={silo.slowdown:g} (emulated)  pid {proc.pid}"
            )
        lines += [
            f"logs: {self.workdir / 'logs'}",
            "",
            "Run the quickstart app against it (from the repository root):",
            f"  FLWR_HOME={self.flwr_home} {self.bin_dir / 'flwr'} run examples/quickstart "
            f"{self.connection} --stream",
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
        package_root = str(Path(__file__).resolve().parent.parent)
        paths = [package_root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_TELEMETRY_ENABLED"] = "0"
        env.update(self._extra_env)
        return env

    def _spawn(self, name: str, args: list[str], home: str) -> ManagedProcess:
        env = self._base_env()
        env["FLWR_HOME"] = str(self.workdir / "homes" / home)
        log_path = self.workdir / "logs" / f"{name}.log"
        log = log_path.open("wb")
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
        proc = ManagedProcess(name=name, popen=popen, log_path=log_path, _log=log)
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
        return [*args, "--root-certificates", str(self.tls.ca_cert)]

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


def serve(federation: LocalFederation, *, check_every: float = 1.0) -> int:
    """Start ``federation``, print how to use it, keep it up until Ctrl-C or SIGTERM.

    Every process is stopped on the way out, whatever ends it.

    Parameters
    ----------
    federation : LocalFederation
        The federation to start (not started yet).
    check_every : float (default: 1.0)
        Seconds between two checks that every process is still running.

    Returns
    -------
    int
        0 after Ctrl-C / SIGTERM, 1 if the SuperLink or a SuperNode exited on its own.
    """

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT explicitly too: a shell starting this in the background ignores it otherwise.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with federation:
            print(federation.describe(), flush=True)
            print("\nCtrl-C stops the SuperLink and every SuperNode.", flush=True)
            while True:
                for proc in federation.processes:
                    if not proc.alive():
                        print(
                            f"{proc.name} exited with code {proc.popen.returncode}; "
                            f"see {proc.log_path}. Stopping everything.",
                            file=sys.stderr,
                            flush=True,
                        )
                        return 1
                time.sleep(check_every)
    except KeyboardInterrupt:
        print("\nstopping the federation ...", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class RunOutcome:
    """How a ``flwr run --stream`` against a :class:`LocalFederation` ended."""

    run_id: int | None
    """Run id printed by ``flwr run`` (None if it did not start)."""
    returncode: int | None
    """Exit code of ``flwr run`` (None when it was stopped at the timeout)."""
    status: str | None
    """Run status from ``flwr ls`` (``finished:completed`` on success)."""
    output: str
    """What ``flwr run`` printed: the run's log stream."""
    seconds: float
    """Wall-clock seconds from ``flwr run`` to the end of the stream."""


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
) -> RunOutcome:
    """Run a Flower app on ``federation`` with ``flwr run --stream`` and wait for its end.

    Parameters
    ----------
    federation : LocalFederation
        A started federation.
    app : str | Path
        Folder of the Flower app (with its ``pyproject.toml``).
    run_config : Mapping | None (default: None)
        Run-config overrides (keys of the app's ``[tool.flwr.app.config]``).
    timeout : float (default: 600.0)
        Seconds before ``flwr run`` is stopped (by pid).
    name : str (default: "run")
        Stem of the run-config file written to the federation's folder.
    """
    args = federation.run_command(app, "--stream")
    if run_config:
        path = write_run_config(federation.workdir / f"{name}.toml", run_config)
        args += ["--run-config", str(path)]
    env = federation.environment()
    start = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        stop_processes([proc.pid])
        out, _ = proc.communicate()
        returncode = None
    finally:
        if proc.poll() is None:
            stop_processes([proc.pid])
    seconds = time.monotonic() - start
    output = _strip_ansi(out.decode("utf-8", errors="replace"))
    match = re.search(r"Successfully started run (\d+)", output)
    run_id = int(match.group(1)) if match else None
    status = None if run_id is None else run_status(federation, run_id)
    return RunOutcome(run_id, returncode, status, output, seconds)


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
