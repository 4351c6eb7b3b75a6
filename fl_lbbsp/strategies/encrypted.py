"""LB-BSP FedAvg over CKKS-encrypted updates: the server adds ciphertexts it cannot read.

Each silo multiplies its parameters after local training ``u_i`` by ``w_i = n_i / S``
(``n_i``: its local dataset size, ``S``: the total this strategy announces for the round),
encrypts them under the federation's CKKS key and replies with the ciphertexts, the key
fingerprint and its plaintext ``w_i``. The server checks every reply (fingerprint, chunk
count, sizes, digests, ciphertext structure, ``w_i = n_i / S``, and the metric checks of
every strategy), leaves out any that fails with the reason logged, adds the rest and sends
back ``sum_i Enc(w_i u_i)`` with the plaintext ``sum_i w_i``; silos decrypt and divide.
Apart from the initial model it creates itself, the server never holds plaintext
parameters, and evaluation is federated (silos decrypt and evaluate). Balancing is
unchanged: batch sizes still follow the silos' reported ``train-time``, and their
``he-time`` is the linear allocator's fixed cost.

References: Chen et al., IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL); Cheon et al.,
ASIACRYPT 2017 (CKKS); Zhang et al., "BatchCrypt", USENIX ATC 2020.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..crypto import (
    CKKSKeys,
    InvalidUpdateError,
    ParsedUpdate,
    TensorSpec,
    UpdateChecker,
    aggregate_updates,
    load_server_keys,
)
from ..crypto.records import is_encrypted, update_from_record, update_to_record
from .config import EncryptionConfig
from .fedavg import LBBSPFedAvg
from .validation import InvalidReplyError

__all__ = ["EncryptedLBBSPFedAvg"]

log = logging.getLogger("fl_lbbsp")


class EncryptedLBBSPFedAvg(LBBSPFedAvg):
    """:class:`LBBSPFedAvg` whose silos ship CKKS-encrypted, pre-weighted updates.

    Parameters
    ----------
    public_context : str | Path | CKKSKeys
        The server's public context: the ``public.ckks`` file from ``fl-lbbsp keys
        generate``, its folder, or loaded keys. Keys holding the secret key are refused.
    fingerprint : str | None (default: None)
        Expected key fingerprint (``fingerprint.txt``); checked against the context.
    initial_weight_total : float | None (default: None)
        The total S announced while none of the sampled silos has reported its
        ``num-examples`` yet (round 1). ``None``: the number of sampled silos. Later rounds
        announce the sum of the sampled silos' last ``num-examples`` (a silo not yet heard
        from counts at the mean of the others), so that sum_i w_i is about 1.
    weight_tolerance : float (default: 1e-6)
        Relative tolerance when checking a reply's weight against ``num-examples / S``.
    **kwargs :
        Keyword arguments of :class:`LBBSPFedAvg` (``initial_batch_size``,
        ``local_steps``, ``lr``, ..., ``checkpoint_dir``). ``fraction_evaluate`` should
        stay above 0: the server cannot evaluate the model itself, and an ``evaluate_fn``
        passed to :meth:`start` receives the encrypted record. A checkpoint holds the
        encrypted global model and the silos' last dataset sizes, and is resumed only
        with the same key (fingerprint).

    Raises
    ------
    pydantic.ValidationError
        On a bad setting; the message names the keyword and the value.
    """

    def __init__(
        self,
        *,
        public_context: str | Path | CKKSKeys,
        fingerprint: str | None = None,
        initial_weight_total: float | None = None,
        weight_tolerance: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        self.encryption_config = EncryptionConfig(
            initial_weight_total=initial_weight_total, weight_tolerance=weight_tolerance
        )
        super().__init__(**kwargs)
        if isinstance(public_context, CKKSKeys):
            if public_context.is_private:
                raise ValueError(
                    "the server must not hold the secret key: pass the public context "
                    "(CKKSKeys.public() or public.ckks)"
                )
            if fingerprint is not None and fingerprint.strip() != public_context.fingerprint:
                raise ValueError("public_context does not match the expected fingerprint")
            self.he_keys = public_context
        else:
            self.he_keys = load_server_keys(public_context, fingerprint=fingerprint)
        self.initial_weight_total = self.encryption_config.initial_weight_total
        self.weight_tolerance = self.encryption_config.weight_tolerance
        self._num_examples: dict[str, float] = {}
        self._checker: UpdateChecker | None = None
        self._weight_total = 1.0
        self._parsed: dict[int, ParsedUpdate] = {}

    def summary(self) -> None:
        """Log the encryption settings, then LB-BSP's and FedAvg's."""
        c = self.he_keys.config
        log.info(
            "CKKS: N=%d, primes %s bits, scale 2^%d, key %s...; the server only adds",
            c.poly_modulus_degree,
            list(c.coeff_mod_bit_sizes),
            c.scale_bits,
            self.he_keys.fingerprint[:16],
        )
        super().summary()

    # ---------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """LB-BSP's per-node configs plus the weight total S and the number of silos."""
        self._learn_layout(arrays)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        silos = [self.silo_id(msg.metadata.dst_node_id) for msg in messages]
        self._weight_total = self.weight_total(silos)
        for msg in messages:
            node_config = msg.content.config_records[self.configrecord_key]
            node_config[self.keys.he_weight_total] = self._weight_total
            node_config[self.keys.he_num_silos] = len(messages)
        return messages

    def weight_total(self, silos: Iterable[str]) -> float:
        """The total S announced to ``silos``: the sum of their known ``num-examples``."""
        ids = list(silos)
        known = [self._num_examples[s] for s in ids if s in self._num_examples]
        if not known:
            return float(self.initial_weight_total or max(len(ids), 1))
        return float(math.fsum(known) + np.mean(known) * (len(ids) - len(known)))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every encrypted reply, leave out those that fail, add the others.

        Returns the encrypted sum with its plaintext weight sum, and the train metrics of
        the accepted silos; the balancer sees their ``train-time`` and ``he-time``. The
        checks are :class:`LBBSPFedAvg`'s, with :class:`~fl_lbbsp.crypto.UpdateChecker`
        and the weight ``num-examples / S`` in place of the plaintext array checks.
        """
        self._parsed = {}
        try:
            return super().aggregate_train(server_round, replies)
        finally:
            self._parsed = {}

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the silos' evaluation metrics and log the federated test accuracy."""
        metrics = super().aggregate_evaluate(server_round, replies)
        if metrics is not None and "eval-acc" in metrics:
            accuracy = float(metrics["eval-acc"])  # type: ignore[arg-type]
            loss = float(metrics.get("eval-loss", math.nan))  # type: ignore[arg-type]
            self.telemetry.write(
                {
                    "event": "evaluate",
                    "scheme": self.scheme,
                    "round": server_round,
                    "loss": loss,
                    "accuracy": accuracy,
                    "federated": True,
                }
            )
            log.info(
                "[%s] round %d | federated test accuracy %.4f", self.scheme, server_round, accuracy
            )
        return metrics

    # ----------------------------------------------------------------- helpers
    def _learn_layout(self, arrays: ArrayRecord) -> None:
        """Take the model's layout from the arrays sent out (metadata only, no values)."""
        if self._checker is not None:
            return
        if is_encrypted(arrays):
            layout = update_from_record(arrays).layout
        else:
            layout = tuple(
                TensorSpec(name=name, dtype=str(np.dtype(a.dtype)), shape=tuple(a.shape))
                for name, a in arrays.items()
            )
        self._checker = UpdateChecker(
            self.he_keys, num_values=sum(spec.size for spec in layout), layout=layout
        )

    def _check_arrays(self, msg: Message) -> None:
        """The ciphertexts pass :class:`UpdateChecker` and the weight is ``n_i / S``."""
        try:
            update = update_from_record(next(iter(msg.content.array_records.values())))
            if self._checker is None:
                self._checker = UpdateChecker(self.he_keys)
            parsed = self._checker.check(update)
        except InvalidUpdateError as err:
            raise InvalidReplyError(str(err)) from err
        metrics = next(iter(msg.content.metric_records.values()))
        n = float(metrics[self.weighted_by_key])  # type: ignore[arg-type]
        expected = n / self._weight_total
        if not math.isclose(update.weight, expected, rel_tol=self.weight_tolerance):
            raise InvalidReplyError(
                f"weight {update.weight!r} is not {self.weighted_by_key} / S = "
                f"{n:g} / {self._weight_total:g} = {expected!r}"
            )
        self._parsed[id(msg.content)] = parsed

    def _expected_reply_bytes(self) -> int:
        """The largest encrypted update of the model: chunks at their largest size."""
        if self._checker is None or self._checker.num_values is None:
            return super()._expected_reply_bytes()
        chunks = -(-self._checker.num_values // self.he_keys.config.slots)
        return chunks * self._checker.chunk_bytes[1]

    def _record_report(self, msg: Message) -> tuple[str, dict[str, Any]]:
        silo, record = super()._record_report(msg)
        metric = next(iter(msg.content.metric_records.values()))
        self._num_examples[silo] = float(metric[self.weighted_by_key])  # type: ignore[arg-type]
        return silo, record

    def _average_arrays(self, contents: list[RecordDict]) -> ArrayRecord:
        parsed = []
        for content in contents:
            cached = self._parsed.get(id(content))
            if cached is None:  # not seen by aggregate_train (direct call): check it now
                cached = self._check_reply_content(content)
            parsed.append(cached)
        return update_to_record(aggregate_updates(self.he_keys, parsed))

    def _check_reply_content(self, content: RecordDict) -> ParsedUpdate:
        record = next(iter(content.array_records.values()))
        checker = self._checker or UpdateChecker(self.he_keys)
        return checker.check(update_from_record(record))

    # -------------------------------------------------------------- checkpoints
    def checkpoint_settings(self) -> dict[str, Any]:
        """LB-BSP's settings plus the key fingerprint (the model is encrypted under it)."""
        return {**super().checkpoint_settings(), "fingerprint": self.he_keys.fingerprint}

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """LB-BSP's state plus every silo's last ``num-examples`` (for the total S)."""
        state, records = super().checkpoint_state()
        state["num_examples"] = dict(self._num_examples)
        return state, records

    def load_checkpoint_state(self, state: dict[str, Any], records: dict[str, ArrayRecord]) -> None:
        """Restore :meth:`checkpoint_state`."""
        super().load_checkpoint_state(state, records)
        self._num_examples = {str(s): float(n) for s, n in state["num_examples"].items()}
