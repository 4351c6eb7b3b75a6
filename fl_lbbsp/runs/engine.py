"""What every simulated run does around Flower: the parts its configuration resolves into
once (:class:`ResolvedRun`), the ServerApp's body with central evaluation
(:func:`start_rounds`), and the parts run in this process or on Flower's Simulation
Engine (:func:`execute`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from ..clients.silo_setup import InitialModel
from ..clients.trainer import evaluate
from ..datasets import ArrayDataset
from ..strategies import EngineStrategy
from ..strategies.checkpoint import Checkpoint
from ..telemetry import read_telemetry
from .config import RunSettings
from .inprocess import run_in_process
from .resume import RunRecord, run_record

if TYPE_CHECKING:
    from ..crypto import CKKSKeys

__all__ = [
    "InitialModel",
    "ResolvedRun",
    "RunPlan",
    "Runtime",
    "central_evaluation",
    "check_key_files",
    "execute",
    "plan_run",
    "ray_init_args",
    "run_engine",
    "server_app",
    "start_rounds",
]

log = logging.getLogger("fl_lbbsp")

S = TypeVar("S", bound=EngineStrategy)

Runtime = Literal["ray", "inprocess"]
"""Where a run's ServerApp and ClientApps run: Flower's Simulation Engine (Ray) or this
process (:func:`~fl_lbbsp.runs.inprocess.run_in_process`)."""


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What a runner decides from its configuration before it builds anything
    (:func:`plan_run`).

    Attributes
    ----------
    telemetry : Path
        The run's JSON-lines telemetry file.
    record : RunRecord | None
        The run as its checkpoint folder records it, the folder checked writable
        (:func:`~fl_lbbsp.runs.resume.run_record`); ``None``: no checkpoints.
    rounds : int
        Rounds (FL) or iterations (cluster) to run.
    evaluate_every : int | None
        The server evaluates the global model on the test split every this many rounds
        (and round 0); ``None``: the machines evaluate it (encrypted runs).
    nodes : int
        Silos or workers.
    parallel : int
        ClientApps computing at once on the Simulation Engine.
    """

    telemetry: Path
    record: RunRecord | None
    rounds: int
    evaluate_every: int | None
    nodes: int
    parallel: int


def plan_run(config: RunSettings, *, rounds: int, every: int = 1, parallel: int) -> RunPlan:
    """The plan of a run of ``config`` (:class:`RunPlan`), its checkpoint folder checked
    here, before anything is built.

    Raises
    ------
    CheckpointError
        A checkpoint folder that cannot be written.
    """
    return RunPlan(
        telemetry=config.telemetry_path(),
        record=run_record(config),
        rounds=rounds,
        evaluate_every=every if config.encrypt is None else None,
        nodes=config.size,
        parallel=parallel,
    )


@dataclass(frozen=True, kw_only=True)
class ResolvedRun(Generic[S]):
    """A run's configuration resolved once (:func:`fl_lbbsp.runs.fl.resolve`): every
    part built once, every check passed.

    Attributes
    ----------
    plan : RunPlan
        Its telemetry file (started, or continued on a resume), rounds, machines.
    strategy : EngineStrategy
        The server's strategy (restored from the checkpoint it resumes from, if any).
    initial : InitialModel
        The initial global model (torch seeded with the run's seed) and the test split.
    client_app : ClientApp
        What every silo or worker runs.
    resume : Checkpoint | None (default: None)
        The checkpoint the run resumes from, validated and restored into ``strategy``
        (:func:`~fl_lbbsp.runs.resume.resume_run`); ``None``: a fresh start.
    """

    plan: RunPlan
    strategy: S
    initial: InitialModel
    client_app: ClientApp
    resume: Checkpoint | None = None


def execute(run: ResolvedRun[S], *, runtime: Runtime = "ray") -> list[dict[str, Any]]:
    """Run ``run`` on Flower's Simulation Engine (:func:`run_engine`) or in this process
    (:func:`~fl_lbbsp.runs.inprocess.run_in_process`, the machines one after the other)
    and return its telemetry events."""
    app, plan = server_app(run), run.plan
    if runtime == "inprocess":
        run_in_process(app, run.client_app, num_nodes=plan.nodes)
    else:
        run_engine(app, run.client_app, num_supernodes=plan.nodes, parallel=plan.parallel)
    return read_telemetry(plan.telemetry)


def server_app(run: ResolvedRun[S]) -> ServerApp:
    """A ServerApp whose body is :func:`start_rounds` of ``run``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        start_rounds(run, grid)

    return app


def start_rounds(run: ResolvedRun[S], grid: Grid) -> S:
    """The ServerApp's body of every run: the strategy on ``grid`` from the initial model
    for ``run.plan.rounds`` rounds, with central evaluation (none in encrypted runs);
    return the strategy."""
    strategy, (model, test), every = run.strategy, run.initial, run.plan.evaluate_every
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=run.plan.rounds,
        train_config=ConfigRecord(),
        evaluate_fn=None
        if every is None
        else central_evaluation(strategy, model, test, every=every),
        resume=run.resume,
    )
    return strategy


def central_evaluation(
    strategy: EngineStrategy, model: torch.nn.Module, test: ArrayDataset, *, every: int = 1
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """``evaluate_fn`` for ``strategy.start``: test accuracy of the global model every
    ``every`` rounds (and round 0), logged and written to the strategy's telemetry."""
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)

    def evaluate_global(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round % every:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x, y)
        strategy.record_evaluation(server_round, loss=loss, accuracy=accuracy, federated=False)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_global


def check_key_files(key_dir: Path) -> CKKSKeys:
    """The server's public context of ``key_dir``, loaded once, after failing fast on
    missing or mismatched key files: the silos' secret context must load under its
    fingerprint.

    Raises
    ------
    KeyFileError
        Missing or mismatched key files.
    """
    from ..crypto import load_server_keys, load_silo_keys

    server = load_server_keys(key_dir)
    load_silo_keys(key_dir, fingerprint=server.fingerprint)
    return server


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
