"""The silo: train exactly tau steps with the batch size the server sent, time them, report.

What LB-BSP needs from a silo, on top of a plain FedAvg ClientApp, is three things: use
the ``batch-size`` of the train message, measure the compute time of the local steps and
send it back as ``train-time`` with a stable ``silo-id``. With node-config
``signing-key`` (a ``silo-<id>.key`` of ``fl-lbbsp keys silos``, given by
``fl-lbbsp deploy-local --silo-registry``) the silo also signs its train reply, so that a
server with the silo registry can tell it from an impostor's.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Iterator
from functools import lru_cache

import psutil
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.clients import (
    CostModel,
    SlowdownSchedule,
    emulated_time,
    evaluate,
    machine_usage,
    train_local,
)
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.identity import load_signing_key, sign_reply, signed_arrays

from .task import build_model_for, local_train_set

app = ClientApp()


def _slowdown(context: Context, server_round: int) -> float:
    """Emulated slowdown k of this silo: node-config ``slowdown``, else run-config list."""
    value = context.node_config.get("slowdown")
    if value is None:
        slowdowns = [s for s in str(context.run_config.get("slowdowns", "")).split(";") if s]
        partition_id = int(context.node_config["partition-id"])
        value = slowdowns[partition_id] if partition_id < len(slowdowns) else 1.0
    return SlowdownSchedule.parse(value).factor(server_round)


@contextlib.contextmanager
def _compute_slot(context: Context) -> Iterator[None]:
    """Take turns computing with the other silos of this machine, if asked to.

    Silos emulated on one machine would slow each other down and the emulation multiplies
    that noise by k; with node-config ``compute-lock`` (a file path, set by
    ``fl-lbbsp deploy-local``) only one silo computes at a time, like the simulation's
    ``--parallel 1``. The emulated wait happens outside the lock.
    """
    path = str(context.node_config.get("compute-lock", ""))
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


@lru_cache(maxsize=8)
def _signing_key(path: str) -> Ed25519PrivateKey:
    return load_signing_key(path)


def _silo_record(
    msg: Message,
    context: Context,
    *,
    silo_id: str,
    server_round: int,
    arrays: ArrayRecord,
    metrics: MetricRecord,
) -> ConfigRecord:
    """The reply's ``silo`` record: the silo id and, with node-config ``signing-key``, the
    silo's signature over this run, round, silo id, metrics and arrays (what the server's
    silo registry checks)."""
    keys = RecordKeys()
    record = ConfigRecord({keys.silo_id: silo_id})
    path = str(context.node_config.get("signing-key", ""))
    if path:
        record[keys.signature] = sign_reply(
            _signing_key(path),
            run_id=msg.metadata.run_id,
            server_round=server_round,
            silo=silo_id,
            metrics=metrics,
            arrays=signed_arrays(arrays),
        )
    return record


def _warm_up(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One untimed forward/backward pass on two samples, parameters untouched.

    Flower starts a new ClientApp process for every message, and torch's first pass in a
    process pays one-off set-up costs; they belong to the process start, not train-time.
    """
    model.eval()  # no running statistics updated
    torch.nn.functional.cross_entropy(model(x[:2]), y[:2]).backward()
    model.zero_grad(set_to_none=True)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run tau local steps at this silo's batch size and report the compute time."""
    handler_start = time.perf_counter()
    torch.set_num_threads(1)
    started = psutil.Process().create_time()  # this ClientApp process's start
    config = msg.content["config"]
    batch_size = int(config["batch-size"])  # B_i, chosen by the server for this silo
    local_steps = int(config["local-steps"])  # tau, the same for every silo
    lr = float(config["lr"])  # eta, the same for every silo
    server_round = int(config["server-round"])
    silo_id = str(context.node_config.get("silo-id", context.node_config["partition-id"]))

    data = local_train_set(context)
    model = build_model_for(context, data)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    seed = zlib.crc32(f"{context.run_config['seed']}:{silo_id}:{server_round}".encode())
    generator = torch.Generator().manual_seed(seed)  # reshuffling, reproducible
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    _warm_up(model, x, y)
    startup = time.time() - started  # process start, imports, message, data and model
    machine_usage()  # start psutil's CPU window
    with _compute_slot(context):
        result = train_local(
            model,
            x,
            y,
            batch_size=batch_size,
            local_steps=local_steps,
            lr=lr,
            generator=generator,
        )
    cpu, memory = machine_usage()
    # Emulated heterogeneity: a silo k times slower waits (k - 1) t and reports k t; with
    # run-config `cost-model` "m,b" it reports tau k (m B + b) whatever it measured.
    factor = _slowdown(context, server_round)
    cost = str(context.run_config.get("cost-model", ""))
    train_time = emulated_time(
        result.compute_time,
        factor,
        cost=CostModel.parse(cost) if cost else None,
        batch_size=batch_size,
        local_steps=local_steps,
    )

    metrics = MetricRecord(
        {
            "num-examples": len(data),  # aggregation weight: the local dataset size
            "train-time": train_time,  # seconds of compute for the tau steps
            "batch-size": batch_size,
            "samples-processed": result.samples,
            "cpu-percent": cpu,
            "memory-percent": memory,
            "compute-time": result.compute_time,  # real, unemulated seconds
            "startup-time": startup,  # not part of train-time: Flower's per-message launch
            "busy-time": time.perf_counter() - handler_start,  # in this handler, wait included
            "slowdown": factor,
            "train-loss": result.loss,
        }
    )
    arrays = ArrayRecord(model.state_dict())
    silo = _silo_record(
        msg, context, silo_id=silo_id, server_round=server_round, arrays=arrays, metrics=metrics
    )
    content = RecordDict({"arrays": arrays, "metrics": metrics, RecordKeys().silo_record: silo})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on this silo's data."""
    data = local_train_set(context)
    model = build_model_for(context, data)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
    metrics = MetricRecord({"num-examples": len(data), "eval-loss": loss, "eval-acc": accuracy})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
