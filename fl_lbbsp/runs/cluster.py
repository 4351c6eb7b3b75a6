"""Cluster mode on Flower's Simulation Engine: BSP, LB-BSP and LB-BSP with naive
aggregation, one synchronous iteration per round, with the messaging overhead measured.

Every figure that depends on the workers' capacities is emulated (slowdowns, cost
models); messaging overhead and wall times are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from pydantic import Field, model_validator

from ..clients.cluster import WorkerSetup, make_worker_app
from ..strategies.cluster import LBBSPCluster
from ..strategies.rounds import format_silos
from ..telemetry import read_telemetry
from .config import RunSettings
from .engine import prepare_run, run_engine, start_rounds

__all__ = [
    "ClusterConfig",
    "format_cluster_table",
    "make_cluster_strategy",
    "run_cluster",
    "run_cluster_in_process",
    "summarise_cluster",
]

log = logging.getLogger("fl_lbbsp")

Scheme = Literal["bsp", "lbbsp", "lbbsp-naive"]


class ClusterConfig(RunSettings):
    """One simulated cluster run.

    The settings shared with FL runs (``speeds``, ``dataset``, ``model``, ``seed``, the
    estimator, ...) are those of :class:`~fl_lbbsp.runs.config.RunSettings`; here, what
    is particular to cluster runs.

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
    lr : float (default: 0.05)
        Learning rate of the server's SGD.
    momentum : float (default: 0.0)
        SGD momentum.
    allocator : {"linear", "proportional", "iterative"} (default: "linear")
        The balancer's allocator.
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


def make_cluster_strategy(config: ClusterConfig) -> LBBSPCluster:
    """The parameter-server strategy of a cluster run (encrypted with ``config.encrypt``)."""
    settings: dict[str, Any] = {
        **config.strategy_settings(),
        "momentum": config.momentum,
        "aggregation": "naive" if config.scheme == "lbbsp-naive" else "weighted",
        "balance": config.scheme != "bsp",
    }
    if config.encrypt is None:
        return LBBSPCluster(**settings)
    from ..strategies.encrypted_cluster import EncryptedLBBSPCluster

    return EncryptedLBBSPCluster(
        public_context=config.encrypt, evaluate_every=config.eval_every, **settings
    )


def _server_app(config: ClusterConfig) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        start_rounds(
            config,
            grid,
            lambda: make_cluster_strategy(config),
            rounds=config.iterations,
            every=config.eval_every,
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
