"""The silo side as a Flower ClientApp: train with the batch size the server sends,
time the compute, report psutil metrics and, if asked, emulate a slower machine.

With a secret CKKS context the silo runs in encrypted mode: it decrypts the global model,
trains, multiplies its parameters by ``n_i / S`` and encrypts them (see
:mod:`fl_lbbsp.strategies.encrypted`), reporting the time spent on it as ``he-time``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from pydantic import BaseModel, ConfigDict, Field

from ..contract import (
    BUSY_TIME,
    EVAL_ACCURACY,
    EVAL_LOSS,
    HE_CHECK,
    LAST_MODEL,
    MODEL_REFUSED,
    REFUSED_ROUND,
    RecordKeys,
    is_encrypted,
    read_int,
)
from ..core.identity import key_file_name, load_signing_key, sign_reply, signed_arrays
from ..core.screening import model_problem
from ..datasets import (
    ArrayDataset,
    PartitionSpec,
    PartitionText,
    SourceSpec,
    load_source,
    partition_indices,
    train_test_split,
)
from ..instruction import RoundInstruction, silo_id_of
from ..models import ModelName, build_model
from .emulation import (
    CostModel,
    CostModelText,
    SlowdownSchedule,
    SlowdownText,
    compute_slot,
    emulate_slowdown,
)
from .round import Emulation, LocalTraining, WorkDone, run_round, slowdown_schedule
from .trainer import evaluate, train_local

if TYPE_CHECKING:
    from ..crypto import CKKSKeys, UpdateChecker

__all__ = ["SiloSetup", "make_client_app", "silo_data"]

log = logging.getLogger(__name__)


class SiloSetup(BaseModel):
    """How every silo of a federation finds its data, model and emulated speed.

    Parameters
    ----------
    dataset : str (default: "embedded")
        ``"embedded"``, ``"mnist:PATH"`` or ``"cifar10:PATH"``.
    partition : str (default: "iid")
        ``"iid"``, ``"labels:K"`` or ``"dirichlet:ALPHA"``.
    num_silos : int (default: 5)
        Number of silos the data is split over.
    seed : int (default: 0)
        Seed of the train/test split, the partitioning and the reshuffling (>= 0).
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model, sized to the input.
    slowdowns : tuple of str (default: ())
        Emulated slowdown of silo i (``"4"`` or a schedule ``"1:1,10:4"``); a silo's
        ``node_config["slowdown"]`` overrides it. Empty: the run config's ``slowdowns``
        (``"1;2;2;4;4"``, one entry per partition) if set, else no emulation.
    test_fraction : float (default: 0.2)
        Share of the data held out for the server's evaluation.
    torch_threads : int (default: 1)
        torch intra-op threads per silo process.
    keys : RecordKeys (default: RecordKeys())
        Record key names, the same as the strategy's.
    secret_context : str | None (default: None)
        Encrypted mode: the silos' secret CKKS context (``secret.ckks`` or its key folder,
        from ``fl-lbbsp keys generate``); a node's ``node_config["secret-context"]``
        overrides it. ``None``: plaintext updates.
    evaluate_on : {"train", "test"} (default: "train")
        Data a silo evaluates the global model on: its training partition, or its share
        (every ``num_silos``-th sample) of the held-out test split, for federated test
        accuracy when the server cannot evaluate (encrypted mode).
    emulate_wait : bool (default: True)
        A silo emulated k times slower waits ``(k - 1) * t`` after computing for ``t``.
        ``False``: it reports ``k * t`` at once, without waiting; enough when silos compute
        one after the other and only the reported (emulated) times matter, e.g. in the
        benchmarks. Round and wall-clock times then differ: say so with every figure.
    cost_model : str | None (default: None)
        Emulated time of one step on the fastest machine, ``"m,b"`` (seconds per sample
        and per step, :class:`~fl_lbbsp.clients.emulation.CostModel`): a silo reports
        ``tau * k * (m * B + b)`` instead of its measured time times k, so reported
        times, and the batch sizes that follow from them, are the same on a quiet or a
        busy machine. ``None``: measured compute times.
    compute_lock : str | None (default: None)
        Folder of the compute slots shared by the silos of one machine
        (:func:`~fl_lbbsp.clients.emulation.compute_slot`): ``compute_slots`` silos compute
        at a time, each alone on its share of the machine, and their emulated waits
        overlap outside the slots. ``None``: silos compute whenever they are run.
    compute_slots : int (default: 1)
        Silos computing at the same time when ``compute_lock`` is set.
    signing_key : str | None (default: None)
        The silos' Ed25519 signing keys from ``fl-lbbsp keys silos``: a key file, or their
        folder (silo ``s`` then uses ``silo-<s>.key``); a node's
        ``node_config["signing-key"]`` overrides it. With a key every train reply is
        signed (:mod:`fl_lbbsp.core.identity`). ``None``: replies are unsigned.
    max_model_ratio : float | None (default: 10.0)
        A global model (decrypted aggregate) whose L2 norm is more than this factor
        above or below the silo's last model's, or that holds NaN or inf, is refused with
        one warning: the silo trains from its last model instead and says so in its reply
        (``model-refused`` in its ``silo`` ConfigRecord). ``None``: only NaN and inf are
        refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: SourceSpec = "embedded"
    partition: PartitionText = "iid"
    num_silos: int = Field(default=5, gt=0)
    seed: int = Field(default=0, ge=0)
    model: ModelName = "lenet5"
    slowdowns: tuple[SlowdownText, ...] = ()
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    torch_threads: int = Field(default=1, gt=0)
    keys: RecordKeys = RecordKeys()
    secret_context: str | None = None
    evaluate_on: Literal["train", "test"] = "train"
    emulate_wait: bool = True
    cost_model: CostModelText | None = None
    compute_lock: str | None = None
    compute_slots: int = Field(default=1, gt=0)
    signing_key: str | None = None
    max_model_ratio: float | None = Field(default=10.0, gt=1)


