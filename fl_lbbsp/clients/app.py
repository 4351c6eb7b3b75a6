"""The silo side as a Flower ClientApp: train with the batch size the server sends,
time the compute, report psutil metrics and, if asked, emulate a slower machine.

Every silo resolves what it needs once, from the federation's :class:`SiloSetup` and
its node config (:class:`SiloNode`: its partition, slowdown, keys), and answers every
message from that. With a secret CKKS context the silo runs in encrypted mode: it
decrypts the global model, trains, multiplies its parameters by ``n_i / S`` and encrypts them (see
:mod:`fl_lbbsp.strategies.encrypted`), reporting the time spent on it as ``he-time``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..contract import (
    ACCEPTED_NORMS,
    BUSY_TIME,
    COMPUTE_END,
    COMPUTE_START,
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
from ..datasets import ArrayDataset
from ..instruction import RoundInstruction, silo_id_of
from ..security.identity import key_file_name, load_signing_key, sign_reply, signed_arrays
from ..security.screening import model_norm, model_problem
from .emulated import Emulation, run_emulated_round, slowdown_schedule
from .emulation import CostModel, SlowdownSchedule, compute_slot, emulate_slowdown
from .silo_setup import SiloSetup, model_for, silo_data, test_data, test_shard
from .silo_task import training_work
from .trainer import evaluate

if TYPE_CHECKING:
    from ..crypto import CKKSKeys, UpdateChecker

__all__ = [
    "SiloApp",
    "SiloNode",
    "SiloSetup",
    "decrypt_arrays",
    "encrypt_arrays",
    "make_client_app",
    "node_file",
    "resolve_node",
    "silo_data",
    "test_data",
    "test_shard",
]

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _silo_keys(path: str) -> tuple[CKKSKeys, UpdateChecker]:
    from ..crypto import UpdateChecker, load_silo_keys

    keys = load_silo_keys(path)
    return keys, UpdateChecker(keys)


def decrypt_arrays(record: ArrayRecord, secret_context: str) -> tuple[dict[str, np.ndarray], float]:
    """The encrypted update in ``record``, checked, decrypted and divided by its weight, as
    named arrays, and the seconds it took."""
    from ..crypto import decrypt_update, unflatten
    from ..crypto.records import update_from_record

    keys, checker = _silo_keys(secret_context)
    start = time.perf_counter()
    update = update_from_record(record)
    arrays = unflatten(decrypt_update(keys, update, checker=checker), update.layout)
    return arrays, time.perf_counter() - start


def encrypt_arrays(
    arrays: Mapping[str, np.ndarray], secret_context: str
) -> tuple[ArrayRecord, float]:
    """``Enc(arrays)`` flattened and unweighted (the server applies the weight) as an
    ArrayRecord, and the seconds it took."""
    from ..crypto import encrypt_update, flatten
    from ..crypto.records import update_to_record

    keys, _ = _silo_keys(secret_context)
    start = time.perf_counter()
    flat, layout = flatten(arrays)
    record = update_to_record(encrypt_update(keys, flat, layout=layout))
    return record, time.perf_counter() - start


def _open_arrays(
    record: ArrayRecord, secret_context: str | None
) -> tuple[dict[str, torch.Tensor], float]:
    """The global model as a state dict, decrypted if it came encrypted, and the seconds
    decryption took."""
    if not is_encrypted(record):
        return record.to_torch_state_dict(), 0.0
    if secret_context is None:
        raise ValueError("received an encrypted model but no secret context is configured")
    arrays, seconds = decrypt_arrays(record, secret_context)
    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in arrays.items()}, seconds


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


def node_file(context: Context, key: str, default: str | None) -> str | None:
    """The node's file ``node_config[key]`` (``secret-context``, ``signing-key``), else
    ``default``; ``None`` (or empty): none (plaintext updates, unsigned replies)."""
    value = context.node_config.get(key, default)
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
    signing_key: str | Ed25519PrivateKey | None = None,
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
    signing_key : str | Ed25519PrivateKey | None (default: None)
        The silo's key, or its key file (or key folder): the reply is signed over the message's run,
        its ``server-round``, its message id, the silo id, the metrics and the arrays.
    notes : Mapping[str, str] | None (default: None)
        More entries of the ``silo`` ConfigRecord (``model-refused``).
    """
    silo = ConfigRecord({keys.silo_id: silo_id, **(notes or {})})
    if signing_key is not None:
        config = msg.content.config_records.get("config") or ConfigRecord()
        key = signing_key if isinstance(signing_key, Ed25519PrivateKey) else None
        silo[keys.signature] = sign_reply(
            key or _signing_key(str(signing_key), silo_id),
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
    history = context.state.config_records.get(ACCEPTED_NORMS)
    norms = [] if history is None else [float(n) for n in history.get("norms", [])]  # type: ignore[union-attr]
    arrays = [t.detach().cpu().numpy() for t in state.values()]
    reason = model_problem(
        arrays,
        None if last is None or max_ratio is None else [t.numpy() for t in last.values()],
        max_ratio=max_ratio or math.inf,
        accepted=norms,
    )
    if reason is None:  # the last 8 accepted models' norms: a rollback sends one again
        norms = [*norms, model_norm(arrays)][-8:]
        context.state[ACCEPTED_NORMS] = ConfigRecord({"norms": norms})
        return state, None
    if last is None:
        raise ValueError(f"global model refused and no earlier model to keep: {reason}")
    log.warning("global model refused: %s; training from the last model kept", reason)
    return last, reason


@dataclass(frozen=True, kw_only=True)
class SiloNode:
    """What one silo resolves once, from the federation's setup and its node config, and
    answers every message with (:func:`resolve_node`).

    Attributes
    ----------
    partition_id : int
        Its partition of the training data (node config ``partition-id``).
    silo_id : str
        Its silo id (node config ``silo-id``, else the partition id).
    schedule : SlowdownSchedule
        Its emulated slowdown over the rounds (node config ``slowdown``, else the
        setup's, else the run config's).
    secret_context : str | None
        Its secret CKKS context (node config ``secret-context``, else the setup's);
        ``None``: plaintext updates.
    signing_key : Ed25519PrivateKey | None
        Its signing key, loaded (node config ``signing-key``, else the setup's);
        ``None``: unsigned replies.
    max_batch_size : int
        Node config ``max-batch-size`` (0: none).
    """

    partition_id: int
    silo_id: str
    schedule: SlowdownSchedule
    secret_context: str | None
    signing_key: Ed25519PrivateKey | None
    max_batch_size: int


def resolve_node(setup: SiloSetup, context: Context) -> SiloNode:
    """The silo of ``context``'s node, resolved from ``setup`` and its node config.

    Raises
    ------
    IdentityError
        A signing key that cannot be loaded.
    ValueError
        A slowdown that is not one.
    """
    node_config = context.node_config
    partition_id = int(node_config.get("partition-id", 0))
    silo_id = silo_id_of(node_config, setup.keys, node_id=context.node_id)
    signing_key = node_file(context, "signing-key", setup.signing_key)
    return SiloNode(
        partition_id=partition_id,
        silo_id=silo_id,
        schedule=_slowdown(setup, context),
        secret_context=node_file(context, "secret-context", setup.secret_context),
        signing_key=None if signing_key is None else _signing_key(signing_key, silo_id),
        max_batch_size=int(node_config.get(setup.keys.max_batch_size, 0)),
    )


class SiloApp:
    """The bundled silo's message handlers over a :class:`SiloSetup`; each node is
    resolved once (:func:`resolve_node`), at its first message.

    Parameters
    ----------
    setup : SiloSetup
        How every silo of the federation finds its data, model and emulated speed.
    """

    def __init__(self, setup: SiloSetup) -> None:
        self.setup = setup
        self._nodes: dict[tuple[int, tuple[tuple[str, str], ...]], SiloNode] = {}

    def node(self, context: Context) -> SiloNode:
        """The silo of ``context``'s node, resolved at its first message."""
        key = (context.node_id, tuple(sorted((k, str(v)) for k, v in context.node_config.items())))
        if key not in self._nodes:
            self._nodes[key] = resolve_node(self.setup, context)
        return self._nodes[key]

    def _model(self, state: dict[str, torch.Tensor], data: ArrayDataset) -> torch.nn.Module:
        torch.set_num_threads(self.setup.torch_threads)
        return model_for(self.setup.model, data, state)

    def train(self, msg: Message, context: Context) -> Message:
        """Train tau steps with the message's batch size and reply with the update."""
        started = time.perf_counter()
        setup, node, keys = self.setup, self.node(context), self.setup.keys
        instruction = RoundInstruction.from_config(msg.content.config_records["config"], keys)
        state, he_time = _open_arrays(msg.content.array_records["arrays"], node.secret_context)
        state, refused = _checked_model(state, context, setup.max_model_ratio)
        # The data source and its partitions are loaded once per process (cached); a node
        # keeps no copy of its partition between messages.
        data = silo_data(setup, node.partition_id)
        model = self._model(state, data)
        factor = node.schedule.factor(instruction.server_round)
        # The emulated wait runs outside the slot, from the moment the silo queued for it.
        report = run_emulated_round(
            instruction,
            training_work(model, data),
            silo_id=node.silo_id,
            run_seed=setup.seed,
            keys=keys,
            emulation=Emulation(
                factor=factor,
                cost=None if setup.cost_model is None else CostModel.parse(setup.cost_model),
                wait=setup.emulate_wait,
            ),
            slot=compute_slot(setup.compute_lock, slots=setup.compute_slots),
            started=time.perf_counter(),
            max_batch_size=node.max_batch_size,
        )
        extra: dict[str, Any] = {}
        if node.secret_context is None:
            arrays = ArrayRecord(model.state_dict())
        else:
            state_arrays = {n: t.detach().cpu().numpy() for n, t in model.state_dict().items()}
            arrays, seconds = encrypt_arrays(state_arrays, node.secret_context)
            arrays, checking = _answer_checks(
                msg, context, arrays, node.secret_context, state, instruction.server_round
            )
            extra[keys.he_time] = emulate_slowdown(
                he_time + seconds + checking, factor, wait=setup.emulate_wait
            )
            # the reply's interval spans the encryption too, as its claim does: the server
            # checks train-time + he-time against it (at least the time claimed, as an
            # emulated round's: decryption ran before any queue for the compute slot)
            end = max(time.time(), report.metrics[COMPUTE_END])
            claimed = report.reported_time + extra[keys.he_time]
            extra[COMPUTE_START] = min(report.metrics[COMPUTE_START], end - claimed)
            extra[COMPUTE_END] = end
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
            silo_id=node.silo_id,
            signing_key=node.signing_key,
            notes=notes or None,
        )

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Evaluate the global model on the silo's evaluation data."""
        node, keys = self.node(context), self.setup.keys
        state, _ = _open_arrays(msg.content.array_records["arrays"], node.secret_context)
        data = (
            silo_data(self.setup, node.partition_id)
            if self.setup.evaluate_on == "train"
            else test_shard(self.setup, node.partition_id)
        )
        model = self._model(state, data)
        loss, accuracy = evaluate(model, torch.from_numpy(data.x), torch.from_numpy(data.y))
        metrics = MetricRecord(
            {keys.num_examples: len(data), EVAL_LOSS: loss, EVAL_ACCURACY: accuracy}
        )
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def make_client_app(setup: SiloSetup) -> ClientApp:
    """Build the silo ClientApp.

    The silo reads ``partition-id`` (and optionally ``silo-id``, ``slowdown``,
    ``max-batch-size``, ``secret-context`` and ``signing-key``) from its node_config, once
    (:class:`SiloNode`), trains exactly tau steps with the batch size in the train message,
    and replies with its parameters and the MetricRecord of the contract
    (:class:`~fl_lbbsp.contract.RecordKeys`), plus ``compute-time`` (the real, unemulated
    seconds), ``busy-time`` (real seconds in the handler, emulated wait included: the
    server's wall time beyond it is messaging), ``slowdown`` (the emulated factor k) and
    ``train-loss``.

    In encrypted mode (``setup.secret_context`` or ``node_config["secret-context"]``) the
    parameters go out as ``Enc(u_i)``, unweighted (the server multiplies each by the
    silo's capped ``num-examples`` and adds), an update with NaN or inf is refused before
    encryption (the silo replies with an error), and ``he-time`` reports the seconds spent
    decrypting and encrypting, emulated like ``train-time`` (a k times slower machine also
    encrypts k times slower).
    """
    silo = SiloApp(setup)
    app = ClientApp()
    app.train()(silo.train)
    app.evaluate()(silo.evaluate)
    return app
