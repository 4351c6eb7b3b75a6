"""``fl-lbbsp``: simulate LB-BSP or FedAvg on heterogeneous silos and compare them."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn, cast

from pydantic import ValidationError

from .cli_parser import balancing_of, build_parser

__all__ = ["build_parser", "main"]


class RunFailedError(RuntimeError):
    """A run that produced no model (every round skipped): exit code 1, one line."""


def _events(scheme: str, config: Any, run: Any) -> list[dict[str, Any]]:
    """``run(config)``'s telemetry events; a run the strategy stopped for learning
    nothing (:class:`~fl_lbbsp.strategies.outcomes.NoUpdateError`) is a
    :class:`RunFailedError` naming why, from its telemetry where it says."""
    from .runs.summary import run_failure
    from .strategies.outcomes import NoUpdateError
    from .telemetry import read_telemetry

    try:
        return list(run(config))
    except NoUpdateError as err:
        path = config.telemetry_path()
        failure = run_failure(read_telemetry(path)) if path.is_file() else None
        raise RunFailedError(f"{scheme}: {failure or err}") from None


def _checkpoint_key(args: argparse.Namespace) -> int:
    from .strategies.checkpoint import write_checkpoint_key

    path = write_checkpoint_key(args.out, overwrite=args.force)
    print(f"checkpoint key (give to the server only, --checkpoint-key): {path}")
    return 0


def _silo_keys(args: argparse.Namespace) -> int:
    from .core.identity import check_silo_id, write_silo_keys

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

    config = CKKSConfig(
        poly_modulus_degree=args.poly_modulus_degree,
        coeff_mod_bit_sizes=args.coeff_mod_bit_sizes,
        scale_bits=args.scale_bits,
    )
    keys = generate_keys(config)
    files = write_key_files(keys, args.out, overwrite=args.force)
    print(f"secret context (give to every silo, keep from the server): {files.secret}")
    print(f"public context (give to the server): {files.public}")
    print(f"key fingerprint: {keys.fingerprint} ({files.fingerprint})")
    return 0


def _run_cluster(args: argparse.Namespace) -> int:
    from .runs.cluster import ClusterConfig, run_cluster
    from .runs.summary import format_table, run_failure, summarise

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    configs = {
        scheme: ClusterConfig(
            scheme=scheme,
            workers=args.workers,
            speeds=None if args.speeds is None else tuple(args.speeds),
            dataset=_dataset(args),
            data=args.data,
            iterations=args.iterations,
            batch_size=args.batch_size,
            lr=args.lr,
            momentum=args.momentum,
            model=args.model,
            seed=args.seed,
            balancing=_balancing(args),
            cost_model=args.cost_model,
            wait=args.wait,
            eval_every=args.eval_every,
            parallel=args.parallel,
            out=args.out,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_key=args.checkpoint_key,
            encrypt=args.encrypt,
        )
        for scheme in schemes
    }
    first = next(iter(configs.values()))
    _check_outputs(args, first.out)
    _check_batch_size(first)
    events: dict[str, list[dict[str, Any]]] = {}
    for scheme, config in configs.items():
        with _progress(args, config.telemetry_path(), config.iterations, scheme, "iteration"):
            events[scheme] = _events(scheme, config, run_cluster)
        failure = run_failure(events[scheme])
        if failure is not None:
            raise RunFailedError(f"{scheme}: {failure}")
    target = args.target_accuracy
    if target is None:
        reference = events.get("bsp") or next(iter(events.values()))
        final = [e["accuracy"] for e in reference if e.get("event") == "evaluate"]
        target = 0.95 * final[-1] if final else None
    summaries = {s: summarise(ev, target_accuracy=target) for s, ev in events.items()}
    print(format_table(summaries))
    json_path = args.json or args.out / "cluster.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "config": configs[schemes[0]].model_dump(mode="json", exclude={"scheme"}),
        "schemes": summaries,
    }
    json_path.write_text(json.dumps(report, indent=2))
    print(f"report: {json_path}")
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
    if args.speeds is not None and len(args.speeds) != args.silos:
        raise ValueError(
            f"--speeds lists {len(args.speeds)} values but there are {args.silos} silos"
        )
    problem = writable_dir_problem(args.workdir)
    if problem is not None:
        raise ValueError(f"--workdir: {problem}")
    return LocalFederation(
        args.workdir,
        num_silos=args.silos,
        slowdowns=None if args.speeds is None else slowdowns_from_speeds(args.speeds),
        insecure=args.insecure,
        node_auth=not (args.insecure or args.no_node_auth),
        serialize_compute=not args.parallel_compute,
        silo_registry=_silo_registry(args),
        warm_workers=not args.no_warm_worker,
    )


def _config(args: argparse.Namespace, scheme: str, out: Path) -> Any:
    from .runs.fl import Scheme, SimulationConfig

    return SimulationConfig(
        scheme=cast(Scheme, scheme),  # checked against SCHEMES by main()
        silos=args.silos,
        speeds=None if args.speeds is None else tuple(args.speeds),
        partition=args.partition,
        rounds=args.rounds,
        local_steps=args.local_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        dataset=_dataset(args),
        model=args.model,
        seed=args.seed,
        balancing=_balancing(args),
        parallel=args.parallel,
        out=out,
        encrypt=args.encrypt,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_key=args.checkpoint_key,
        slowdown_schedules=None
        if args.slowdown_schedules is None
        else tuple(args.slowdown_schedules.split(";")),
        partial_replies=args.partial_replies,
        emulate_wait=not args.no_wait,
        cost_model=args.cost_model,
        runtime="inprocess" if args.in_process else "ray",
        silo_registry=args.silo_registry,
    )


def _check_outputs(args: argparse.Namespace, out: Path) -> None:
    """Refuse, in one line, output folders that cannot be written (``--out``, ``--json``'s
    folder, ``--checkpoint-dir``) and a checkpoint key that cannot be used, before any
    data is loaded."""
    from .runs.config import writable_dir_problem

    folders = [("--out", out), ("--checkpoint-dir", args.checkpoint_dir)]
    if args.json is not None:
        folders.append(("--json", args.json.parent))
    for flag, folder in folders:
        problem = None if folder is None else writable_dir_problem(folder)
        if problem is not None:
            _fail(f"{flag}: {problem}")
    if args.checkpoint_key is not None:
        from .strategies.checkpoint import CheckpointError, load_checkpoint_key

        if args.checkpoint_dir is None:
            _fail("--checkpoint-key: only with --checkpoint-dir")
        try:
            load_checkpoint_key(args.checkpoint_key)
        except CheckpointError as err:
            _fail(f"--checkpoint-key: {err}")


def _check_batch_size(config: Any) -> None:
    """Refuse, in one line, a B_init over every machine's dataset or whose total batch
    would not fit in this machine's memory (:func:`~fl_lbbsp.runs.config.batch_size_problem`).
    Data that cannot be loaded or split is left to the run, which reports it."""
    from .clients.app import SiloSetup, silo_data
    from .models import build_model
    from .runs.config import activation_bytes, batch_size_problem, memory_available

    machines = int(config.size)
    try:
        if hasattr(config, "silo_setup"):
            setup = config.silo_setup()
            data = [silo_data(setup, i) for i in range(machines)]
            largest = max(len(d) for d in data)
        else:  # a cluster: workers draw from the whole training split or a shard of it
            whole = silo_data(SiloSetup(dataset=config.dataset, seed=config.seed, num_silos=1), 0)
            data = [whole]
            largest = len(whole) if config.data == "full" else -(-len(whole) // machines)
        model = build_model(
            config.model, input_shape=data[0].input_shape, num_classes=data[0].num_classes
        )
        sample_bytes = activation_bytes(model, data[0].input_shape)
    except Exception:  # noqa: BLE001 - the run itself reports data it cannot load
        return
    problem = batch_size_problem(
        config.batch_size,
        machines=machines,
        largest_dataset=largest,
        sample_bytes=sample_bytes,
        available=memory_available(),
        unit=config.unit,
    )
    if problem is not None:
        _fail(problem)


def _dataset(args: argparse.Namespace) -> str:
    """``--dataset``, with ``--hf-image-column`` / ``--hf-label-column`` folded into an
    ``hf:PATH`` spec (refused with any other source)."""
    columns = {"image": args.hf_image_column, "label": args.hf_label_column}
    given = {key: value for key, value in columns.items() if value is not None}
    if not given:
        return str(args.dataset)
    if not str(args.dataset).strip().startswith("hf:"):
        flags = ", ".join(f"--hf-{key}-column" for key in given)
        _fail(f"{flags}: only with --dataset hf:PATH (got --dataset {args.dataset})")
    from .datasets import hf_source_spec

    path = str(args.dataset).strip().removeprefix("hf:").partition("?")[0]
    return hf_source_spec(path, **{f"{key}_column": value for key, value in given.items()})


def _progress(
    args: argparse.Namespace, telemetry: Path, total: int, label: str, unit: str = "round"
) -> AbstractContextManager[Any]:
    """The live progress display of one run (rich, on stderr), fed by its telemetry;
    nothing with ``--quiet``."""
    if args.quiet:
        return nullcontext()
    from .runs.progress import RoundProgress

    return RoundProgress(path=telemetry, total=total, label=label, unit=unit)


def _balancing(args: argparse.Namespace) -> dict[str, Any]:
    """The balancer's knobs given on the command line, the estimator's options with them."""
    return {**balancing_of(args), "estimator_options": _estimator_options(args)}


def _estimator_options(args: argparse.Namespace) -> dict[str, Any]:
    """The estimator's extra settings given on the command line (narx's warm-up and
    retraining interval), refused for another estimator."""
    options = {
        name: value
        for name, value in (("warmup", args.narx_warmup), ("train_every", args.narx_train_every))
        if value is not None
    }
    if options and args.estimator != "narx":
        flags = ", ".join(f"--narx-{name.replace('_', '-')}" for name in options)
        _fail(f"{flags}: only with --estimator narx (got --estimator {args.estimator})")
    return options


def _validation_message(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        if not item["loc"]:  # a check across fields: its message names them
            parts.append(str(item["msg"]).removeprefix("Value error, "))
            continue
        field = (
            item["loc"][1] if item["loc"][0] == "balancing" and item["loc"][1:] else item["loc"][0]
        )
        flag = "--" + str(field).replace("_", "-")
        parts.append(f"{flag}: {item['msg']} (got {item.get('input')!r})")
    return "; ".join(parts)


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


def _run(args: argparse.Namespace) -> int:
    from .runs.fl import run
    from .runs.summary import format_table, plot_comparison, run_cost_lines, run_failure, summarise

    if args.command == "simulate":
        schemes = [args.scheme]
    else:
        schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    out = args.out or Path("runs") / args.command
    configs = {scheme: _config(args, scheme, out) for scheme in schemes}  # validate all first
    _check_outputs(args, out)
    _check_batch_size(next(iter(configs.values())))
    events: dict[str, Sequence[dict[str, Any]]] = {}
    for scheme, config in configs.items():
        with _progress(args, config.telemetry_path(), config.rounds, scheme):
            events[scheme] = _events(scheme, config, run)
        failure = run_failure(events[scheme])
        if failure is not None:
            raise RunFailedError(f"{scheme}: {failure}")
    cost, costs = run_cost_lines(events)
    target = args.target_accuracy
    if target is None:
        best = [
            max((e["accuracy"] for e in ev if e.get("event") == "evaluate"), default=0.0)
            for ev in events.values()
        ]
        target = 0.9 * min(best)
    summaries = {
        s: summarise(ev, cost=costs[s], target_accuracy=target) for s, ev in events.items()
    }
    print(format_table(summaries))
    png = plot_comparison(summaries, out / f"{args.command}.png")
    print(f"plot: {png}")
    json_path = args.json or out / f"{args.command}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "config": configs[schemes[0]].model_dump(mode="json", exclude={"scheme"}),
        "cost_line": {"a": cost.a, "b": cost.b},
        "schemes": summaries,
    }
    json_path.write_text(json.dumps(report, indent=2))
    print(f"report: {json_path}")
    print(f"telemetry: {', '.join(str(c.telemetry_path()) for c in configs.values())}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fl-lbbsp`` console script.

    Every refused input (a bad flag, a file or folder that cannot be used, an invalid
    checkpoint, key or registry) ends with one line on stderr and exit code 2; a run that
    produced no model with exit code 1; never with a Python traceback.
    """
    try:
        return _main(argv)
    except OSError as err:  # a file or folder the system refused, wherever it surfaced
        _fail(_os_message(err))


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
            parser.error(_validation_message(err))
        except FileExistsError as err:
            parser.error(f"{err} (use --force)")
        except ValueError as err:
            parser.error(str(err))
    from .runs.fl import SCHEMES

    chosen, flag = [], "--scheme"
    if args.command == "simulate":
        chosen = [args.scheme]
    elif args.command == "compare":
        chosen, flag = (
            [s.strip() for s in args.schemes.split(",") if s.strip()] or [""],
            "--schemes",
        )
    for scheme in chosen:
        if scheme not in SCHEMES:
            parser.error(f"unknown {flag} {scheme!r}: expected one of {', '.join(SCHEMES)}")
    from .core.identity import IdentityError
    from .datasets import DataSourceError
    from .strategies.checkpoint import CheckpointError

    key_errors: tuple[type[Exception], ...] = ()
    if getattr(args, "encrypt", None) is not None:
        try:
            from .crypto import KeyFileError
        except ImportError as err:
            _fail(f"--encrypt: {err}")
        key_errors = (KeyFileError,)
    try:
        return _run_cluster(args) if args.command == "cluster" else _run(args)
    except ValidationError as err:
        _fail(_validation_message(err))
    except DataSourceError as err:
        _fail(str(err))
    except CheckpointError as err:
        _fail(f"--checkpoint-dir: {err}")
    except IdentityError as err:
        _fail(f"--silo-registry: {err}")
    except key_errors as err:  # key files missing, of the wrong kind, or altered
        _fail(f"--encrypt: {err}")
    except RunFailedError as err:
        _fail(str(err), code=1)


def _fail(message: str, *, code: int = 2) -> NoReturn:
    """Exit with one line on stderr: code 2 for a setting refused before round 1 (like
    argparse's usage errors), 1 for a run that failed."""
    print(f"fl-lbbsp: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)


if __name__ == "__main__":
    raise SystemExit(main())