@lru_cache(maxsize=4)
def _split(dataset: str, seed: int, test_fraction: float) -> tuple[ArrayDataset, ArrayDataset]:
    return train_test_split(load_source(dataset), test_fraction=test_fraction, seed=seed)


@lru_cache(maxsize=4)
def _partitions(
    dataset: str, partition: str, num_silos: int, seed: int, test_fraction: float
) -> tuple[np.ndarray, ...]:
    train, _ = _split(dataset, seed, test_fraction)
    spec = PartitionSpec.parse(partition)
    return tuple(partition_indices(train.y, num_silos=num_silos, spec=spec, seed=seed))


def silo_data(setup: SiloSetup, partition_id: int) -> ArrayDataset:
    """The local training data of silo ``partition_id`` (cached per process)."""
    train, _ = _split(setup.dataset, setup.seed, setup.test_fraction)
    parts = _partitions(
        setup.dataset, setup.partition, setup.num_silos, setup.seed, setup.test_fraction
    )
    return train.subset(parts[partition_id])


def test_data(setup: SiloSetup) -> ArrayDataset:
    """The held-out test set the server evaluates the global model on."""
    return _split(setup.dataset, setup.seed, setup.test_fraction)[1]


def test_shard(setup: SiloSetup, partition_id: int) -> ArrayDataset:
    """Silo ``partition_id``'s share of the held-out test set (every ``num_silos``-th)."""
    test = test_data(setup)
    return test.subset(np.arange(partition_id, len(test), setup.num_silos))


@lru_cache(maxsize=4)
def _silo_keys(path: str) -> tuple[CKKSKeys, UpdateChecker]:
    from ..crypto import UpdateChecker, load_silo_keys

    keys = load_silo_keys(path)
    return keys, UpdateChecker(keys)


def _open_arrays(
    record: ArrayRecord, secret_context: str | None
) -> tuple[dict[str, torch.Tensor], float]:
    """The global model as a state dict, decrypted if it came encrypted, and the seconds
    decryption took."""
    if not is_encrypted(record):
        return record.to_torch_state_dict(), 0.0
    if secret_context is None:
        raise ValueError("received an encrypted model but no secret context is configured")
    from ..crypto import decrypt_update, unflatten
    from ..crypto.records import update_from_record

    keys, checker = _silo_keys(secret_context)
    start = time.perf_counter()
    update = update_from_record(record)
    arrays = unflatten(decrypt_update(keys, update, checker=checker), update.layout)
    seconds = time.perf_counter() - start
    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in arrays.items()}, seconds


def _encrypt_model(
    model: torch.nn.Module, secret_context: str, *, weight: float, total: float, silos: int
) -> tuple[ArrayRecord, float]:
    """``Enc((weight / total) * parameters)`` as an ArrayRecord, and the seconds it took."""
    from ..crypto import encrypt_update, flatten
    from ..crypto.records import update_to_record

    keys, _ = _silo_keys(secret_context)
    start = time.perf_counter()
    state = {name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}
    flat, layout = flatten(state)
    update = encrypt_update(
        keys, flat, weight=weight, total=total, max_contributors=silos, layout=layout
    )
    record = update_to_record(update)
    return record, time.perf_counter() - start


