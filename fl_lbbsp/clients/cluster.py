"""The worker side of cluster mode as a Flower ClientApp: one gradient per round.

Each round a worker takes the weights and its batch size x_i from the server, computes
the gradient of the mean loss over x_i samples (drawn from the whole training set or
from its own shard), times it, and replies with the gradient arrays and the contract's
MetricRecord. Its speed can be emulated: k times slower (wait ``(k-1) t``), or by a
GPU-shaped :class:`~fl_lbbsp.clients.emulation.CostModel` whose time it reports (and,
if asked, waits out); asking a cost-model worker for more than its memory cap fails
like an out-of-memory error.

With a secret CKKS context (``WorkerSetup(secret_context=...)``) the worker runs in
encrypted mode (:class:`~fl_lbbsp.strategies.encrypted_cluster.EncryptedLBBSPCluster`): it
keeps a replica of the model in its node state, applies the encrypted aggregates the
server forwards (decrypt, divide by their weight sum, SGD step), and replies with
``Enc((x_i / X) * g_i)``; the time spent on encryption is reported as ``he-time``.

Reference: Chen et al., IEEE TCC 2021, Alg. 3 (worker: load a batch of x_i samples,
pull w, compute the local gradient, push it).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from pydantic import BaseModel, ConfigDict, Field

from ..contract import (
    BUSY_TIME,
    EVAL_ACCURACY,
    EVAL_LOSS,
    INITIAL_MODEL,
    UPDATE_PREFIX,
    RecordKeys,
    read_float,
    read_int,
)
from ..core.optim import SGD
from ..datasets import ArrayDataset, SourceSpec
from ..instruction import RoundInstruction, round_seed, silo_id_of
from ..models import ModelName
from .app import decrypt_arrays, encrypt_arrays, node_file, train_reply
from .emulated import Emulation, run_emulated_round, slowdown_schedule
from .emulation import CostModel, CostModelText, SlowdownText, emulate_slowdown
from .round import LocalTraining, WorkDone
from .silo_setup import SiloSetup, _split, model_for, silo_data, test_shard
from .trainer import evaluate

__all__ = ["WorkerSetup", "gradient", "make_worker_app", "sync_replica", "worker_data"]

_REPLICA = "replica"
_MOMENTUM = "replica-momentum"
_REPLICA_INFO = "replica-info"


class WorkerSetup(BaseModel):
    """How every worker of a cluster finds its data, model and emulated speed; the fields
    shared with :class:`~fl_lbbsp.clients.silo_setup.SiloSetup` (``dataset``, ``seed``,
    ``model``, ``slowdowns``, ``test_fraction``, ``torch_threads``, ``keys``,
    ``secret_context``, ``signing_key``) mean the same for worker i as for silo i.

    Parameters
    ----------
    data : {"full", "shard"} (default: "full")
        ``"full"``: the workers share the whole training set (shared storage) and split
        each round's global batch between them by ``batch-offset``, as BSP draws it;
        ``"shard"``: worker i samples from its own i.i.d. shard.
    num_workers : int (default: 4)
        Number of workers (shards).
    cost_models : tuple of str (default: ())
        Emulated batch time of worker i, ``"m,b,C,x_max"`` (:meth:`CostModel.parse`),
        times its slowdown of the round. Without one: its real compute time times its
        slowdown.
    wait : bool (default: False)
        With a cost model: also wait until the modelled time has passed (off, only the
        reported time is emulated).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: SourceSpec = "embedded"
    data: Literal["full", "shard"] = "full"
    num_workers: int = Field(default=4, gt=0)
    seed: int = Field(default=0, ge=0)
    model: ModelName = "lenet5"
    slowdowns: tuple[SlowdownText, ...] = ()
    cost_models: tuple[CostModelText, ...] = ()
    wait: bool = False
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    torch_threads: int = Field(default=1, gt=0)
    keys: RecordKeys = RecordKeys()
    secret_context: str | None = None
    signing_key: str | None = None


def worker_data(setup: WorkerSetup, worker: int) -> ArrayDataset:
    """The samples worker ``worker`` draws its batches from."""
    if setup.data == "full":
        return _split(setup.dataset, setup.seed, setup.test_fraction)[0]
    return silo_data(_as_silos(setup), worker)


def _as_silos(setup: WorkerSetup) -> SiloSetup:
    """The workers as the silos of an i.i.d. split: their shards and test shares."""
    return SiloSetup(
        dataset=setup.dataset,
        partition="iid",
        num_silos=setup.num_workers,
        seed=setup.seed,
        test_fraction=setup.test_fraction,
    )


