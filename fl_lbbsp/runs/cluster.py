"""Cluster mode on Flower's Simulation Engine: BSP, LB-BSP and LB-BSP with naive
aggregation, one synchronous iteration per round, with the messaging overhead measured.

Every figure that depends on the workers' capacities is emulated (slowdowns, cost
models); messaging overhead and wall times are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..clients.app import SiloSetup, test_data
from ..clients.cluster import WorkerSetup, make_worker_app
from ..clients.emulation import CostModelText, Speeds, check_speeds, slowdowns_from_speeds
from ..datasets import SourceSpec
from ..models import ModelName, build_model
from ..strategies.cluster import LBBSPCluster
from ..strategies.rounds import format_silos
from ..telemetry import read_telemetry
from .fl import (
    central_evaluation,
    check_estimator_name,
    check_estimator_options,
    prepare_run,
    run_engine,
)

__all__ = ["ClusterConfig", "format_cluster_table", "run_cluster", "summarise_cluster"]

log = logging.getLogger("fl_lbbsp")

Scheme = Literal["bsp", "lbbsp", "lbbsp-naive"]


class ClusterConfig(BaseModel):
    """One simulated cluster run.

    Parameters
    ----------
    scheme : {"bsp", "lbbsp", "lbbsp-naive"} (default: "lbbsp")
        BSP (every worker at B_init), LB-BSP with weighted gradient aggregation, or
        LB-BSP with the naive (biased) mean.
    workers : int (default: 4)
        Number of workers.
    speeds : tuple of float | None (default: None)
        Emulated relative capacity of each worker (e.g. 4,2,1,1).
    dataset : str (default: "embedded")
        ``embedded``, ``mnist:PATH`` or ``cifar10:PATH``.
    data : {"full", "shard"} (default: "full")
        Workers sample from the whole training set, or each from its i.i.d. shard.
    iterations : int (default: 100)
        Synchronous iterations (rounds).
    batch_size : int (default: 64)
        Initial per-worker batch; the global batch is ``workers * batch_size``.
    lr : float (default: 0.05)
        Learning rate of the server's SGD.
    momentum : float (default: 0.0)
        SGD momentum.
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model.
    seed : int (default: 0)
        Seed of the data split, model init and sampling (>= 0).
    estimator, alpha, allocator :
        Balancer settings (``estimator`` any name in
        :data:`fl_lbbsp.core.estimators.ESTIMATORS`; allocator ``linear``,
        ``proportional`` or ``iterative``).
    estimator_options : dict (default: {})
        Extra arguments of the estimator (NARX ``warmup``, ``train_every``, ...).
    cost_model : str | None (default: None)
        GPU-shaped cost ``"m,b,C,x_max"`` of the fastest worker; worker i's is scaled by
        its slowdown. ``None``: real compute time times the slowdown (with real waits).
    wait : bool (default: False)
        With a cost model, wait out the modelled time (else only reported).
    eval_every : int (default: 5)
        Evaluate the global model on the test set every this many iterations.
    parallel : int (default: 1)
        Workers computing at once.
    out : Path (default: runs/cluster)
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: workers keep model replicas and send
        CKKS-encrypted gradients (``secret.ckks``), the server only adds them
        (``public.ckks``; :class:`~fl_lbbsp.strategies.encrypted_cluster.EncryptedLBBSPCluster`),
        and accuracy is evaluated by the workers on their shares of the test split.
        Not with ``lbbsp-naive``.
    checkpoint_dir : Path | None (default: None)
        Checkpoint folder: every iteration is checkpointed in ``checkpoint_dir/<scheme>``
        (weights, momentum, balancer) and a rerun resumes from there. ``None``: none.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Scheme = "lbbsp"
    workers: int = Field(default=4, gt=0, strict=True)
    speeds: Speeds = None
    dataset: SourceSpec = "embedded"
    data: Literal["full", "shard"] = "full"
    iterations: int = Field(default=100, gt=0, strict=True)
    batch_size: int = Field(default=64, gt=0, strict=True)
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    model: ModelName = "lenet5"
    seed: int = Field(default=0, ge=0)
    estimator: str = "ema"
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    alpha: float = Field(default=0.2, gt=0, le=1)
    allocator: Literal["linear", "proportional", "iterative"] = "linear"
    cost_model: CostModelText | None = None
    wait: bool = False
    eval_every: int = Field(default=5, gt=0, strict=True)
    parallel: int = Field(default=1, gt=0, strict=True)
    out: Path = Path("runs/cluster")
    encrypt: Path | None = None
    checkpoint_dir: Path | None = None

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, value: str) -> str:
        return check_estimator_name(value)

    @model_validator(mode="after")
    def _speeds_per_worker(self) -> ClusterConfig:
        check_estimator_options(self.estimator, self.alpha, self.estimator_options)
        check_speeds(self.speeds, self.workers, "workers")
        if self.encrypt is not None and self.scheme == "lbbsp-naive":
            raise ValueError("encrypt: encrypted gradients are weighted by batch size; "
                             f"scheme {self.scheme!r} is not supported")  # fmt: skip
        return self

    @property
    def slowdowns(self) -> tuple[float, ...]:
        """Emulated slowdown factor of each of the workers (1 for the fastest)."""
        return slowdowns_from_speeds(self.speeds, self.workers)

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

    def telemetry_path(self) -> Path:
        """JSON-lines telemetry file of this run."""
        return self.out / f"{self.scheme}.jsonl"

    def checkpoint_path(self) -> Path | None:
        """Checkpoint folder of this run (``None``: no checkpoints)."""
        return None if self.checkpoint_dir is None else self.checkpoint_dir / self.scheme