def _answer_checks(
    msg: Message,
    context: Context,
    arrays: ArrayRecord,
    secret_context: str,
    reference: Mapping[str, torch.Tensor],
    server_round: int,
) -> tuple[ArrayRecord, float]:
    """The encrypted update with the silo's answers to the server's check requests (the
    contributions to an aggregate it refused last round), and the seconds they took."""
    if not any(name.startswith(HE_CHECK) for name in msg.content.array_records):
        return arrays, 0.0
    from ..crypto import InvalidUpdateError
    from ..crypto.records import answer_check_requests, check_requests_of

    last = context.state.config_records.get(REFUSED_ROUND)
    if last is None or last.get("round") != server_round - 1:
        log.warning("check requests ignored: this silo refused no global model last round")
        return arrays, 0.0
    try:
        requests = check_requests_of(msg.content)
    except InvalidUpdateError as err:
        log.warning("check requests ignored: %s", err)
        return arrays, 0.0
    keys, checker = _silo_keys(secret_context)
    return answer_check_requests(requests, arrays, keys=keys, checker=checker, reference=reference)


def _slowdown(setup: SiloSetup, context: Context) -> SlowdownSchedule:
    """node_config ``slowdown``, else the setup's ``slowdowns``, else the run config's."""
    return slowdown_schedule(
        context.node_config, listed=setup.slowdowns, run_config=context.run_config
    )


def secret_context_of(context: Context, default: str | None) -> str | None:
    """The node's secret CKKS context path: ``node_config["secret-context"]``, else
    ``default``; ``None`` (or empty): plaintext mode."""
    value = context.node_config.get("secret-context", default)
    return None if value in (None, "") else str(value)


def signing_key_of(context: Context, default: str | None) -> str | None:
    """The node's signing key path: ``node_config["signing-key"]``, else ``default``;
    ``None`` (or empty): unsigned replies."""
    value = context.node_config.get("signing-key", default)
    return None if value in (None, "") else str(value)


@lru_cache(maxsize=64)
def _signing_key(path: str, silo_id: str) -> Ed25519PrivateKey:
    file = Path(path)
    return load_signing_key(file / key_file_name(silo_id) if file.is_dir() else file)


def train_reply(
    msg: Message,
    *,
    arrays: ArrayRecord,
    metrics: MetricRecord,
    keys: RecordKeys,
    silo_id: str,
    signing_key: str | None = None,
    notes: Mapping[str, str] | None = None,
) -> Message:
    """The reply to a train message: the arrays, the metrics and the silo's id.

    Parameters
    ----------
    msg : Message
        The train message answered.
    arrays, metrics : ArrayRecord, MetricRecord
        The update and the contract's metrics.
    keys : RecordKeys
        Names of the contract's entries.
    silo_id : str
        The silo's id.
    signing_key : str | None (default: None)
        The silo's key file (or key folder): the reply is signed over the message's run,
        its ``server-round``, its message id, the silo id, the metrics and the arrays.
    notes : Mapping[str, str] | None (default: None)
        More entries of the ``silo`` ConfigRecord (``model-refused``).
    """
    silo = ConfigRecord({keys.silo_id: silo_id, **(notes or {})})
    if signing_key is not None:
        config = msg.content.config_records.get("config") or ConfigRecord()
        silo[keys.signature] = sign_reply(
            _signing_key(signing_key, silo_id),
            run_id=msg.metadata.run_id,
            server_round=read_int(config, keys.server_round, 1),
            instruction=msg.metadata.message_id or None,
            silo=silo_id,
            metrics=metrics,
            arrays=signed_arrays(arrays),
        )
    content = RecordDict({"arrays": arrays, "metrics": metrics, keys.silo_record: silo})
    return Message(content=content, reply_to=msg)


def _checked_model(
    state: dict[str, torch.Tensor], context: Context, max_ratio: float | None
) -> tuple[dict[str, torch.Tensor], str | None]:
    """The global model, or the silo's last model (with the reason) when it refuses it."""
    last_record = context.state.array_records.get(LAST_MODEL)
    last = None if last_record is None else last_record.to_torch_state_dict()
    reason = model_problem(
        [t.detach().cpu().numpy() for t in state.values()],
        None if last is None or max_ratio is None else [t.numpy() for t in last.values()],
        max_ratio=max_ratio or math.inf,
    )
    if reason is None:
        return state, None
    if last is None:
        raise ValueError(f"global model refused and no earlier model to keep: {reason}")
    log.warning("global model refused: %s; training from the last model kept", reason)
    return last, reason


