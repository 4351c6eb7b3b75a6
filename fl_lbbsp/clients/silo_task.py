"""The quickstart silo's work, in whichever process runs it: train exactly tau steps with the
batch size the server sent, time them, emulate a slower machine, report.

The warm silo worker (:mod:`fl_lbbsp.clients.warm`) runs :func:`handle` for the
ClientApp process of every message; without a worker the ClientApp process runs it
itself. Both give the same arrays and metrics for the same message. Data and model
settings come from the run config (``dataset``, ``partition``, ``seed``, ``model``,
``slowdowns``, ``cost-model``), the silo's place from the node config
(``partition-id``, ``num-partitions``, ``silo-id``, ``slowdown``, ``compute-lock``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..datasets import ArrayDataset
from ..models import ModelName, build_model
from .app import SiloSetup, silo_data, test_data
from .emulation import CostModel, SlowdownSchedule, emulated_time
from .trainer import evaluate, machine_usage, train_local
from .warm import TaskRequest, TaskResult

__all__ = [
    "build_model_for",
    "central_test_set",
    "handle",
    "local_train_set",
    "prepare_process",
    "setup_from",
]

Config = Mapping[str, Any]

_lock = threading.Lock()
_datasets: dict[str, ArrayDataset] = {}  # a warm worker keeps its partition in memory


def prepare_process() -> None:
    """One torch thread per silo process (the silos share the machine's cores)."""
    torch.set_num_threads(1)


def setup_from(run_config: Config, num_partitions: int) -> SiloSetup:
    """Data, partitioning and model settings of the run, for ``num_partitions`` silos."""
    return SiloSetup(
        dataset=str(run_config["dataset"]),
        partition=str(run_config["partition"]),
        num_silos=num_partitions,
        seed=int(run_config["seed"]),
        model=cast(ModelName, str(run_config["model"])),  # checked by SiloSetup
    )


def local_train_set(run_config: Config, node_config: Config) -> ArrayDataset:
    """This silo's training data: partition ``partition-id`` of ``num-partitions``.

    Kept in memory by the process (a warm worker loads it once), and cached as a
    ``.npz`` file for new processes: later rounds skip loading and partitioning the
    source (scikit-learn, flwr-datasets), which takes seconds per process.
    """
    partition_id = int(node_config["partition-id"])
    num_partitions = int(node_config["num-partitions"])
    setup = setup_from(run_config, num_partitions)
    key = f"{setup.dataset}|{setup.partition}|{num_partitions}|{setup.seed}|{partition_id}"
    with _lock:
        if key in _datasets:
            return _datasets[key]
        data = _load_partition(setup, partition_id, key)
        _datasets[key] = data
        return data


def _load_partition(setup: SiloSetup, partition_id: int, key: str) -> ArrayDataset:
    cache = (
        Path(tempfile.gettempdir())
        / "lbbsp-quickstart"
        / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz")
    )
    if cache.exists():
        with np.load(cache) as saved:
            x, y, num_classes = saved["x"], saved["y"], int(saved["num_classes"])
        return ArrayDataset(x=x, y=y, num_classes=num_classes, name=setup.dataset)
    data = silo_data(setup, partition_id)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.{threading.get_ident()}.npz")
    np.savez(partial, x=data.x, y=data.y, num_classes=data.num_classes)
    os.replace(partial, cache)  # atomic: concurrent processes never read half a file
    return data


def central_test_set(run_config: Config) -> ArrayDataset:
    """The held-out test split the server evaluates the global model on."""
    return test_data(setup_from(run_config, 1))


def build_model_for(run_config: Config, data: ArrayDataset) -> torch.nn.Module:
    """The run's model, sized to ``data``."""
    return build_model(
        str(run_config["model"]), input_shape=data.input_shape, num_classes=data.num_classes
    )


def _slowdown(run_config: Config, node_config: Config, server_round: int) -> float:
    """Emulated slowdown k of this silo: node-config ``slowdown``, else run-config list."""
    value = node_config.get("slowdown")
    if value is None:
        slowdowns = [s for s in str(run_config.get("slowdowns", "")).split(";") if s]
        partition_id = int(node_config["partition-id"])
        value = slowdowns[partition_id] if partition_id < len(slowdowns) else 1.0
    return SlowdownSchedule.parse(value).factor(server_round)


@contextlib.contextmanager
def _compute_slot(node_config: Config) -> Iterator[None]:
    """Take turns computing with the other silos of this machine, if asked to.

    Silos emulated on one machine would slow each other down and the emulation multiplies
    that noise by k; with node-config ``compute-lock`` (a file path, set by
    ``fl-lbbsp deploy-local``) only one silo computes at a time, like the simulation's
    ``--parallel 1``. The emulated wait happens outside the lock.
    """
    path = str(node_config.get("compute-lock", ""))
    if not path:
        yield
        return
    import fcntl  # POSIX only; the lock is for several silos on one test machine

    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _warm_up(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One untimed forward/backward pass on two samples, parameters untouched.

    torch's first pass in a process pays one-off set-up costs; they belong to the
    process start, not train-time.
    """
    model.eval()  # no running statistics updated
    torch.nn.functional.cross_entropy(model(x[:2]), y[:2]).backward()
    model.zero_grad(set_to_none=True)


def _model(request: TaskRequest, data: ArrayDataset) -> torch.nn.Module:
    model = build_model_for(request.run_config, data)
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in request.arrays}
    model.load_state_dict(state)
    return model


def _arrays(model: torch.nn.Module) -> list[tuple[str, np.ndarray]]:
    return [(name, t.detach().cpu().numpy()) for name, t in model.state_dict().items()]


def train(request: TaskRequest) -> TaskResult:
    """Run tau local steps at this silo's batch size and report the compute time.

    Emulated heterogeneity: a silo k times slower reports ``k t`` for ``t`` seconds of
    compute and waits until that time has passed since it got the task, its turn for the
    compute lock included (as on a machine of its own); with run-config ``cost-model``
    ``"m,b"`` it reports ``tau k (m B + b)`` whatever it measured.
    """
    started = time.perf_counter()
    config, run_config, node_config = request.config, request.run_config, request.node_config
    batch_size = int(config["batch-size"])  # B_i, chosen by the server for this silo
    local_steps = int(config["local-steps"])  # tau, the same for every silo
    lr = float(config["lr"])  # eta, the same for every silo
    server_round = int(config["server-round"])
    silo_id = str(node_config.get("silo-id", node_config["partition-id"]))

    data = local_train_set(run_config, node_config)
    model = _model(request, data)
    seed = zlib.crc32(f"{run_config['seed']}:{silo_id}:{server_round}".encode())
    generator = torch.Generator().manual_seed(seed)  # reshuffling, reproducible
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    _warm_up(model, x, y)
    # ClientApp process start -> first local step: Flower's per-message launch, the
    # imports, the message and, without a warm worker, the data and the model
    startup = time.time() - request.process_started
    machine_usage()  # start psutil's CPU window
    with _compute_slot(node_config):
        result = train_local(
            model, x, y, batch_size=batch_size, local_steps=local_steps, lr=lr, generator=generator
        )
    cpu, memory = machine_usage()
    factor = _slowdown(run_config, node_config, server_round)
    cost = str(run_config.get("cost-model", ""))
    train_time = emulated_time(
        result.compute_time,
        factor,
        cost=CostModel.parse(cost) if cost else None,
        batch_size=batch_size,
        local_steps=local_steps,
        started=started,
    )
    metrics: dict[str, int | float] = {
        "num-examples": len(data),  # aggregation weight: the local dataset size
        "train-time": train_time,  # seconds of compute for the tau steps
        "batch-size": batch_size,
        "samples-processed": result.samples,
        "cpu-percent": cpu,
        "memory-percent": memory,
        "compute-time": result.compute_time,  # real, unemulated seconds
        "startup-time": startup,  # not part of train-time
        "slowdown": factor,
        "train-loss": result.loss,
    }
    return TaskResult(metrics=metrics, arrays=_arrays(model))


def evaluate_task(request: TaskRequest) -> TaskResult:
    """Loss and accuracy of the global model on this silo's data."""
    data = local_train_set(request.run_config, request.node_config)
    model = _model(request, data)
    loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
    return TaskResult(metrics={"num-examples": len(data), "eval-loss": loss, "eval-acc": accuracy})


def handle(request: TaskRequest) -> TaskResult:
    """Run a train or evaluate task (the warm worker's handler)."""
    prepare_process()
    if request.kind == "train":
        return train(request)
    if request.kind == "evaluate":
        return evaluate_task(request)
    raise ValueError(f"unknown task kind {request.kind!r}")
