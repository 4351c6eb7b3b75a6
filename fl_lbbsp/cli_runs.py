"""The run commands of ``fl-lbbsp`` (``simulate``, ``compare``, ``cluster``): the
settings each flag gives, checked before any data is loaded (one line, exit code 2, for
a refused one), the runs one scheme after the other with a progress display, and the
report (table, plot, JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError

from .cli_flags import balancing_of, values_of
from .cli_parser import NARX_FLAGS, run_flags

__all__ = [
    "RunFailedError",
    "RunInterrupted",
    "fail",
    "run_cluster_command",
    "run_command",
    "validation_message",
]


class RunFailedError(RuntimeError):
    """A run that produced no model (every round skipped): exit code 1, one line."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a scheme's run, its message the one line that says which run it
    stopped and how to resume it (:func:`fl_lbbsp.cli.main` prints it, exit code 130)."""


def run_command(args: argparse.Namespace) -> int:
    """``simulate`` and ``compare``: each scheme's run, the table, the plot and the JSON
    report."""
    from .runs.fl import run
    from .runs.summary import format_table, plot_comparison, run_cost_lines, summarise

    schemes = [args.scheme] if args.command == "simulate" else args.schemes
    out = args.out or Path("runs") / args.command
    configs = {scheme: _config(args, scheme, out) for scheme in schemes}  # validate all first
    events = _run_all(args, configs, out, run, total=configs[schemes[0]].rounds, unit="round")
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
    report = {"cost_line": {"a": cost.a, "b": cost.b}, "schemes": summaries}
    _write_report(args.json or out / f"{args.command}.json", configs[schemes[0]], report)
    print(f"telemetry: {', '.join(str(c.telemetry_path()) for c in configs.values())}")
    return 0


def run_cluster_command(args: argparse.Namespace) -> int:
    """``cluster``: each scheme's run, the table and the JSON report."""
    from .runs.cluster import ClusterConfig, run_cluster
    from .runs.summary import format_table, summarise

    schemes = args.schemes
    configs = {
        scheme: ClusterConfig(**_run_settings(args, ClusterConfig, scheme, args.out))
        for scheme in schemes
    }
    first = configs[schemes[0]]
    events = _run_all(args, configs, first.out, run_cluster, first.iterations, "iteration")
    target = args.target_accuracy
    if target is None:
        reference = events.get("bsp") or next(iter(events.values()))
        final = [e["accuracy"] for e in reference if e.get("event") == "evaluate"]
        target = 0.95 * final[-1] if final else None
    summaries = {s: summarise(ev, target_accuracy=target) for s, ev in events.items()}
    print(format_table(summaries))
    _write_report(args.json or args.out / "cluster.json", first, {"schemes": summaries})
    return 0


def _run_all(
    args: argparse.Namespace,
    configs: dict[str, Any],
    out: Path,
    run: Callable[[Any], Sequence[dict[str, Any]]],
    total: int,
    unit: str,
) -> dict[str, Sequence[dict[str, Any]]]:
    """Check the outputs and the batch size once, then run every scheme's config with a
    progress display; a run that failed is a :class:`RunFailedError`."""
    from .runs.summary import run_failure

    _check_outputs(args, out)
    _check_batch_size(next(iter(configs.values())))
    events: dict[str, Sequence[dict[str, Any]]] = {}
    for scheme, config in configs.items():
        try:
            with _progress(args, config.telemetry_path(), total, scheme, unit):
                events[scheme] = _events(scheme, config, run)
        except KeyboardInterrupt:
            raise RunInterrupted(_interrupted(args, scheme, config, total, unit)) from None
        failure = run_failure(events[scheme])
        if failure is not None:
            raise RunFailedError(f"{scheme}: {failure}")
    return events


