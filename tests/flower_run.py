"""Run a Flower app under ``flwr run --stream`` on the Simulation Engine, in a private
Flower home, and stop the SuperLink it starts (shared by the tests and benchmarks that run
a whole app as a user would)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

__all__ = ["flower_ports_taken", "run_app"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_ports_taken() -> bool:
    """Whether another SuperLink holds Flower's fixed ServerAppIo / Fleet ports."""
    for port in (9091, 9092):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
    return False


def run_app(
    app: Path,
    folder: Path,
    *,
    overrides: str = "",
    declare: str = "",
    pythonpath: tuple[Path, ...] = (),
    supernodes: int | None = None,
    timeout: float = 800,
) -> subprocess.CompletedProcess[str]:
    """Copy ``app`` into ``folder`` and run it with ``flwr run --stream``.

    Parameters
    ----------
    app : Path
        The app's folder (its ``pyproject.toml``).
    folder : Path
        Where the copy, the Flower home and the run's working folder go.
    overrides : str (default: "")
        ``--run-config`` overrides.
    declare : str (default: "")
        Lines added to the copy's ``[tool.flwr.app.config]`` (Flower refuses overrides of
        keys the app does not declare: the test's own instruments go there).
    pythonpath : tuple of Path (default: ())
        Folders put before ``PYTHONPATH``.
    supernodes : int | None (default: None)
        Simulated SuperNodes (``--federation-config num-supernodes=N``, for an app whose
        pyproject.toml names no federation); ``None``: the app's own federation.
    timeout : float (default: 800)
        Seconds (a 2-core machine starts Ray and the ClientApps).
    """
    copy = folder / app.name
    shutil.copytree(app, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if declare:
        project = copy / "pyproject.toml"
        header = "[tool.flwr.app.config]\n"
        project.write_text(project.read_text().replace(header, header + declare))
    flwr = Path(sys.executable).parent / "flwr"
    home = folder / "flwr-home"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(flwr.parent), os.environ.get("PATH", "")]),
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), os.environ.get("PYTHONPATH", "")]),
    }
    command = [str(flwr), "run", str(copy), "--stream"]
    if overrides:
        command += ["--run-config", overrides]
    if supernodes is not None:
        command += ["--federation-config", f"num-supernodes={supernodes}"]
    try:
        return subprocess.run(
            command, env=env, cwd=folder, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
    finally:  # stop the SuperLink flwr started in the background for this home, by pid
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(str(home) in part for part in proc.info["cmdline"] or ()):
                # a process may end between being listed and being signalled
                with contextlib.suppress(psutil.NoSuchProcess):
                    for child in proc.children(recursive=True):
                        with contextlib.suppress(psutil.NoSuchProcess):
                            child.send_signal(signal.SIGTERM)
                    proc.send_signal(signal.SIGTERM)
