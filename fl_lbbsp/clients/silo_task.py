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

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..contract import STARTUP_TIME, RecordKeys
from ..datasets import ArrayDataset
from ..instruction import RoundInstruction, silo_id_of
from ..models import ModelName
from .emulated import Emulation, run_emulated_round, slowdown_schedule
from .emulation import CostModel, compute_slot
from .round import LocalTraining, WorkDone
from .silo_setup import SiloSetup, model_for, silo_data, test_data
from .task import TaskRequest, TaskResult
from .trainer import evaluate, train_local

__all__ = [
    "build_model_for",
    "central_test_set",
    "handle",
    "local_train_set",
    "prepare_process",
    "setup_from",
    "training_work",
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
    return model_for(str(run_config["model"]), data)


def _warm_up(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One untimed forward/backward pass on two samples, parameters untouched.

    torch's first pass in a process pays one-off set-up costs; they belong to the
    process start, not train-time.
    """
    model.eval()  # no running statistics updated
    torch.nn.functional.cross_entropy(model(x[:2]), y[:2]).backward()
    model.zero_grad(set_to_none=True)


def _model(request: TaskRequest, data: ArrayDataset) -> torch.nn.Module:
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in request.arrays}
    return model_for(str(request.run_config["model"]), data, state)


def _arrays(model: torch.nn.Module) -> list[tuple[str, np.ndarray]]:
    return [(name, t.detach().cpu().numpy()) for name, t in model.state_dict().items()]


def training_work(
    model: torch.nn.Module, data: ArrayDataset
) -> Callable[[LocalTraining], WorkDone[None]]:
    """A round's work on ``data``: exactly ``plan.local_steps`` SGD steps of ``model`` at
    the plan's batch size and learning rate, with the plan's sampler, timed by the plan
    (the work :func:`~fl_lbbsp.clients.round.run_round` runs, here and in the bundled
    ClientApp)."""
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)

    def work(plan: LocalTraining) -> WorkDone[None]:
        with plan.timed():
            result = train_local(
                model,
                x,
                y,
                batch_size=plan.batch_size,
                local_steps=plan.local_steps,
                lr=plan.lr,
                sampler=plan.batch_sampler(len(x)),
            )
        return WorkDone(output=None, num_examples=len(data), loss=result.loss)

    return work


def train(request: TaskRequest) -> TaskResult:
    """Run tau local steps at this silo's batch size and report the compute time.

    Emulated heterogeneity: a silo k times slower reports ``k t`` for ``t`` seconds of
    compute and waits until that time has passed since it got the task, its turn for the
    compute lock included (as on a machine of its own); with run-config ``cost-model``
    ``"m,b"`` it reports ``tau k (m B + b)`` whatever it measured. The round itself is
    :func:`~fl_lbbsp.clients.round.run_round`'s, as in every silo entry point, wrapped by
    the emulation (:func:`~fl_lbbsp.clients.emulated.run_emulated_round`).
    """
    started = time.perf_counter()
    config, run_config, node_config = request.config, request.run_config, request.node_config
    keys = RecordKeys()
    instruction = RoundInstruction.from_config(config, keys)
    silo_id = silo_id_of(node_config, keys)

    data = local_train_set(run_config, node_config)
    model = _model(request, data)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    _warm_up(model, x, y)
    # ClientApp process start -> first local step: Flower's per-message launch, the
    # imports, the message and, without a warm worker, the data and the model
    startup = time.time() - request.process_started

    work = training_work(model, data)
    cost = str(run_config.get("cost-model", "") or "")
    schedule = slowdown_schedule(node_config, run_config=run_config)
    report = run_emulated_round(
        instruction,
        work,
        silo_id=silo_id,
        run_seed=run_config["seed"],
        keys=keys,
        emulation=Emulation(
            factor=schedule.factor(instruction.server_round),
            cost=CostModel.parse(cost) if cost else None,
        ),
        # node config compute-lock (set by fl-lbbsp deploy-local): silos on one machine
        # compute in turns, the emulated wait outside the slot
        slot=compute_slot(str(node_config.get("compute-lock", "")) or None),
        started=started,
    )
    metrics = {**report.metrics, STARTUP_TIME: startup}  # start-up is not train-time
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
