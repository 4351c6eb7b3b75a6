"""Running a Flower app on a :class:`~.federation.LocalFederation`: ``flwr run --stream``
until the run ends, its final status as an exit code (:func:`run_app`,
:class:`RunOutcome`), and ``fl-lbbsp deploy-local`` (:func:`serve`: the federation up
and supervised until Ctrl-C or the end of its app's run, with :func:`describe` printed)."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .federation import LocalFederation
from .flower_cli import read_run_config, strip_ansi, toml_value, write_run_config
from .processes import RestartPolicy, stop_processes

__all__ = ["RunOutcome", "describe", "exit_code_for", "run_app", "run_status", "serve"]


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


def describe(federation: LocalFederation, *, app: str | Path | None = None) -> str:
    """What runs where in ``federation``, and the command to run the quickstart app
    against it (none when it runs ``app``)."""
    fed = federation
    tls = "INSECURE (no TLS)" if fed.tls is None else f"TLS, CA {fed.tls.ca_cert}"
    auth = (
        f"SuperNode authentication (keys in {fed.workdir / 'node-keys'})"
        if fed.node_auth
        else "SuperNode authentication OFF: any node can join"
    )
    pid = f"  pid {fed.superlink.pid}" if fed.superlink else ""
    lines = [f"SuperLink  {fed.address}  {tls}, {auth}{pid}"]
    for silo, proc in zip(fed.silos, fed.supernodes, strict=False):
        real = "" if silo.cpu_quota is None else f" cpu-quota={silo.cpu_quota:g} core"
        real += "" if silo.link_mbps is None else f" link={silo.link_mbps:g} Mbit/s"
        lines.append(
            f"SuperNode  silo-id={silo.silo_id} partition-id={silo.partition_id}/"
            f"{fed.num_silos} slowdown={silo.slowdown:g} (emulated){real}  pid {proc.pid}"
        )
    for silo, proc in zip(fed.silos, fed.workers, strict=False):
        folder = fed.warm_folder(silo.silo_id)
        lines.append(f"warm worker  silo-id={silo.silo_id}  {folder}  pid {proc.pid}")
    if fed.workers and app is not None:
        lines.append(
            "(the warm workers serve fl_lbbsp's bundled ClientApp only: --no-warm-worker "
            "spares their cores for an app of your own)"
        )
    if fed.cpu_groups is not None:
        lines.append(f"CPU groups: {fed.cpu_groups.parent} (removed at exit)")
    for silo_id, proc in fed.links.items():
        lines.append(f"link proxy  silo-id={silo_id}  {fed.superlink_for(silo_id)}  pid {proc.pid}")
    if fed.silo_keys is not None:
        lines.append(
            f"signed replies: each SuperNode's signing-key in {fed.silo_keys}, "
            f"the server's silo-registry {fed.registry_file}"
        )
    else:
        lines.append("unsigned replies: silo identities are unverified")
    lines.append(f"logs: {fed.workdir / 'logs'}")
    if app is None:
        command = " ".join(fed.run_command("examples/quickstart", "--stream"))
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in fed.app_run_config().items())
        if overrides:
            command += f" --run-config {shlex.quote(overrides)}"
        lines += [
            "",
            "Run the quickstart app against it (from the repository root):",
            f"  FLWR_HOME={fed.flwr_home} {command}",
        ]
    return "\n".join(lines)


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
            print(describe(federation, app=app), flush=True)
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
                    echo.write(strip_ansi(source.read().decode("utf-8", errors="replace")))
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
            echo.write(strip_ansi(source.read().decode("utf-8", errors="replace")))
            echo.flush()
    returncode = None if stopped is not None else proc.returncode
    superlink = federation.superlink
    if stopped is None and superlink is not None and not superlink.alive():
        # flwr run noticed first (its stream broke): report the cause all the same
        code = superlink.popen.returncode
        stopped = f"superlink exited with code {code}; see {superlink.log_path}"
    seconds = time.monotonic() - start
    output = strip_ansi(stream.read_text(encoding="utf-8", errors="replace"))
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
