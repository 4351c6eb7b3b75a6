"""``fl-lbbsp``: simulate LB-BSP or FedAvg on heterogeneous silos and compare them.

Here the entry point (every refused input one line, exit code 2; Ctrl-C one line, exit
code 130), the key commands, the local deployment and the logging set-up; the run
commands are :mod:`fl_lbbsp.cli_runs`."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from .cli_flags import values_of
from .cli_parser import CKKS_FLAGS, build_parser
from .cli_runs import (
    RunFailedError,
    RunInterrupted,
    fail,
    run_cluster_command,
    run_command,
    validation_message,
)

__all__ = ["build_parser", "main"]


def _checkpoint_key(args: argparse.Namespace) -> int:
    from .strategies.checkpoint import CheckpointStore, load_checkpoint_key, write_checkpoint_key

    if args.sign is not None:  # re-sign trusted checkpoints under the key already there
        store = CheckpointStore(args.sign, key=load_checkpoint_key(args.out))
        for server_round in store.rounds():
            print(f"signed under {args.out}: {store.sign(store.path(server_round))}")
        return 0
    path = write_checkpoint_key(args.out, overwrite=args.force)
    print(f"checkpoint key (give to the server only, --checkpoint-key): {path}")
    return 0


def _silo_keys(args: argparse.Namespace) -> int:
    from .security.identity import check_silo_id
    from .security.silo_keys import write_silo_keys

    if (args.silos is None) == (args.ids is None):
        raise ValueError("give the silos with exactly one of --silos N and --ids A,B,...")
    if args.ids is not None:
        ids = [check_silo_id(s.strip(), what="--ids entry") for s in args.ids.split(",")]
    elif args.silos <= 0:
        raise ValueError(f"--silos must be positive, got {args.silos}")
    else:
        ids = [str(k) for k in range(args.silos)]
    files = write_silo_keys(args.out, ids, dataset_sizes=args.dataset_sizes, overwrite=args.force)
    print(f"signing keys (give silo-<id>.key to that silo only): {args.out}")
    print(f"silo registry (give to the server, --silo-registry): {files.registry}")
    return 0


def _generate_keys(args: argparse.Namespace) -> int:
    from .crypto import CKKSConfig, generate_keys, write_key_files

    keys = generate_keys(CKKSConfig(**values_of(args, CKKS_FLAGS)))
    files = write_key_files(keys, args.out, overwrite=args.force)
    print(f"secret context (give to every silo, keep from the server): {files.secret}")
    print(f"public context (give to the server): {files.public}")
    print(f"key fingerprint: {keys.fingerprint} ({files.fingerprint})")
    return 0


def _silo_registry(args: argparse.Namespace) -> str | None:
    """``--silo-registry`` as the federation takes it: signed replies by default with TLS
    (``auto``), unless ``none``; with ``--app``, the default only for an app that declares
    the ``silo-registry`` setting (one notice otherwise: its replies stay unsigned)."""
    from .runs.deploy import AUTO_SILO_KEYS, app_declares

    given = args.silo_registry
    if given is not None:
        return None if str(given).lower() == "none" else str(given)
    if args.insecure:
        return None
    if args.app is not None and not app_declares(args.app, "silo-registry"):
        print(
            f"fl-lbbsp: note: {args.app} declares no silo-registry setting, so its replies "
            "cannot be signed; silo identities are unverified",
            file=sys.stderr,
        )
        return None
    return AUTO_SILO_KEYS


def _deploy_federation(args: argparse.Namespace) -> Any:
    from .runs.config import writable_dir_problem
    from .runs.deploy import LocalFederation, slowdowns_from_speeds

    if args.silos <= 0:
        raise ValueError(f"--silos must be positive, got {args.silos}")
    lists = (("--speeds", args.speeds), ("--cpu-quota", args.cpu_quota))
    for flag, values in (*lists, ("--link-mbps", args.link_mbps)):
        if values is not None and len(values) != args.silos:
            raise ValueError(f"{flag} lists {len(values)} values but there are {args.silos} silos")
    problem = writable_dir_problem(args.workdir)
    if problem is not None:
        raise ValueError(f"--workdir: {problem}")
    return LocalFederation(
        args.workdir,
        num_silos=args.silos,
        slowdowns=None if args.speeds is None else slowdowns_from_speeds(args.speeds),
        insecure=args.insecure,
        node_auth=not (args.insecure or args.no_node_auth),
        serialize_compute=False if args.parallel_compute else None,
        silo_registry=_silo_registry(args),
        warm_workers=not args.no_warm_worker,
        cpu_quotas=args.cpu_quota,
        link_mbps=args.link_mbps,
    )


class _BelowWarning(logging.Filter):
    """Drop Flower's INFO chatter (Flower resets its logger's level when it starts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


class _SiloTracebacks(logging.Filter):
    """Drop the Simulation Engine's log of a ClientApp's exception (a whole traceback per
    reply): the strategy logs each rejected reply as one line naming the exception, and
    the traceback at DEBUG."""

    _SOURCES = ("vce_api.py", "raybackend.py", "ray_actor.py")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.pathname.endswith(self._SOURCES))


