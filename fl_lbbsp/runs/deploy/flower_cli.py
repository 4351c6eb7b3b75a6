"""Flower's own programs as a local federation uses them: the command lines of
``flower-superlink`` and ``flower-supernode``, the Flower configuration file with the
SuperLink connection, ``flwr supernode register``, the SuperNode id in a SuperNode's log,
and run-config TOML files (``flwr run --run-config``)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .processes import ManagedProcess, wait_until_ready
from .tls import TlsFiles

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Flower depends on tomli
    import tomli as tomllib

__all__ = [
    "app_declares",
    "flower_config",
    "read_run_config",
    "registered_node_ids",
    "register_node_key",
    "strip_ansi",
    "superlink_args",
    "supernode_args",
    "toml_value",
    "write_run_config",
]

_NODE_ID = re.compile(r"SuperNode ID: (\d+)")


def superlink_args(
    bin_dir: Path, *, host: str, port: int, tls: TlsFiles | None, node_auth: bool
) -> list[str]:
    """``flower-superlink`` on ``host:port`` with subprocess isolation: TLS with ``tls``
    (and SuperNode authentication with ``node_auth``), ``--insecure`` without."""
    args = [
        str(bin_dir / "flower-superlink"),
        *_listening(host, port),
        "--disable-runtime-dependency-installation",
    ]
    if tls is None:
        return [*args, "--insecure"]
    if node_auth:
        args.append("--enable-supernode-auth")
    return [
        *args,
        "--ssl-ca-certfile",
        str(tls.ca_cert),
        "--ssl-certfile",
        str(tls.server_cert),
        "--ssl-keyfile",
        str(tls.server_key),
    ]


def _listening(host: str, port: int) -> list[str]:
    """The flags of a Flower process serving on ``host:port``, its apps in subprocesses."""
    return ["--host", host, "--port", str(port), "--isolation", "subprocess"]


def supernode_args(
    bin_dir: Path,
    *,
    superlink: str,
    node_config: Mapping[str, str | int | float],
    host: str,
    port: int,
    tls: TlsFiles | None,
    auth_key: Path | None,
) -> list[str]:
    """``flower-supernode`` connecting to ``superlink`` with ``node_config``, its own
    Runtime API on ``host:port``, subprocess isolation: trusting ``tls``'s CA (and
    authenticating with the private key ``auth_key``), ``--insecure`` without TLS."""
    args = [
        str(bin_dir / "flower-supernode"),
        "--superlink",
        superlink,
        "--node-config",
        " ".join(f"{k}={toml_value(v)}" for k, v in node_config.items()),
        *_listening(host, port),
    ]
    if tls is None:
        return [*args, "--insecure"]
    if auth_key is not None:
        args += ["--auth-supernode-private-key", str(auth_key)]
    return [*args, "--root-certificates", str(tls.ca_cert)]


def flower_config(connection: str, address: str, tls: TlsFiles | None) -> str:
    """A Flower configuration (``FLWR_HOME/config.toml``) whose default SuperLink
    connection ``connection`` is ``address``, trusting ``tls``'s CA (insecure without)."""
    lines = [
        "[superlink]",
        f'default = "{connection}"',
        "",
        f"[superlink.{connection}]",
        f'address = "{address}"',
    ]
    if tls is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{tls.ca_cert}"')
    return "\n".join(lines) + "\n"


def register_node_key(
    bin_dir: Path,
    public_key: Path,
    *,
    connection: str,
    name: str,
    env: Mapping[str, str],
    timeout: float,
) -> None:
    """Register a SuperNode's public key with the SuperLink of ``connection``
    (``flwr supernode register``).

    Raises
    ------
    RuntimeError
        ``flwr`` refused, with the end of what it printed.
    """
    args = [str(bin_dir / "flwr"), "supernode", "register", str(public_key)]
    args += [connection, "--name", name, "--format", "json"]
    res = subprocess.run(
        args, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"registering {name}'s public key failed (exit {res.returncode}): "
            f"{strip_ansi(res.stdout + res.stderr).strip()[-2000:]}"
        )


def registered_node_ids(
    supernodes: Mapping[str, ManagedProcess], *, timeout: float
) -> dict[str, int]:
    """Wait until every SuperNode of ``supernodes`` (by silo id) registered with the
    SuperLink, and return the node id each announced in its log.

    Raises
    ------
    RuntimeError
        A SuperNode exited first.
    TimeoutError
        Some did not register within ``timeout`` seconds.
    """
    found: dict[str, int] = {}

    def registered(silo_id: str, proc: ManagedProcess) -> bool:
        match = _NODE_ID.search(strip_ansi(proc.log_text()))
        if match is not None:
            found[silo_id] = int(match.group(1))
        return match is not None

    late = wait_until_ready(supernodes, registered, timeout=timeout)
    if late:
        raise TimeoutError(f"SuperNodes {late} did not register in time")
    return found


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
    target.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()), "utf-8")
    return target


def toml_value(value: str | int | float) -> str:
    """``value`` as a TOML value (Flower's ``--node-config`` and ``--run-config``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (Flower colours its logs)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
