"""Cluster mode on Flower's Simulation Engine: BSP, LB-BSP and LB-BSP with naive
aggregation, one synchronous iteration per round, with the messaging overhead measured.

Every figure that depends on the workers' capacities is emulated (slowdowns, cost
models); messaging overhead and wall times are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

from flwr.app import ArrayRecord
from pydantic import Field, model_validator

from ..clients.cluster import WorkerSetup, make_worker_app
from ..clients.silo_setup import SiloSetup, initial_model
from ..strategies import EngineStrategy
from ..strategies.cluster import LBBSPCluster
from ..telemetry import start_telemetry
from .config import RunSettings
from .engine import ResolvedRun, check_key_files, execute, plan_run
from .resume import resume_run

__all__ = [
    "ClusterConfig",
    "make_cluster_strategy",
    "resolve_cluster",
    "run_cluster",
    "run_cluster_in_process",
]

log = logging.getLogger("fl_lbbsp")

Scheme = Literal["bsp", "lbbsp", "lbbsp-naive"]


class ClusterConfig(RunSettings):
    """One simulated cluster run: what is particular to cluster runs; the settings shared
    with FL runs are those of :class:`~fl_lbbsp.runs.config.RunSettings`.

    Parameters
    ----------
    scheme : {"bsp", "lbbsp", "lbbsp-naive"} (default: "lbbsp")
        BSP (every worker at B_init), LB-BSP with weighted gradient aggregation, or
        LB-BSP with the naive (biased) mean.
    workers : int (default: 4)
        Number of workers.
    data : {"full", "shard"} (default: "full")
        Workers sample from the whole training set, or each from its i.i.d. shard.
    iterations : int (default: 100)
        Synchronous iterations (rounds).
    batch_size : int (default: 64)
        Initial per-worker batch; the global batch is ``workers * batch_size``.
    momentum : float (default: 0.0)
        SGD momentum.
    cost_model : str | None (default: None)
        GPU-shaped cost ``"m,b,C,x_max"`` of the fastest worker; worker i's is scaled by
        its slowdown. ``None``: real compute time times the slowdown (with real waits).
    wait : bool (default: False)
        With a cost model, wait out the modelled time (else only reported).
    eval_every : int (default: 5)
        Evaluate the global model on the test set every this many iterations.
    out : Path (default: runs/cluster)
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: CKKS-encrypted gradients, which the
        server only adds; the workers keep model replicas
        (:class:`~fl_lbbsp.strategies.encrypted_cluster.EncryptedLBBSPCluster`) and
        evaluate on their shares of the test split. Not with ``lbbsp-naive``. ``None``:
        plaintext.
    """

    unit: ClassVar[str] = "workers"

    scheme: Scheme = "lbbsp"
    workers: int = Field(default=4, gt=0, strict=True)
    data: Literal["full", "shard"] = "full"
    iterations: int = Field(default=100, gt=0, strict=True)
    batch_size: int = Field(default=64, gt=0, strict=True)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    wait: bool = False
    eval_every: int = Field(default=5, gt=0, strict=True)
    out: Path = Path("runs/cluster")

    @model_validator(mode="after")
    def _cluster_checks(self) -> ClusterConfig:
        if self.encrypt is not None and self.scheme == "lbbsp-naive":
            raise ValueError("encrypt: encrypted gradients are weighted by batch size; "
                             f"scheme {self.scheme!r} is not supported")  # fmt: skip
        return self

    @property
    def size(self) -> int:
        """Number of workers."""
        return self.workers

    def worker_setup(self) -> WorkerSetup:
        """Data/model/emulation setup shared by every worker."""
        return WorkerSetup(
            dataset=self.dataset,
            data=self.data,
            num_workers=self.workers,
            seed=self.seed,
            model=self.model,
            slowdowns=tuple(f"{k:g}" for k in self.slowdowns),
            cost_models=() if self.cost_model is None else (self.cost_model,) * self.workers,
            wait=self.wait,
            secret_context=None if self.encrypt is None else str(self.encrypt),
        )


def make_cluster_strategy(config: ClusterConfig) -> EngineStrategy:
    """The parameter-server strategy of a cluster run (encrypted with ``config.encrypt``,
    on the public context loaded once, after the workers' secret context is checked to
    match it: :func:`~fl_lbbsp.runs.engine.check_key_files`).

    Raises
    ------
    KeyFileError
        Missing or mismatched key files.
    """
    he_keys = None if config.encrypt is None else check_key_files(config.encrypt)
    settings: dict[str, Any] = {
        **config.strategy_settings(),
        "momentum": config.momentum,
        "aggregation": "naive" if config.scheme == "lbbsp-naive" else "weighted",
        "balance": config.scheme != "bsp",
        # Claimed times are checked against the wall time only where workers really wait
        # (None: on Flower's grids, off in process), not with modelled times only reported.
        "check_times": None if config.cost_model is None or config.wait else False,
    }
    if he_keys is None:
        return LBBSPCluster(**settings)
    from ..strategies.encrypted_cluster import EncryptedLBBSPCluster

    return EncryptedLBBSPCluster(
        public_context=he_keys, evaluate_every=config.eval_every, **settings
    )


def resolve_cluster(config: ClusterConfig) -> ResolvedRun[EngineStrategy]:
    """The run's parts, each built once, everything checked before Flower starts, as
    :func:`~fl_lbbsp.runs.fl.resolve`.

    Raises
    ------
    CheckpointError
        A checkpoint folder that cannot be written, or a resume that differs from the run
        that wrote the checkpoint (each differing field named with both values).
    CheckpointInvalidError
        A checkpoint that fails validation or that the strategy cannot restore.
    KeyFileError
        Missing or mismatched key files.
    """
    setup = config.worker_setup()
    plan = plan_run(
        config, rounds=config.iterations, every=config.eval_every, parallel=config.parallel
    )
    strategy = make_cluster_strategy(config)
    initial = initial_model(SiloSetup(dataset=config.dataset, seed=config.seed, model=config.model))
    arrays = ArrayRecord(initial.model.state_dict())
    resume = resume_run(strategy, plan.record, max_silos=plan.nodes, initial_arrays=arrays)
    client_app = make_worker_app(setup)
    start_telemetry(plan.telemetry, config, resume=resume is not None)
    return ResolvedRun(
        plan=plan, strategy=strategy, initial=initial, client_app=client_app, resume=resume
    )


def run_cluster(config: ClusterConfig) -> list[dict[str, Any]]:
    """Run one simulated cluster on Flower's Simulation Engine and return its telemetry
    events."""
    resolved = resolve_cluster(config)
    return execute(resolved, runtime="ray")


def run_cluster_in_process(config: ClusterConfig) -> list[dict[str, Any]]:
    """:func:`run_cluster` on an :class:`~fl_lbbsp.runs.inprocess.InProcessGrid`: the
    workers one after the other in this process, no Ray start-up (tests, smoke
    benchmarks). Emulated times are the same; the messaging overhead is not Flower's."""
    resolved = resolve_cluster(config)
    return execute(resolved, runtime="inprocess")