def make_cluster_strategy(config: ClusterConfig) -> LBBSPCluster:
    """The parameter-server strategy of a cluster run (encrypted with ``config.encrypt``)."""
    settings: dict[str, Any] = dict(
        initial_batch_size=config.batch_size,
        lr=config.lr,
        momentum=config.momentum,
        aggregation="naive" if config.scheme == "lbbsp-naive" else "weighted",
        balance=config.scheme != "bsp",
        estimator=config.estimator,
        estimator_options=dict(config.estimator_options),
        alpha=config.alpha,
        allocator=config.allocator,
        telemetry_path=config.telemetry_path(),
        min_train_nodes=config.workers,
        min_available_nodes=config.workers,
        checkpoint_dir=config.checkpoint_path(),
    )
    if config.encrypt is None:
        return LBBSPCluster(**settings)
    from ..strategies.encrypted_cluster import EncryptedLBBSPCluster

    return EncryptedLBBSPCluster(
        public_context=config.encrypt, evaluate_every=config.eval_every, **settings
    )


def _server_app(config: ClusterConfig) -> ServerApp:
    app = ServerApp()
    # The held-out test set is the same split the FL silos use.
    split = SiloSetup(dataset=config.dataset, seed=config.seed)

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(config.seed)
        test = test_data(split)
        model = build_model(
            config.model, input_shape=test.input_shape, num_classes=test.num_classes
        )
        strategy = make_cluster_strategy(config)
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=config.iterations,
            train_config=ConfigRecord(),
            # Encrypted: the server cannot read the model; the workers evaluate it.
            evaluate_fn=None
            if config.encrypt is not None
            else central_evaluation(strategy, model, test, every=config.eval_every),
        )

    return app


def run_cluster(config: ClusterConfig) -> list[dict[str, Any]]:
    """Run one simulated cluster and return its telemetry events."""
    prepare_run(config, make_cluster_strategy(config))
    path = config.telemetry_path()
    run_engine(
        _server_app(config),
        make_worker_app(config.worker_setup()),
        num_supernodes=config.workers,
        parallel=config.parallel,
    )
    return read_telemetry(path)