def gradient(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[dict[str, np.ndarray], float]:
    """Gradient of the mean cross-entropy over ``(x, y)`` for every entry of the model's
    state dict (zeros for buffers), and the loss."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    params = dict(model.named_parameters())
    grads = {}
    for name, value in model.state_dict().items():
        grad = params[name].grad if name in params else None
        grads[name] = (torch.zeros_like(value) if grad is None else grad).detach().numpy()
    return grads, float(loss.detach())


def _cost_model(setup: WorkerSetup, context: Context, worker: int) -> CostModel | None:
    value = context.node_config.get("cost-model")
    if value is None and worker < len(setup.cost_models):
        value = setup.cost_models[worker]
    return None if value is None else CostModel.parse(str(value))


def _batch_indices(
    setup: WorkerSetup,
    data: ArrayDataset,
    worker_id: str,
    server_round: int,
    batch_size: int,
    config: ConfigRecord,
    plan: LocalTraining | None = None,
) -> torch.Tensor:
    """This worker's sample indices for the round.

    ``data="full"``: the round's global batch is one seeded permutation of the whole
    training set (cycled if X exceeds it), and the worker takes ``batch_size`` entries
    from its ``batch-offset``: together the workers draw exactly BSP's global batch.
    ``data="shard"``: a seeded draw from the worker's own shard (through ``plan``'s
    sampler when given, seeded like it otherwise).
    """
    if setup.data == "full" and setup.keys.batch_offset in config:
        offset = read_int(config, setup.keys.batch_offset)
        generator = torch.Generator().manual_seed(round_seed(setup.seed, "global", server_round))
        order = torch.randperm(len(data), generator=generator)
        positions = torch.arange(offset, offset + batch_size) % len(data)
        return order[positions]
    if plan is None:
        plan = LocalTraining(
            batch_size=batch_size,
            local_steps=1,
            lr=1.0,
            server_round=server_round,
            seed=round_seed(setup.seed, worker_id, server_round),
        )
    return torch.as_tensor(next(iter(plan.batch_sampler(len(data)))))


def sync_replica(
    content: RecordDict, state: RecordDict, *, secret_context: str, keys: RecordKeys
) -> tuple[dict[str, np.ndarray], float]:
    """Bring this worker's model replica to the version the server asks for.

    Starts from the plaintext initial model if the message carries one, else from the
    replica in ``state``; applies every forwarded aggregate it has not applied yet, in
    order: decrypt ``sum_i Enc(w_i g_i)``, divide by ``sum_i w_i`` and take an SGD step
    with the config's ``lr`` and ``momentum`` (the step the plaintext parameter server
    takes). The replica and its momentum buffers are stored back in ``state``.

    Parameters
    ----------
    content : RecordDict
        The server's message: config (``model-version``, ``lr``, ``momentum``), optionally
        ``initial-model``, and the ``aggregate-<v>`` records.
    state : RecordDict
        The node's persistent state (``Context.state``).
    secret_context : str
        Path of the secret CKKS context.
    keys : RecordKeys
        Record key names.

    Returns
    -------
    tuple of (dict of str to ndarray, float)
        The parameters at the requested version and the seconds spent decrypting.

    Raises
    ------
    RuntimeError
        If the replica is missing or the forwarded aggregates do not continue it.
    """
    config = content.config_records["config"]
    target = read_int(config, keys.model_version)
    if INITIAL_MODEL in content:
        record = content.array_records[INITIAL_MODEL]
        params = {name: np.asarray(record[name].numpy()) for name in record}
        version, buffers = 0, None
    elif _REPLICA in state:
        params = {name: np.asarray(a.numpy()) for name, a in state.array_records[_REPLICA].items()}
        version = read_int(state.config_records[_REPLICA_INFO], "version")
        moment = state.array_records.get(_MOMENTUM)
        buffers = None if moment is None else [np.asarray(a.numpy()) for a in moment.values()]
    else:
        raise RuntimeError("no model replica on this worker: the server must resend the model")
    updates = sorted(
        (int(name[len(UPDATE_PREFIX) :]), name)
        for name in content
        if name.startswith(UPDATE_PREFIX)
    )
    optimizer = SGD(lr=read_float(config, keys.lr), momentum=read_float(config, keys.momentum, 0.0))
    optimizer.buffers = buffers
    names = list(params)
    seconds = 0.0
    for v, name in updates:
        if v <= version:
            continue
        if v != version + 1:
            raise RuntimeError(f"replica at model version {version} cannot apply aggregate {v}")
        grads, took = decrypt_arrays(content.array_records[name], secret_context)
        seconds += took
        stepped = optimizer.step([params[n] for n in names], [grads[n] for n in names])
        params = dict(zip(names, stepped, strict=True))
        version = v
    if version != target:
        raise RuntimeError(f"replica at model version {version}, the server asks for {target}")
    state[_REPLICA] = ArrayRecord({n: Array(np.ascontiguousarray(p)) for n, p in params.items()})
    state[_REPLICA_INFO] = ConfigRecord({"version": version})
    if optimizer.buffers is not None:
        state[_MOMENTUM] = ArrayRecord(
            {
                n: Array(np.ascontiguousarray(b))
                for n, b in zip(names, optimizer.buffers, strict=True)
            }
        )
    return params, seconds


def make_worker_app(setup: WorkerSetup) -> ClientApp:
    """Build the cluster worker ClientApp.

    The worker reads ``partition-id`` (and optionally ``silo-id``, ``slowdown`` and
    ``cost-model``) from its node_config. Its reply carries the gradient (an
    ArrayRecord named like the weights), ``batch-size`` (the aggregation weight),
    ``num-examples`` (the same), ``train-time`` (emulated), ``samples-processed``, CPU
    and memory, ``max-batch-size`` (its cost model's cap, 0 if none), and the real
    ``compute-time`` and ``busy-time``.

    In encrypted mode the gradient goes out as ``Enc((x_i / X) * g_i)``, the reply adds
    ``he-time`` (decryption of the aggregates and encryption, times the slowdown) and
    ``model-version``, and the worker also answers evaluation messages: it evaluates its
    replica on its share of the held-out test split.
    """
    app = ClientApp()
    keys = setup.keys

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        started = time.perf_counter()
        torch.set_num_threads(setup.torch_threads)
        config = msg.content.config_records["config"]
        instruction = RoundInstruction.from_config(config, keys)
        batch_size, server_round = instruction.batch_size, instruction.server_round
        worker = int(context.node_config.get("partition-id", 0))
        worker_id = silo_id_of(context.node_config, keys, node_id=context.node_id)
        factor = slowdown_schedule(context.node_config, listed=setup.slowdowns).factor(server_round)
        cost = _cost_model(setup, context, worker)
        if cost is not None:
            cost.scaled(factor).time(batch_size)  # raises OutOfMemoryError above the cap
        data = worker_data(setup, worker)
        model = model_for(setup.model, data)
        secret_context = node_file(context, "secret-context", setup.secret_context)
        extra: dict[str, Any] = {}
        if secret_context is None:
            model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
        else:
            params, he_seconds = sync_replica(
                msg.content, context.state, secret_context=secret_context, keys=keys
            )
            model.load_state_dict({n: torch.from_numpy(p) for n, p in params.items()})
            extra[keys.model_version] = read_int(config, keys.model_version)

        def work(plan: LocalTraining) -> WorkDone[dict[str, np.ndarray]]:
            index = _batch_indices(
                setup, data, worker_id, server_round, batch_size, config, plan=plan
            )
            grads, loss = gradient(
                model, torch.from_numpy(data.x)[index], torch.from_numpy(data.y)[index]
            )
            return WorkDone(output=grads, num_examples=batch_size, loss=loss)

        # one gradient on a slice of the global batch, not tau steps: no draws to check
        report = run_emulated_round(
            instruction,
            work,
            silo_id=worker_id,
            run_seed=setup.seed,
            keys=keys,
            emulation=Emulation(factor=factor, cost=cost, wait=cost is None or setup.wait),
            max_batch_size=0 if cost is None else int(cost.max_batch_size or 0),
            check_draws=False,
        )
        if secret_context is None:
            arrays = ArrayRecord({k: Array(v) for k, v in report.output.items()})
        else:
            arrays, seconds = encrypt_arrays(report.output, secret_context)
            extra[keys.he_time] = emulate_slowdown(he_seconds + seconds, factor)
        metrics = MetricRecord(
            {**report.metrics, BUSY_TIME: time.perf_counter() - started, **extra}
        )
        return train_reply(
            msg,
            arrays=arrays,
            metrics=metrics,
            keys=keys,
            silo_id=worker_id,
            signing_key=node_file(context, "signing-key", setup.signing_key),
        )

    @app.evaluate()
    def evaluate_replica(msg: Message, context: Context) -> Message:
        secret_context = node_file(context, "secret-context", setup.secret_context)
        if secret_context is None:
            raise ValueError("cluster workers evaluate only in encrypted mode (the server can)")
        torch.set_num_threads(setup.torch_threads)
        worker = int(context.node_config.get("partition-id", 0))
        params, _ = sync_replica(
            msg.content, context.state, secret_context=secret_context, keys=keys
        )
        data = test_shard(_as_silos(setup), worker)
        model = model_for(setup.model, data, {n: torch.from_numpy(p) for n, p in params.items()})
        loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
        version = read_int(msg.content.config_records["config"], keys.model_version)
        metrics = MetricRecord(
            {
                keys.num_examples: len(data),
                keys.batch_size: len(data),  # the cluster strategy's weight key
                EVAL_LOSS: loss,
                EVAL_ACCURACY: accuracy,
                keys.model_version: version,
            }
        )
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app