def make_client_app(setup: SiloSetup) -> ClientApp:
    """Build the silo ClientApp.

    The silo reads ``partition-id`` (and optionally ``silo-id``, ``slowdown``,
    ``max-batch-size`` and ``secret-context``) from its node_config, trains exactly tau
    steps with the batch size in the train message, and replies with its parameters and the
    MetricRecord of the contract (:class:`~fl_lbbsp.contract.RecordKeys`), plus
    ``compute-time`` (the real, unemulated seconds), ``busy-time`` (real seconds in the
    handler, emulated wait included: the server's wall time beyond it is messaging),
    ``slowdown`` (the emulated factor k) and ``train-loss``.

    In encrypted mode (``setup.secret_context`` or ``node_config["secret-context"]``) the
    parameters go out as ``Enc((n_i / S) * u_i)`` with S the config's ``he-weight-total``,
    an update with NaN or inf is refused before encryption (the silo replies with an
    error), and ``he-time`` reports the seconds spent decrypting and encrypting, emulated
    like ``train-time`` (a k times slower machine also encrypts k times slower).
    """
    app = ClientApp()
    keys = setup.keys

    def _model_and_data(
        state: dict[str, torch.Tensor], context: Context
    ) -> tuple[torch.nn.Module, ArrayDataset]:
        torch.set_num_threads(setup.torch_threads)
        partition_id = int(context.node_config.get("partition-id", 0))
        data = silo_data(setup, partition_id)
        model = build_model(setup.model, input_shape=data.input_shape, num_classes=data.num_classes)
        model.load_state_dict(state)
        return model, data

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        started = time.perf_counter()
        config = msg.content.config_records["config"]
        instruction = RoundInstruction.from_config(config, keys)
        silo_id = silo_id_of(context.node_config, keys, node_id=context.node_id)
        secret_context = secret_context_of(context, setup.secret_context)
        state, he_time = _open_arrays(msg.content.array_records["arrays"], secret_context)
        state, refused = _checked_model(state, context, setup.max_model_ratio)
        model, data = _model_and_data(state, context)
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

        factor = _slowdown(setup, context).factor(instruction.server_round)
        # The emulated wait runs outside the slot, from the moment the silo queued for it.
        report = run_round(
            instruction,
            work,
            silo_id=silo_id,
            run_seed=setup.seed,
            keys=keys,
            emulation=Emulation(
                factor=factor,
                cost=None if setup.cost_model is None else CostModel.parse(setup.cost_model),
                wait=setup.emulate_wait,
            ),
            slot=compute_slot(setup.compute_lock, slots=setup.compute_slots),
            started=time.perf_counter(),
            max_batch_size=int(context.node_config.get(keys.max_batch_size, 0)),
        )
        extra: dict[str, Any] = {}
        if secret_context is None:
            arrays = ArrayRecord(model.state_dict())
        else:
            arrays, seconds = _encrypt_model(
                model,
                secret_context,
                weight=float(len(data)),
                total=instruction.he_weight_total or 1.0,
                silos=instruction.he_num_silos or 1,
            )
            arrays, checking = _answer_checks(
                msg, context, arrays, secret_context, state, instruction.server_round
            )
            extra[keys.he_time] = emulate_slowdown(
                he_time + seconds + checking, factor, wait=setup.emulate_wait
            )
        metrics = MetricRecord(
            {**report.metrics, BUSY_TIME: time.perf_counter() - started, **extra}
        )
        context.state[LAST_MODEL] = ArrayRecord(model.state_dict())
        notes = dict(report.notes)
        if refused is not None:
            notes[MODEL_REFUSED] = refused
            context.state[REFUSED_ROUND] = ConfigRecord({"round": instruction.server_round})
        return train_reply(
            msg,
            arrays=arrays,
            metrics=metrics,
            keys=keys,
            silo_id=silo_id,
            signing_key=signing_key_of(context, setup.signing_key),
            notes=notes or None,
        )

    @app.evaluate()
    def evaluate_local(msg: Message, context: Context) -> Message:
        state, _ = _open_arrays(
            msg.content.array_records["arrays"], secret_context_of(context, setup.secret_context)
        )
        model, data = _model_and_data(state, context)
        if setup.evaluate_on == "test":
            data = test_shard(setup, int(context.node_config.get("partition-id", 0)))
        loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
        metrics = MetricRecord(
            {keys.num_examples: len(data), EVAL_LOSS: loss, EVAL_ACCURACY: accuracy}
        )
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app
