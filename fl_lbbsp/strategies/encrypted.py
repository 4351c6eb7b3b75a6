"""LB-BSP FedAvg over CKKS-encrypted updates: the server weighs and adds ciphertexts it
cannot read.

Each silo encrypts its trained parameters ``u_i`` under the federation's CKKS key and
replies with the ciphertexts and its ``num-examples`` ``n_i``. The server checks every
reply (:class:`~fl_lbbsp.crypto.UpdateChecker` and the metric checks of every strategy),
caps each undeclared ``n_i`` as in plaintext, multiplies each ciphertext by its integer
weight ``w_i`` and sends back ``sum_i w_i Enc(u_i)`` with the plaintext ``W = sum_i w_i``;
silos decrypt and divide. Apart from the initial model, the server never holds plaintext
parameters, and evaluation is federated. Balancing is unchanged; ``he-time`` is the
linear allocator's fixed cost.

References: Chen et al., IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL); Cheon et al.,
ASIACRYPT 2017 (CKKS); Zhang et al., "BatchCrypt", USENIX ATC 2020.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from pydantic import ValidationError

from ..contract import (
    EVAL_ACCURACY,
    EVAL_LOSS,
    NAMED_SILO,
    InvalidReplyError,
    RecordKeys,
    silo_metric,
)
from ..core.round.state import RoundState
from ..crypto import (
    CKKSKeys,
    InvalidUpdateError,
    ParsedUpdate,
    TensorSpec,
    UpdateChecker,
    aggregate_updates,
    integer_weights,
    load_server_keys,
)
from ..crypto.records import (
    check_report_of,
    is_encrypted,
    update_from_record,
    update_to_record,
)
from .config import EncryptionConfig, setting_error
from .encrypted_blame import ContributionBlame
from .fedavg import EngineStrategy, LBBSPFedAvg

__all__ = [
    "EncryptedLBBSPFedAvg",
    "EncryptedSum",
    "log_federated_evaluation",
    "server_keys",
]

log = logging.getLogger("fl_lbbsp")


def server_keys(public_context: str | Path | CKKSKeys, fingerprint: str | None) -> CKKSKeys:
    """The server's public keys; keys holding the secret key are refused.

    Raises
    ------
    ValueError
        The keys hold the secret key or do not match ``fingerprint``
        (:class:`~fl_lbbsp.crypto.KeyFileError`: a key file that cannot be used).
    """
    if not isinstance(public_context, CKKSKeys):
        return load_server_keys(public_context, fingerprint=fingerprint)
    if public_context.is_private:
        raise ValueError(
            "the server must not hold the secret key: pass the public context "
            "(CKKSKeys.public() or public.ckks)"
        )
    if fingerprint is not None and fingerprint.strip() != public_context.fingerprint:
        raise ValueError("public_context does not match the expected fingerprint")
    return public_context


class EncryptedSum:
    """Sum of CKKS-encrypted updates, each multiplied by its integer weight on the server.

    ``w_i`` is the weight the round gives :meth:`add` (a capped dataset size, or a batch
    size), rounded to an integer; should the weights sum above the room the CKKS
    parameters leave (``CKKSConfig.max_weight_total``), all are divided by one common
    factor first (:func:`fl_lbbsp.crypto.ckks.integer_weights`) and a warning says so.

    ``he_keys``: the federation's public keys; ``keys``: the contract's entry names.
    """

    def __init__(self, he_keys: CKKSKeys, *, keys: RecordKeys) -> None:
        self.he_keys = he_keys
        self.keys = keys
        self._checker: UpdateChecker | None = None
        self._parsed: list[ParsedUpdate] = []
        self._weights: list[float] = []
        self._round: RoundState | None = None
        self.applied: list[int] = []
        """The integer weights of the last aggregate, in the order the updates were added."""
        self.blame: ContributionBlame | None = None
        """Told which round's contributions every aggregate sums (FL mode)."""

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Learn the layout once; start the round's sum."""
        if self._checker is None:
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
        self._round = state
        self._parsed = []
        self._weights = []

    def config(self, state: RoundState) -> dict[str, float | int]:
        """Nothing: silos encrypt unweighted updates."""
        return {}

    def expected_bytes(self, arrays: ArrayRecord) -> int:
        """The largest encrypted update of the model: fresh chunks at their largest size."""
        if self._checker is None or self._checker.num_values is None:
            return sum(len(array.data) for array in arrays.values())
        per = self.he_keys.config.values_per_ciphertext
        chunks = -(-self._checker.num_values // per)
        return chunks * self._checker.chunk_bytes[1][1]

    def parse(
        self, record: ArrayRecord, metrics: Mapping[str, Any], state: RoundState
    ) -> ParsedUpdate:
        """The ciphertexts pass :class:`UpdateChecker` and are a silo's own unweighted
        update; the silo's answers to check requests, if any, come along."""
        try:
            update = update_from_record(record)
            if update.aggregate:
                raise InvalidUpdateError(
                    "an aggregate: a silo sends its own update, unweighted, the server weighs it"
                )
            checker = self._checker or UpdateChecker(self.he_keys)
            parsed = checker.check(update)
            report = check_report_of(record)
        except InvalidUpdateError as err:
            raise InvalidReplyError(str(err)) from err
        return parsed if report is None else dataclasses.replace(parsed, check=report)

    def distance(self, update: ParsedUpdate) -> float | None:
        """``None``: the server cannot read a ciphertext (the silos check aggregates)."""
        return None

    def add(
        self,
        update: ParsedUpdate,
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Keep an accepted update and the weight the server gives it (a ciphertext is
        not clipped: no ``scale``, no history, no ``claimed``)."""
        self._parsed.append(update)
        self._weights.append(weight)

    @property
    def count(self) -> int:
        """Updates added this round."""
        return len(self._parsed)

    def result(self) -> ArrayRecord:
        """``sum_i w_i Enc(u_i)`` with ``W = sum_i w_i``."""
        if not self._parsed:
            raise ValueError("cannot aggregate zero updates")
        config = self.he_keys.config
        weights, divisor = integer_weights(self._weights, limit=config.max_weight_total)
        if divisor > 1:
            log.warning(
                "round %s: the weights sum to %g, above the 2^%d the CKKS keys leave room "
                "for: applied in units of %d (%s)",
                "?" if self._round is None else self._round.server_round,
                math.fsum(self._weights),
                config.weight_bits,
                divisor,
                ", ".join(str(w) for w in weights),
            )
        self.applied = weights
        aggregate = aggregate_updates(self.he_keys, self._parsed, weights)
        if self.blame is not None and self._round is not None:
            self.blame.aggregated(self._round.server_round, aggregate)
        return update_to_record(aggregate)

    def settings(self) -> dict[str, Any]:
        """The key fingerprint (the model is encrypted under it)."""
        return {"fingerprint": self.he_keys.fingerprint}

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """Nothing between rounds: the weights are the round's."""
        return {}, {}

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore :meth:`state_dict` (nothing)."""
        self._round = None


class EncryptedLBBSPFedAvg(LBBSPFedAvg):
    """:class:`LBBSPFedAvg` whose silos ship CKKS-encrypted updates that the server weighs.

    Parameters
    ----------
    public_context : str | Path | CKKSKeys
        The server's public context: the ``public.ckks`` file from ``fl-lbbsp keys
        generate``, its folder, or loaded keys. Keys holding the secret key are refused.
    fingerprint : str | None (default: None)
        Expected key fingerprint (``fingerprint.txt``); checked against the context.
    exclude_named_for : int | None (default: None)
        When most silos refuse an aggregate, the next round's silos that refused it check
        its contributions and the silo that spoiled it is named
        (:mod:`fl_lbbsp.strategies.encrypted_blame`); it is left out for this many
        rounds, the round it is named in included. ``None``: for the rest of the run.
    **kwargs :
        Keyword arguments of :class:`LBBSPFedAvg`. ``fraction_evaluate`` should stay above
        0: the server cannot evaluate the model itself. A checkpoint holds the encrypted
        global model, and is resumed only with the same key (fingerprint).

    Raises
    ------
    InvalidSettingError
        (a ``ValueError``) On a bad setting; the message names the keyword and the value.
    ValueError
        On keys the server must not use (:func:`server_keys`).
    """

    def __init__(
        self,
        *,
        public_context: str | Path | CKKSKeys,
        fingerprint: str | None = None,
        exclude_named_for: int | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            checked = EncryptionConfig(exclude_named_for=exclude_named_for)
        except ValidationError as err:
            raise setting_error(err, owner=type(self).__name__) from None
        super().__init__(**kwargs)
        self.he_keys = server_keys(public_context, fingerprint)
        self.updates = EncryptedSum(self.he_keys, keys=self.keys)
        self.blame = ContributionBlame(
            max_ratio=self.server_config.max_update_ratio,
            exclude_for=checked.exclude_named_for,
            telemetry=self.telemetry,
            scheme=self.scheme,
        )
        self.updates.blame = self.blame
        self.defenses.encrypted = self.blame

    def train_messages(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """The train messages; after a refused aggregate, those of the silos that refused
        it also carry the contributions each is asked to check."""
        messages = super().train_messages(state, arrays, config)
        requests = self.blame.requests(state)
        for msg in messages:
            for name, record in requests.get(msg.metadata.dst_node_id, {}).items():
                msg.content[name] = record
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """As :class:`LBBSPFedAvg`; the round's metrics also carry ``named/<silo>`` (the
        round it spoiled) for each silo named in it."""
        arrays, metrics = super().aggregate_train(server_round, replies)
        if metrics is not None and self.round is not None:
            for silo, bad_round in self.blame.named_in(self.round.server_round).items():
                metrics[silo_metric(NAMED_SILO, silo)] = bad_round
        return arrays, metrics

    def summary(self) -> None:
        """Log the encryption settings, then LB-BSP's and FedAvg's."""
        log_keys(self.he_keys)
        super().summary()

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the silos' evaluation metrics and log the federated test accuracy."""
        metrics = super().aggregate_evaluate(server_round, replies)
        log_federated_evaluation(self, server_round, metrics)
        return metrics


def log_federated_evaluation(
    strategy: EngineStrategy, server_round: int, metrics: MetricRecord | None
) -> None:
    """One ``evaluate`` telemetry event and log line for the silos' own evaluation (the
    server cannot evaluate an encrypted model)."""
    if metrics is None or EVAL_ACCURACY not in metrics:
        return
    accuracy = float(metrics[EVAL_ACCURACY])  # type: ignore[arg-type]
    loss = float(metrics.get(EVAL_LOSS, math.nan))  # type: ignore[arg-type]
    strategy.record_evaluation(server_round, loss=loss, accuracy=accuracy, federated=True)


def log_keys(he_keys: CKKSKeys) -> None:
    """One line on the CKKS settings the server adds under."""
    c = he_keys.config
    log.info(
        "CKKS: N=%d, primes %s bits, scale 2^%d, key %s...; the server weighs and adds",
        c.poly_modulus_degree,
        list(c.coeff_mod_bit_sizes),
        c.scale_bits,
        he_keys.fingerprint[:16],
    )
