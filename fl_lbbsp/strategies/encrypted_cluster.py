"""Cluster-mode LB-BSP over CKKS-encrypted gradients: the parameter server weighs and adds.

Every worker keeps a replica of the model (parameters and momentum buffers) in its node
state. In iteration k it computes the gradient ``g_i`` of the mean loss over its ``x_i``
samples at version k-1 of the model and replies with ``Enc(g_i)``. The server checks the
replies as in :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`, multiplies each
by its batch size ``x_i`` and adds them: ``sum_i x_i Enc(g_i)`` with the plaintext
``sum_i x_i`` is aggregate k. With the next
iteration's instructions every worker receives the aggregates it has not applied yet,
decrypts them, divides by their weight sum (``sum_i x_i g_i / sum_i x_i``: the weighted
gradient of Sec. 3.4 over the workers that replied) and takes the same SGD step the
plaintext parameter server would take. Decryption is deterministic, so all replicas stay
identical. Apart from the initial model it creates, the server never holds plaintext
parameters or gradients; evaluation is federated.

A worker that missed iterations catches up from the aggregates the server keeps (the
last ``max_history``); one that lost its state (restarted) gets the initial model and
every aggregate since, while the server still holds them all.

References: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.4 and Alg. 3; Cheon et al., ASIACRYPT 2017 (CKKS).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..contract import INITIAL_MODEL, UPDATE_PREFIX, InvalidReplyError
from ..core.round.state import RoundState
from ..crypto import CKKSKeys, ParsedUpdate
from ..crypto.records import is_encrypted
from .config import EncryptedClusterConfig, ParameterServerConfig, parameter_server_keywords
from .encrypted import EncryptedSum, log_federated_evaluation, log_keys, server_keys
from .fedavg import EngineStrategy

__all__ = ["EncryptedLBBSPCluster", "ReplicaLog"]

log = logging.getLogger("fl_lbbsp")


class ReplicaLog(EncryptedSum):
    """The encrypted parameter server's aggregates, one per model version.

    An :class:`~fl_lbbsp.strategies.encrypted.EncryptedSum` whose every result is the
    next model version; it keeps the initial model, the last ``max_history`` aggregates
    and each worker's version, so that every worker gets what brings its replica up to date.

    Parameters
    ----------
    he_keys, keys :
        As in :class:`~fl_lbbsp.strategies.encrypted.EncryptedSum`.
    max_history : int
        Aggregates kept for workers that fall behind.
    momentum : float
        The SGD momentum the workers apply (a checkpoint setting).
    """

    def __init__(
        self,
        he_keys: CKKSKeys,
        *,
        keys: Any,
        max_history: int,
        momentum: float,
    ) -> None:
        super().__init__(he_keys, keys=keys)
        self.max_history = max_history
        self.momentum = momentum
        self.version = 0
        """Aggregates produced so far: the workers' model version."""
        self.initial: ArrayRecord | None = None
        self.aggregates: dict[int, ArrayRecord] = {}
        self.node_version: dict[int, int] = {}

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Keep the initial model (plaintext, the server's own) the first time."""
        if self.initial is None:
            if is_encrypted(arrays):
                raise ValueError("the initial model must be plaintext (the server creates it)")
            self.initial = arrays
        super().begin(arrays, state)

    def parse(
        self, record: ArrayRecord, metrics: Mapping[str, Any], state: RoundState
    ) -> ParsedUpdate:
        """A gradient computed at the current version, checked as an encrypted update."""
        version = metrics.get(self.keys.model_version)
        if version != self.version:
            raise InvalidReplyError(
                f"gradient computed at model version {version!r}, expected {self.version}"
            )
        return super().parse(record, metrics, state)

    def result(self) -> ArrayRecord:
        """``sum_i x_i Enc(g_i)`` and ``sum_i x_i``: aggregate ``version + 1``."""
        aggregate = super().result()
        self.version += 1
        self.aggregates[self.version] = aggregate
        for old in [v for v in self.aggregates if v <= self.version - self.max_history]:
            del self.aggregates[old]
        return aggregate

    def records_for(self, node: int) -> dict[str, ArrayRecord] | None:
        """What ``node`` needs to reach the current version: the aggregates after the
        last version it reported (and the initial model if it reported none), or ``None``
        when the server no longer holds them."""
        known = self.node_version.get(node)
        records: dict[str, ArrayRecord] = {}
        if known is None:
            if self.initial is None:
                return None
            records[INITIAL_MODEL] = self.initial
            known = 0
        for version in range(known + 1, self.version + 1):
            if version not in self.aggregates:
                return None
            records[f"{UPDATE_PREFIX}{version}"] = self.aggregates[version]
        return records

    def note_versions(self, replies: Iterable[Message]) -> None:
        """A worker that replied with an error may have lost its replica: resend it all;
        one that reports the current version holds it."""
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                self.node_version.pop(node, None)
                continue
            metrics = list(msg.content.metric_records.values())
            reported = metrics[0].get(self.keys.model_version) if len(metrics) == 1 else None
            if reported == self.version:
                self.node_version[node] = self.version

    def settings(self) -> dict[str, Any]:
        """The fingerprint and the parameter server's settings."""
        return {
            **super().settings(),
            "parameter_server": {"momentum": self.momentum, "aggregation": "weighted"},
        }

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The model version, every worker's version, the initial model and the kept
        aggregates (records ``initial-model`` and ``aggregate-<v>``)."""
        state, records = super().state_dict()
        state["version"] = self.version
        state["node_version"] = {str(node): v for node, v in self.node_version.items()}
        if self.initial is not None:
            records[INITIAL_MODEL] = self.initial
        for version, aggregate in self.aggregates.items():
            records[f"{UPDATE_PREFIX}{version}"] = aggregate
        return state, records

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state, records)
        self.version = int(state["version"])
        self.node_version = {int(node): int(v) for node, v in state["node_version"].items()}
        self.initial = records.get(INITIAL_MODEL)
        self.aggregates = {
            int(name.removeprefix(UPDATE_PREFIX)): record
            for name, record in records.items()
            if name.startswith(UPDATE_PREFIX)
        }


class EncryptedLBBSPCluster(EngineStrategy):
    """Parameter-server LB-BSP whose server adds encrypted gradients and never reads them.

    Workers run :func:`fl_lbbsp.clients.cluster.make_worker_app` with a secret context.
    The train message of iteration k carries the worker's instruction, ``momentum`` and
    ``model-version`` (k-1) with the aggregates its replica still lacks; a reply computed
    at another version is rejected. Evaluation messages carry the same.

    Parameters
    ----------
    public_context : str | Path | CKKSKeys
        The server's public context (``public.ckks``), as for
        :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`.
    fingerprint : str | None (default: None)
        Expected key fingerprint.
    max_history : int (default: 32)
        Aggregates the server keeps for workers that fall behind. A worker further behind
        (or one that lost its replica once aggregate 1 is gone) is left out with a
        warning until it is restarted from a checkpoint.
    evaluate_every : int | None (default: None)
        Federated evaluation after every this many iterations (``None``: never).
    initial_batch_size, lr, momentum :
        As in :class:`~fl_lbbsp.strategies.LBBSPCluster`.
    aggregation : {"weighted"} (default: "weighted")
        Encrypted gradients are weighted by batch size only.
    **kwargs :
        Keyword arguments of :class:`~fl_lbbsp.strategies.LBBSPFedAvg`. A checkpoint also
        holds the initial model, the kept aggregates and every worker's version, so that
        workers that keep running while the server restarts continue from their replicas.

    Raises
    ------
    pydantic.ValidationError
        On a bad ``momentum``, ``aggregation``, ``max_history`` or ``evaluate_every``.
    InvalidSettingError
        (a ``ValueError``) On a bad setting among ``**kwargs``, naming it and its value.
    ValueError
        On a ``public_context`` the server must not use, as for
        :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`.
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        lr: float,
        public_context: str | Path | CKKSKeys,
        fingerprint: str | None = None,
        momentum: float = 0.0,
        aggregation: Literal["weighted"] = "weighted",
        max_history: int = 32,
        evaluate_every: int | None = None,
        **kwargs: Any,
    ) -> None:
        checked = EncryptedClusterConfig(
            max_history=max_history, evaluate_every=evaluate_every, aggregation=aggregation
        )
        self.ps_config = ParameterServerConfig(momentum=momentum, aggregation=aggregation)
        super().__init__(
            **parameter_server_keywords(
                initial_batch_size=initial_batch_size, lr=lr, evaluate=evaluate_every is not None
            ),
            **kwargs,
        )
        self.he_keys = server_keys(public_context, fingerprint)
        self.evaluate_every = checked.evaluate_every
        self.replicas = ReplicaLog(
            self.he_keys,
            keys=self.keys,
            max_history=checked.max_history,
            momentum=self.ps_config.momentum,
        )
        self.updates = self.replicas

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` when balancing, ``"bsp"`` otherwise."""
        return "lbbsp" if self.config.balance else "bsp"

    def summary(self) -> None:
        """Log the encryption settings, then LB-BSP's and FedAvg's."""
        log_keys(self.he_keys)
        super().summary()

    def train_messages(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """Each worker's instruction with the aggregates its replica still lacks."""
        configs = {int(node): self.node_config(state, node, config) for node in state.instructions}
        return self._with_model(configs, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check and add the encrypted gradients; note every worker's model version."""
        replies = list(replies)
        self.replicas.note_versions(replies)
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every ``evaluate_every`` iterations: each worker evaluates its replica."""
        if self.evaluate_every is None or server_round % self.evaluate_every:
            return []
        configs = {}
        for node in sorted(self.replicas.node_version):
            configs[node] = ConfigRecord(dict(config))
            configs[node][self.keys.server_round] = server_round
            configs[node][self.keys.lr] = self.config.lr
        return self._with_model(configs, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the workers' evaluation metrics; note their model versions."""
        replies = list(replies)
        self.replicas.note_versions(replies)
        metrics = super().aggregate_evaluate(server_round, replies)
        log_federated_evaluation(self, server_round, metrics)
        return metrics

    def _with_model(self, configs: dict[int, ConfigRecord], message_type: str) -> list[Message]:
        """One message per node: its config (plus the momentum and target model version)
        and the records that bring its replica there; nodes too far behind are left out."""
        messages = []
        for node, node_config in configs.items():
            records = self.replicas.records_for(node)
            if records is None:
                log.warning(
                    "[%s] worker %s left out: it is at model version %s and the server keeps "
                    "only the last %d aggregates (now at %d); restart it from a checkpoint",
                    self.scheme,
                    self.silo_id(node),
                    self.replicas.node_version.get(node, "none"),
                    self.replicas.max_history,
                    self.replicas.version,
                )
                continue
            node_config[self.keys.momentum] = self.ps_config.momentum
            node_config[self.keys.model_version] = self.replicas.version
            content = RecordDict({self.configrecord_key: node_config, **records})
            messages.append(Message(content=content, message_type=message_type, dst_node_id=node))
        return messages
