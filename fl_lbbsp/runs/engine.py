"""What every simulated run does around Flower: the checks before round 1
(:func:`prepare_run`), the telemetry's first event, the ServerApp's body with central
evaluation (:func:`start_rounds`), and Flower's Simulation Engine (:func:`run_engine`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation
from pydantic import BaseModel

from ..clients.app import SiloSetup, test_data
from ..clients.trainer import evaluate
from ..datasets import ArrayDataset, load_source
from ..models import build_model
from ..strategies import LBBSPFedAvg
from ..strategies.checkpoint import (
    CheckpointError,
    CheckpointStore,
    check_checkpoint_dir,
    restore,
    resume_point,
)
from ..telemetry import TelemetryWriter
from .config import RunSettings

__all__ = [
    "RUN_FILE",
    "central_evaluation",
    "check_key_files",
    "initial_model",
    "prepare_run",
    "ray_init_args",
    "run_engine",
    "start_rounds",
    "start_telemetry",
]

log = logging.getLogger("fl_lbbsp")

S = TypeVar("S", bound=LBBSPFedAvg)


def start_rounds(
    config: RunSettings,
    grid: Grid,
    make_strategy: Callable[[], S],
    *,
    rounds: int,
    every: int = 1,
) -> S:
    """The ServerApp's body of every run: seed torch, build the model on the held-out
    test split, build the strategy (``make_strategy()``) and run it on ``grid`` for
    ``rounds`` rounds, evaluating the global model on the test split every ``every``
    rounds (encrypted runs: the silos or workers evaluate it); return the strategy."""
    model, test = initial_model(config)
    strategy = make_strategy()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord(),
        # Encrypted: the server cannot read the model; the machines evaluate it.
        evaluate_fn=None
        if config.encrypt is not None
        else central_evaluation(strategy, model, test, every=every),
    )
    return strategy


def initial_model(config: RunSettings) -> tuple[torch.nn.Module, ArrayDataset]:
    """The run's initial model (torch seeded with the run's seed) and its test split."""
    torch.manual_seed(config.seed)
    test = test_data(SiloSetup(dataset=config.dataset, seed=config.seed))
    model = build_model(config.model, input_shape=test.input_shape, num_classes=test.num_classes)
    return model, test


def central_evaluation(
    strategy: LBBSPFedAvg, model: torch.nn.Module, test: ArrayDataset, *, every: int = 1
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """``evaluate_fn`` for ``strategy.start``: test accuracy of the global model every
    ``every`` rounds (and round 0), logged and written to the strategy's telemetry."""
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)

    def evaluate_global(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round % every:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x, y)
        strategy.telemetry.evaluation(
            scheme=strategy.scheme,
            server_round=server_round,
            loss=loss,
            accuracy=accuracy,
            federated=False,
        )
        log.info("[%s] round %d | test accuracy %.4f", strategy.scheme, server_round, accuracy)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_global


def check_key_files(key_dir: Path) -> None:
    """Fail fast on missing or mismatched key files: the server's public context and the
    silos' secret context must both load, under the same fingerprint."""
    from ..crypto import load_server_keys, load_silo_keys

    server = load_server_keys(key_dir)
    load_silo_keys(key_dir, fingerprint=server.fingerprint)


RUN_FILE = "run.json"
"""File beside a run's checkpoints recording the settings that decide the run."""

_NOT_RUN_SETTINGS = frozenset(
    {"out", "rounds", "iterations", "runtime", "parallel", "emulate_wait", "wait",
     "checkpoint_dir", "checkpoint_key", "encrypt", "eval_every", "time_dilation",
     "silo_registry"}
)  # fmt: skip
"""Config fields a resumed run may change: where output goes, how long it runs and how
the silos are scheduled, none of which changes a round's result."""