class _KnownNotices(logging.Filter):
    """Drop Flower's notices that every run of ours would print and none calls for action:
    ``run_simulation``'s deprecation (we run the ServerApp and ClientApp objects we
    build, which ``flwr run`` cannot) and ``fraction_evaluate`` 0 (our runs evaluate
    centrally, on purpose)."""

    _PREFIXES = (
        "fraction_evaluate is set to 0.0",
        "DEPRECATED FEATURE: The `run_simulation` function is deprecated",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().lstrip().startswith(self._PREFIXES)


def _setup_logging(quiet: bool, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("fl_lbbsp")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
    if quiet or not verbose:
        flwr = logging.getLogger("flwr")
        flwr.addFilter(_BelowWarning())
        flwr.addFilter(_SiloTracebacks())
        flwr.addFilter(_KnownNotices())
        # Ray's notice on a default it will change; we set no accelerator variables.
        warnings.filterwarnings(
            "ignore", message="Tip: In future versions of Ray", category=FutureWarning
        )


@contextmanager
def _logging_restored() -> Iterator[None]:
    """Put fl_lbbsp's and Flower's loggers (handlers, level, propagation, filters) and
    Python's warning filters back as they were once a command returns, so that a command
    run in-process (a notebook, a test) leaves no quiet filter and no handler on a closed
    stream behind."""
    loggers = [logging.getLogger("fl_lbbsp"), logging.getLogger("flwr")]
    saved = [(list(lg.handlers), lg.level, lg.propagate, list(lg.filters)) for lg in loggers]
    with warnings.catch_warnings():
        try:
            yield
        finally:
            for logger, (handlers, level, propagate, filters) in zip(loggers, saved, strict=True):
                logger.handlers[:] = handlers
                logger.setLevel(level)
                logger.propagate = propagate
                logger.filters[:] = filters


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fl-lbbsp`` console script.

    Every refused input (a bad flag, a file or folder that cannot be used, an invalid
    checkpoint, key or registry) ends with one line on stderr and exit code 2; a run that
    produced no model with exit code 1; Ctrl-C with one line (which run it stopped and,
    with ``--checkpoint-dir``, how to resume it) and exit code 130; never with a Python
    traceback. ``deploy-local`` handles its own Ctrl-C: it stops the federation and
    returns its exit code.
    """
    try:
        with _logging_restored():
            return _main(argv)
    except OSError as err:  # a file or folder the system refused, wherever it surfaced
        fail(_os_message(err))
    except KeyboardInterrupt as err:  # Ctrl-C (or SIGINT) in any command
        what = str(err) if isinstance(err, RunInterrupted) else "interrupted"
        print(f"fl-lbbsp: {' '.join(what.split())}", file=sys.stderr)
        raise SystemExit(130) from None


def _os_message(err: OSError) -> str:
    where = f"{err.filename}: " if err.filename is not None else ""
    return f"{where}{err.strerror or err}"


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "deploy-local":
        from .runs.deploy import RestartPolicy, read_run_config, serve

        if args.app is not None and not (args.app / "pyproject.toml").is_file():
            parser.error(f"--app {args.app} is not a Flower app (no pyproject.toml)")
        if args.run_config is not None and args.app is None:
            parser.error("--run-config needs --app")
        if args.run_config is not None and not args.run_config.is_file():
            parser.error(f"--run-config {args.run_config} is not a file")
        if args.run_config is not None:
            try:
                read_run_config(args.run_config)
            except ValueError as err:
                parser.error(f"--run-config {args.run_config}: {err}")
        if not args.run_timeout > 0:
            parser.error(f"--run-timeout must be positive, got {args.run_timeout}")
        try:
            federation = _deploy_federation(args)
        except ValueError as err:
            parser.error(str(err))
        return serve(
            federation,
            policy=RestartPolicy(restart=not args.no_restart),
            app=args.app,
            run_config=None if args.run_config is None else args.run_config.resolve(),
            run_timeout=args.run_timeout,
        )
    _setup_logging(getattr(args, "quiet", False), getattr(args, "verbose", False))
    if args.command == "keys":
        commands = {"silos": _silo_keys, "generate": _generate_keys, "checkpoint": _checkpoint_key}
        try:
            return commands[args.keys_command](args)
        except ValidationError as err:
            parser.error(validation_message(err))
        except FileExistsError as err:
            parser.error(f"{err} (use --force)")
        except ValueError as err:
            parser.error(str(err))
    from .runs.fl import SCHEMES

    for scheme in (args.schemes or [""]) if args.command == "compare" else []:
        if scheme not in SCHEMES:  # simulate's --scheme is a choice among them
            parser.error(f"unknown --schemes {scheme!r}: expected one of {', '.join(SCHEMES)}")
    from .datasets import DataSourceError
    from .security.identity import IdentityError
    from .strategies.checkpoint import CheckpointError, CheckpointWriteError

    key_errors: tuple[type[Exception], ...] = ()
    if getattr(args, "encrypt", None) is not None:
        try:
            from .crypto import KeyFileError
        except ImportError as err:
            fail(f"--encrypt: {err}")
        key_errors = (KeyFileError,)
    try:
        return run_cluster_command(args) if args.command == "cluster" else run_command(args)
    except ValidationError as err:
        fail(validation_message(err))
    except DataSourceError as err:
        fail(str(err))
    except CheckpointWriteError as err:  # a run that could not checkpoint: it failed
        fail(f"--checkpoint-dir: {err}", code=1)
    except CheckpointError as err:
        fail(f"--checkpoint-dir: {err}")
    except IdentityError as err:
        fail(f"--silo-registry: {err}")
    except key_errors as err:  # key files missing, of the wrong kind, or altered
        fail(f"--encrypt: {err}")
    except RunFailedError as err:
        fail(str(err), code=1)


if __name__ == "__main__":
    raise SystemExit(main())