def _interrupted(args: argparse.Namespace, scheme: str, config: Any, total: int, unit: str) -> str:
    """The line for Ctrl-C during ``scheme``'s run: which run, and with
    ``--checkpoint-dir`` the last round (``unit``) of it checkpointed and how to resume."""
    what = f"{args.command} {scheme}"
    if args.checkpoint_dir is None:
        return f"interrupted: {what}"
    from .strategies.checkpoint import CheckpointStore

    folder = config.checkpoint_path()
    try:
        done = CheckpointStore(folder).rounds() if folder is not None else []
    except OSError:  # the folder cannot be listed: say nothing of what it holds
        done = []
    saved = f"{unit} {done[-1]} of {total} checkpointed" if done else f"no {unit} checkpointed"
    return (
        f"interrupted: {what} ({saved}); resume with the same command and "
        f"--checkpoint-dir {args.checkpoint_dir}"
    )


def _write_report(path: Path, config: Any, report: dict[str, Any]) -> None:
    """The JSON report: the run's config (but its scheme), then ``report``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config_json = config.model_dump(mode="json", exclude={"scheme"})
    path.write_text(json.dumps({"config": config_json, **report}, indent=2))
    print(f"report: {path}")


def _run_settings(
    args: argparse.Namespace, model: type[BaseModel], scheme: str, out: Path
) -> dict[str, Any]:
    """The settings of a run's config ``model`` from its flags
    (:func:`~fl_lbbsp.cli_parser.run_flags`), the dataset, knobs, scheme and output."""
    return {
        **values_of(args, run_flags(model)),
        "scheme": scheme,
        "dataset": _dataset(args),
        "balancing": _balancing(args),
        "out": out,
    }


def _config(args: argparse.Namespace, scheme: str, out: Path) -> Any:
    from .runs.fl import SimulationConfig

    return SimulationConfig(
        **_run_settings(args, SimulationConfig, scheme, out),  # checked against SCHEMES
        emulate_wait=not args.no_wait,
        runtime="inprocess" if args.in_process else "ray",
    )


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
            fail(f"{flag}: {problem}")
    if args.checkpoint_key is not None:
        from .strategies.checkpoint import CheckpointError, load_checkpoint_key

        if args.checkpoint_dir is None:
            fail("--checkpoint-key: only with --checkpoint-dir")
        try:
            load_checkpoint_key(args.checkpoint_key)
        except CheckpointError as err:
            fail(f"--checkpoint-key: {err}")


def _check_batch_size(config: Any) -> None:
    """Refuse, in one line, a B_init over every machine's dataset or whose total batch
    would not fit in this machine's memory (:func:`~fl_lbbsp.runs.config.batch_size_problem`).
    Data that cannot be loaded or split is left to the run, which reports it."""
    from .clients.silo_setup import SiloSetup, silo_data
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
        fail(problem)


def _dataset(args: argparse.Namespace) -> str:
    """``--dataset``, with ``--hf-image-column`` / ``--hf-label-column`` folded into an
    ``hf:PATH`` spec (refused with any other source)."""
    columns = {"image": args.hf_image_column, "label": args.hf_label_column}
    given = {key: value for key, value in columns.items() if value is not None}
    if not given:
        return str(args.dataset)
    if not str(args.dataset).strip().startswith("hf:"):
        flags = ", ".join(f"--hf-{key}-column" for key in given)
        fail(f"{flags}: only with --dataset hf:PATH (got --dataset {args.dataset})")
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
    given = {name: getattr(args, f"narx_{name}") for name in NARX_FLAGS}
    options = {name: value for name, value in given.items() if value is not None}
    if options and args.estimator != "narx":
        flags = ", ".join(f"--narx-{name.replace('_', '-')}" for name in options)
        fail(f"{flags}: only with --estimator narx (got --estimator {args.estimator})")
    return options


def validation_message(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        if not item["loc"]:  # a check across fields: its message names them
            parts.append(str(item["msg"]).removeprefix("Value error, "))
            continue
        groups = ("balancing", "tuning")  # the knob, not the model that nests it
        field = next((p for p in item["loc"] if p not in groups), item["loc"][0])
        flag = "--" + str(field).replace("_", "-")
        if field == "estimator_options":  # given by the --narx-* flags
            flag = " / ".join(f"--narx-{name.replace('_', '-')}" for name in NARX_FLAGS)
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{flag}: {message} (got {item.get('input')!r})")
    return "; ".join(parts)


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Exit with one line on stderr: code 2 for a setting refused before round 1 (like
    argparse's usage errors), 1 for a run that failed."""
    print(f"fl-lbbsp: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)