def prepare_run(config: RunSettings, strategy: LBBSPFedAvg) -> None:
    """Check everything that can be checked before round 1, then start the telemetry.

    The data source loads; the key files (encrypted runs) load under one fingerprint;
    the checkpoint folder is a writable directory; a resume (a checkpoint in the folder)
    has the settings of the run that wrote it (:data:`RUN_FILE`: model, data, silos,
    partition, seed, tau, eta, B_init, balancer, ...), a valid state of at most the run's
    silos and a model of the run's layout (:func:`~fl_lbbsp.strategies.checkpoint.resume_point`,
    restored into ``strategy`` as a trial), and the telemetry of its earlier rounds, copied
    from the first run's output folder when ``out`` changed.

    Raises
    ------
    DataSourceError
        A data source that cannot be read.
    CheckpointError
        A checkpoint folder that cannot be written, or a resume that differs from the
        run that wrote the checkpoint (each differing field named with both values).
    KeyFileError
        Missing or mismatched key files.
    """
    load_source(config.dataset)  # fail fast on a bad dataset spec or path
    if config.encrypt is not None:
        check_key_files(config.encrypt)
    directory = config.checkpoint_path()
    if config.checkpoint_dir is not None and directory is not None:
        check_checkpoint_dir(config.checkpoint_dir, directory)
    telemetry = config.telemetry_path()
    settings = {
        k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_RUN_SETTINGS
    }
    run_file = None if directory is None else directory / RUN_FILE
    saved = None
    if directory is not None and run_file is not None and CheckpointStore(directory).rounds():
        saved = _check_same_run(run_file, settings) if run_file.is_file() else None
    # A checkpoint of another strategy or other settings, of more silos than the run
    # has, of another model, or that the strategy cannot restore is refused here.
    checkpoint = None
    if directory is not None and CheckpointStore(directory).rounds():
        initial = ArrayRecord(initial_model(config)[0].state_dict())
        checkpoint = resume_point(strategy, max_silos=config.size, initial_arrays=initial)
    if checkpoint is not None:
        restore(strategy, checkpoint)  # as start will: a state it cannot take is refused
        earlier = None if saved is None else Path(saved)
        if not telemetry.exists() and earlier is not None and earlier.is_file():
            telemetry.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(earlier, telemetry)
        if not telemetry.is_file():
            raise CheckpointError(
                f"resuming after round {checkpoint.server_round} needs the telemetry of the "
                f"earlier rounds, {telemetry}: rerun with the first run's output folder"
            )
    if run_file is not None and (checkpoint is None or not run_file.is_file()):
        record = {"telemetry": str(telemetry.resolve()), "settings": settings}
        _write_atomically(run_file, json.dumps(record, indent=2, sort_keys=True))
    start_telemetry(telemetry, config, resume=checkpoint is not None)


def _check_same_run(run_file: Path, settings: dict[str, Any]) -> str:
    """Refuse settings other than those of the run that wrote the checkpoints beside
    ``run_file``; return that run's telemetry path."""
    try:
        saved = json.loads(run_file.read_text())
        earlier, before = str(saved["telemetry"]), dict(saved["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{run_file} is unreadable ({err})") from None
    differences = [
        f"{name} {before.get(name)!r} (now {value!r})"
        for name, value in settings.items()
        if before.get(name) != value
    ]
    if differences:
        raise CheckpointError(
            f"the checkpoint in {run_file.parent} is of a run with {'; '.join(differences)}: "
            "resume with the same settings, or use another checkpoint dir"
        )
    return earlier


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_telemetry(path: Path, config: BaseModel, *, resume: bool = False) -> None:
    """Start a fresh telemetry file at ``path`` with the run's config as first event.

    With ``resume`` (a run that resumes from a checkpoint) an existing file is kept: the
    strategy continues it and drops the events of rounds after its checkpoint.
    """
    if resume and path.exists():
        log.info("resuming from a checkpoint: telemetry %s is continued", path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    TelemetryWriter(path).write({"event": "config", **config.model_dump(mode="json")})


def ray_init_args(cpus: int) -> dict[str, Any]:
    """``ray.init`` arguments of the Simulation Engine: ``cpus`` CPUs, no dashboard, the
    workers at the driver's niceness unless ``RAY_worker_niceness`` is set (see
    :func:`run_engine`)."""
    args: dict[str, Any] = {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": False}
    if "RAY_worker_niceness" not in os.environ:
        args["_system_config"] = {"worker_niceness": 0}
    return args


def run_engine(
    server_app: ServerApp, client_app: ClientApp, *, num_supernodes: int, parallel: int
) -> None:
    """Run a ServerApp and ClientApp on Flower's Simulation Engine (Ray), with
    ``parallel`` ClientApps computing at once.

    Ray starts its workers (here: the silos' ClientApps) at niceness 15, below every
    ordinary process: on a busy machine a silo then gets a sliver of a core (about 1.5% of
    one beside a process at niceness 0, measured on this 2-core machine under two CPU
    burners) and its timings measure the other jobs, not its emulated capacity. The
    silos run at the driver's niceness instead, unless ``RAY_worker_niceness`` is set.
    """
    cpus = os.cpu_count() or 1
    backend_config = {
        "client_resources": {"num_cpus": cpus / parallel, "num_gpus": 0.0},
        "init_args": ray_init_args(cpus),
    }
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_supernodes,
        backend_config=backend_config,
    )
