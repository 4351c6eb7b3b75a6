"""The silo: train exactly tau steps with the batch size the server sent, time them, report.

What LB-BSP needs from a silo, on top of a plain FedAvg ClientApp, is three things: use
the ``batch-size`` of the train message, measure the compute time of the local steps and
send it back as ``train-time`` with a stable ``silo-id``
(:func:`fl_lbbsp.clients.silo_task.train` does the work). With node-config
``signing-key`` (a ``silo-<id>.key`` of ``fl-lbbsp keys silos``, given by
``fl-lbbsp deploy-local --silo-registry``) the silo also signs its train reply, so that a
server with the silo registry can tell it from an impostor's.

Flower starts a new ClientApp process for every message. This module imports no torch:
with node-config ``warm-worker`` (set by ``fl-lbbsp deploy-local``) the silo's warm worker
(:mod:`fl_lbbsp.clients.warm`), a long-lived process holding torch, the data and the
model, does the training; without one (``flwr run`` in simulation, a worker that died)
this process does it itself.
"""

from __future__ import annotations

import time
from functools import lru_cache

import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lbbsp.clients.task import TaskRequest
from fl_lbbsp.clients.warm import run_task, worker_folder
from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.security.identity import load_signing_key, sign_reply, signed_arrays

app = ClientApp()


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
    silo's signature over this run, round, instruction (the message answered), silo id,
    metrics and arrays (what the server's silo registry checks). Signed here, in the
    process that builds the reply."""
    keys = RecordKeys()
    record = ConfigRecord({keys.silo_id: silo_id})
    path = str(context.node_config.get("signing-key", ""))
    if path:
        record[keys.signature] = sign_reply(
            _signing_key(path),
            run_id=msg.metadata.run_id,
            server_round=server_round,
            instruction=msg.metadata.message_id or None,
            silo=silo_id,
            metrics=metrics,
            arrays=signed_arrays(arrays),
        )
    return record


def _request(kind: str, msg: Message, context: Context) -> TaskRequest:
    record = msg.content["arrays"]
    return TaskRequest(
        kind="train" if kind == "train" else "evaluate",
        arrays=[(name, array.numpy()) for name, array in record.items()],
        config=dict(msg.content.config_records.get("config") or {}),
        run_config=dict(context.run_config),
        node_config=dict(context.node_config),
        process_started=psutil.Process().create_time(),  # this ClientApp process's start
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run tau local steps at this silo's batch size and report the compute time."""
    handler_start = time.perf_counter()
    request = _request("train", msg, context)
    result, warm = run_task(request, folder=worker_folder(context.node_config))
    server_round = int(request.config["server-round"])
    silo_id = str(context.node_config.get("silo-id", context.node_config["partition-id"]))
    metrics = MetricRecord(
        {
            **result.metrics,
            "busy-time": time.perf_counter() - handler_start,  # in this handler, wait included
            "warm-worker": int(warm),  # 1: trained by the silo's warm worker
        }
    )
    arrays = ArrayRecord({name: Array(a) for name, a in result.arrays})
    silo = _silo_record(
        msg, context, silo_id=silo_id, server_round=server_round, arrays=arrays, metrics=metrics
    )
    content = RecordDict({"arrays": arrays, "metrics": metrics, RecordKeys().silo_record: silo})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on this silo's data."""
    result, _ = run_task(
        _request("evaluate", msg, context), folder=worker_folder(context.node_config)
    )
    return Message(content=RecordDict({"metrics": MetricRecord(result.metrics)}), reply_to=msg)