def summarise_cluster(
    events: list[dict[str, Any]], *, target_accuracy: float | None = None
) -> dict[str, Any]:
    """Per-run figures: iterations and emulated time to the target accuracy, mean
    emulated iteration time, idle fraction, and the real messaging overhead per
    iteration (server wall time beyond the slowest worker's busy time)."""
    config = next(e for e in events if e.get("event") == "config")
    train = [e for e in events if e.get("event") == "train" and e.get("round_time")]
    accuracy = {e["round"]: e["accuracy"] for e in events if e.get("event") == "evaluate"}
    iteration = np.array([e["round_time"] for e in train])
    overhead = np.array([e["overhead"] for e in train if e.get("overhead") is not None])
    elapsed = np.cumsum(iteration)
    reached = sorted(
        r for r, a in accuracy.items() if target_accuracy is not None and a >= target_accuracy
    )
    first = reached[0] if reached else None
    mean_iteration = float(iteration.mean()) if len(iteration) else None
    mean_overhead = float(overhead.mean()) if len(overhead) else None
    share = (
        None
        if mean_iteration is None or mean_overhead is None
        else mean_overhead / (mean_iteration + mean_overhead)
    )
    final = train[-1]["silos"] if train else {}
    return {
        "scheme": config["scheme"],
        "emulated": config.get("speeds") is not None or config.get("cost_model") is not None,
        "speeds_emulated": config.get("speeds"),
        "iterations": len(train),
        "iteration_time_mean": mean_iteration,
        "idle_fraction_mean": float(np.mean([e["idle_fraction"] for e in train]))
        if train
        else None,
        "overhead_mean": mean_overhead,
        "overhead_share": share,
        "final_accuracy": accuracy[max(accuracy)] if accuracy else None,
        "target_accuracy": target_accuracy,
        "iterations_to_target": first,
        "time_to_target": None
        if first is None
        else (0.0 if first == 0 else float(elapsed[min(first, len(elapsed)) - 1])),
        "batch_sizes_final": {s: r.get("batch-size") for s, r in final.items()},
        "accuracy": accuracy,
    }


def format_cluster_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Side-by-side table of cluster runs (iteration times emulated, overhead real)."""
    rows = [
        ("iteration time, mean (s)", "iteration_time_mean", "{:.3f}"),
        ("idle fraction, mean", "idle_fraction_mean", "{:.1%}"),
        ("messaging per iteration (s)", "overhead_mean", "{:.3f}"),
        ("messaging share", "overhead_share", "{:.1%}"),
        ("iterations to target", "iterations_to_target", "{}"),
        ("time to target (s)", "time_to_target", "{:.2f}"),
        ("final accuracy", "final_accuracy", "{:.4f}"),
    ]
    names = list(summaries)
    width = max(len(r[0]) for r in rows) + 2
    lines = ["".ljust(width) + "".join(n.rjust(13) for n in names)]
    for label, key, pattern in rows:
        cells = []
        for name in names:
            value = summaries[name].get(key)
            cells.append(("-" if value is None else pattern.format(value)).rjust(13))
        lines.append(label.ljust(width) + "".join(cells))
    first = next(iter(summaries.values()))
    if first.get("target_accuracy") is not None:
        lines.append(f"target accuracy: {first['target_accuracy']:.4f}")
    if first.get("emulated"):
        lines.append(
            f"iteration times are emulated (worker capacities {first.get('speeds_emulated')});"
            " messaging is real wall time"
        )
    for name, summary in summaries.items():
        sizes = format_silos(summary["batch_sizes_final"])
        lines.append(f"final batch sizes ({name}): {sizes}")
    return "\n".join(lines)


def run_cluster_in_process(config: ClusterConfig) -> list[dict[str, Any]]:
    """Run one cluster with every worker's ClientApp in this process and return its
    telemetry events.

    The same ServerApp and worker ClientApp as :func:`run_cluster`, but through
    :class:`~fl_lbbsp.runs.inprocess.InProcessGrid`: the workers run one after the other in
    this process (messages still serialised), with no Ray start-up, so short runs (tests,
    smoke benchmarks) take seconds. Emulated times are the same; the measured messaging
    overhead is not Flower's.
    """
    from flwr.app import RecordDict

    from .inprocess import InProcessGrid

    prepare_run(config, make_cluster_strategy(config))
    path = config.telemetry_path()
    grid = InProcessGrid(make_worker_app(config.worker_setup()), num_nodes=config.workers)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    _server_app(config)(grid, context)
    return read_telemetry(path)
