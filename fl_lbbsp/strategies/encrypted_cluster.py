"""Cluster-mode LB-BSP over CKKS-encrypted gradients: the parameter server only adds.

Every worker keeps a replica of the model (parameters and momentum buffers) in its node
state. In iteration k it computes the gradient ``g_i`` of the mean loss over its ``x_i``
samples at version k-1 of the model, multiplies it by ``w_i = x_i / X`` (X: the sum of the
batch sizes the server sent) and replies with ``Enc(w_i g_i)``. The server checks the
replies as in :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg` and adds them:
``sum_i Enc(w_i g_i)`` with the plaintext ``sum_i w_i`` is aggregate k. With the next
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
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..contract import INITIAL_MODEL, UPDATE_PREFIX
from ..crypto.records import is_encrypted
from .cluster import LBBSPCluster
from .config import EncryptedClusterConfig
from .encrypted import EncryptedLBBSPFedAvg
from .validation import InvalidReplyError

__all__ = ["EncryptedLBBSPCluster"]

log = logging.getLogger("fl_lbbsp")


class EncryptedLBBSPCluster(EncryptedLBBSPFedAvg, LBBSPCluster):
    """Parameter-server LB-BSP whose server adds encrypted gradients and never reads them.

    Workers run :func:`fl_lbbsp.clients.cluster.make_worker_app` with a secret context
    (``WorkerSetup(secret_context=...)``). The train message of iteration k carries the
    worker's ``batch-size``, ``batch-offset``, ``lr``, ``momentum``, the weight total S
    (``he-weight-total``, the sum of the batch sizes sent), ``he-num-silos`` and
    ``model-version`` (k-1), with the aggregates the worker still has to apply (and the
    initial model if it holds no replica). A reply computed at another model version is
    rejected. Evaluation messages carry the same and the workers evaluate their replica
    on their share of the test split.

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
    weight_tolerance : float (default: 1e-6)
        Relative tolerance when checking a reply's weight against ``batch-size / S``.
    **kwargs :
        Keyword arguments of :class:`~fl_lbbsp.strategies.LBBSPCluster`
        (``initial_batch_size``, ``lr``, ``momentum``, ``allocator``, ...,
        ``checkpoint_dir``); ``aggregation`` must be ``"weighted"``. A checkpoint also
        holds the initial model, the kept aggregates, the model version and every
        worker's version, so that workers that keep running while the server restarts
        continue from their replicas.

    Raises
    ------
    pydantic.ValidationError
        On a bad setting; the message names the keyword and the value.
    """

    def __init__(
        self,
        *,
        max_history: int = 32,
        evaluate_every: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.replica_config = EncryptedClusterConfig(
            max_history=max_history,
            evaluate_every=evaluate_every,
            aggregation=kwargs.get("aggregation", "weighted"),
        )
        super().__init__(**kwargs)
        self.max_history = self.replica_config.max_history
        self.evaluate_every = self.replica_config.evaluate_every
        self.fraction_evaluate = 0.0 if evaluate_every is None else 1.0
        self.version = 0
        """Aggregates produced so far: the workers' model version."""
        self._initial: ArrayRecord | None = None
        self._aggregates: dict[int, ArrayRecord] = {}
        self._node_version: dict[int, int] = {}

    def weight_total(self, silos: Iterable[str]) -> float:
        """S = X, the sum of the batch sizes sent this iteration: ``sum_i w_i = 1`` when
        every worker replies."""
        return float(sum(self._sent.values()))

    # ------------------------------------------------------------------ training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """LB-BSP's per-worker configs, with each worker's missing aggregates."""
        if self._initial is None:
            if is_encrypted(arrays):
                raise ValueError("the initial model must be plaintext (the server creates it)")
            self._initial = arrays
        configs = {
            msg.metadata.dst_node_id: msg.content.config_records[self.configrecord_key]
            for msg in super().configure_train(server_round, arrays, config, grid)
        }
        self._messages = self._with_model(configs, MessageType.TRAIN)
        return self._messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check and add the encrypted gradients; note every worker's model version."""
        replies = list(replies)
        self._note_versions(replies)
        return super().aggregate_train(server_round, replies)

    def _check_arrays(self, msg: Message) -> None:
        version = self._reported_version(msg)
        if version != self.version:
            raise InvalidReplyError(
                f"gradient computed at model version {version!r}, expected {self.version}"
            )
        super()._check_arrays(msg)

    def _combine(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """``sum_i Enc(w_i g_i)`` and ``sum_i w_i``: the next aggregate the workers apply."""
        aggregate = self._average_arrays(contents)
        self.version += 1
        self._aggregates[self.version] = aggregate
        for old in [v for v in self._aggregates if v <= self.version - self.max_history]:
            del self._aggregates[old]
        return aggregate

    # ---------------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every ``evaluate_every`` iterations: each worker evaluates its replica."""
        if self.evaluate_every is None or server_round % self.evaluate_every:
            return []
        configs = {}
        for node in sorted(self._node_version):
            configs[node] = ConfigRecord(dict(config))
            configs[node][self.keys.server_round] = server_round
            configs[node][self.keys.lr] = self.config.lr
        return self._with_model(configs, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the workers' evaluation metrics; note their model versions."""
        replies = list(replies)
        self._note_versions(replies)
        return super().aggregate_evaluate(server_round, replies)

    # ------------------------------------------------------------------- helpers
    def model_records(self, node_id: int) -> dict[str, ArrayRecord] | None:
        """What ``node_id`` needs to reach the current version: the aggregates after the
        last version it reported (and the initial model if it reported none), or ``None``
        when the server no longer holds them."""
        known = self._node_version.get(node_id)
        records: dict[str, ArrayRecord] = {}
        if known is None:
            if self._initial is None:
                return None
            records[INITIAL_MODEL] = self._initial
            known = 0
        for version in range(known + 1, self.version + 1):
            if version not in self._aggregates:
                return None
            records[f"{UPDATE_PREFIX}{version}"] = self._aggregates[version]
        return records

    def _with_model(self, configs: dict[int, ConfigRecord], message_type: str) -> list[Message]:
        """One message per node: its config (plus the momentum and target model version)
        and the records that bring its replica there; nodes too far behind are left out."""
        messages = []
        for node, node_config in configs.items():
            records = self.model_records(node)
            if records is None:
                log.warning(
                    "[%s] worker %s left out: it is at model version %s and the server keeps "
                    "only the last %d aggregates (now at %d); restart it from a checkpoint",
                    self.scheme,
                    self.silo_id(node),
                    self._node_version.get(node, "none"),
                    self.max_history,
                    self.version,
                )
                continue
            node_config[self.keys.momentum] = self.optimizer.momentum
            node_config[self.keys.model_version] = self.version
            content = RecordDict({self.configrecord_key: node_config, **records})
            messages.append(Message(content=content, message_type=message_type, dst_node_id=node))
        return messages

    # -------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The parent strategies' state plus the model version, every worker's version,
        the initial model and the kept aggregates (records ``initial-model`` and
        ``aggregate-<v>``)."""
        state, records = super().checkpoint_state()
        state["version"] = self.version
        state["node_version"] = {str(node): v for node, v in self._node_version.items()}
        if self._initial is not None:
            records[INITIAL_MODEL] = self._initial
        for version, aggregate in self._aggregates.items():
            records[f"{UPDATE_PREFIX}{version}"] = aggregate
        return state, records

    def load_checkpoint_state(self, state: dict[str, Any], records: dict[str, ArrayRecord]) -> None:
        """Restore :meth:`checkpoint_state`."""
        super().load_checkpoint_state(state, records)
        self.version = int(state["version"])
        self._node_version = {int(node): int(v) for node, v in state["node_version"].items()}
        self._initial = records.get(INITIAL_MODEL)
        self._aggregates = {
            int(name.removeprefix(UPDATE_PREFIX)): record
            for name, record in records.items()
            if name.startswith(UPDATE_PREFIX)
        }

    def _reported_version(self, msg: Message) -> object:
        metrics = list(msg.content.metric_records.values())
        return metrics[0].get(self.keys.model_version) if len(metrics) == 1 else None

    def _note_versions(self, replies: list[Message]) -> None:
        """A worker that replied with an error may have lost its replica: resend it all;
        one that reports the current version holds it."""
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                self._node_version.pop(node, None)
                continue
            if self._reported_version(msg) == self.version:
                self._node_version[node] = self.version
