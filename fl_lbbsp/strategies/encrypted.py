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

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from pydantic import ValidationError

from ..contract import EVAL_ACCURACY, EVAL_LOSS, NAMED_SILO, RecordKeys, silo_metric
from ..core.round.state import RoundState
from ..crypto import (
    CKKSKeys,
    InvalidUpdateError,
    ParsedUpdate,
    TensorSpec,
    UpdateChecker,
    aggregate_updates,
    load_server_keys,
)
from ..crypto.records import (
    check_report_of,
    is_encrypted,
    update_from_record,
    update_to_record,
)
from ..security.screening import InvalidReplyError
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
    """Sum of CKKS-encrypted, pre-weighted updates: the server adds what it cannot read.

    Silo i sends ``Enc(w_i u_i)`` with ``w_i = n_i / S``; the sum and the plaintext
    ``sum_i w_i`` are the next global record, which the silos decrypt and divide.

    Parameters
    ----------
    he_keys : CKKSKeys
        The federation's public keys.
    keys : RecordKeys
        Names of the contract's entries.
    weight_key : str
        The metric a silo's weight divides (``num-examples`` in FL, ``batch-size`` in
        cluster mode).
    total : {"dataset", "batch"} (default: "dataset")
        The total S announced: the sum of the sampled silos' last dataset sizes (a silo not
        yet heard from counts at the mean of the others), or the round's X.
    initial_weight_total : float | None (default: None)
        S while no sampled silo has reported a dataset size; ``None``: their number.
    weight_tolerance : float (default: 1e-6)
        Relative tolerance of the check ``w_i = n_i / S``.
    """

    def __init__(
        self,
        he_keys: CKKSKeys,
        *,
        keys: RecordKeys,
        weight_key: str,
        total: Literal["dataset", "batch"] = "dataset",
        initial_weight_total: float | None = None,
        weight_tolerance: float = 1e-6,
    ) -> None:
        self.he_keys = he_keys
        self.keys = keys
        self.weight_key = weight_key
        self.total = total
        self.initial_weight_total = initial_weight_total
        self.weight_tolerance = weight_tolerance
        self.num_examples: dict[str, float] = {}
        self.weight_total = 1.0
        self._checker: UpdateChecker | None = None
        self._parsed: list[ParsedUpdate] = []
        self._round: RoundState | None = None
        self.blame: ContributionBlame | None = None
        """Told which round's contributions every aggregate sums (FL mode)."""

    def begin(self, arrays: ArrayRecord, state: RoundState) -> None:
        """Learn the layout once; fix the round's total S."""
        self._harvest()
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
        self.weight_total = self.total_for(state)

    def total_for(self, state: RoundState) -> float:
        """S for the round: X, or the sum of the sampled silos' known dataset sizes."""
        if self.total == "batch":
            return float(sum(i.batch_size for i in state.instructions.values()))
        ids = [i.silo for i in state.instructions.values()]
        known = [self.num_examples[s] for s in ids if s in self.num_examples]
        if not known:
            return float(self.initial_weight_total or max(len(ids), 1))
        return float(math.fsum(known) + np.mean(known) * (len(ids) - len(known)))

    def config(self, state: RoundState) -> dict[str, float | int]:
        """S and the number of silos whose updates will be summed."""
        return {
            self.keys.he_weight_total: self.weight_total,
            self.keys.he_num_silos: len(state.instructions),
        }

    def expected_bytes(self, arrays: ArrayRecord) -> int:
        """The largest encrypted update of the model: chunks at their largest size."""
        if self._checker is None or self._checker.num_values is None:
            return sum(len(array.data) for array in arrays.values())
        chunks = -(-self._checker.num_values // self.he_keys.config.slots)
        return chunks * self._checker.chunk_bytes[1]

    def parse(
        self, record: ArrayRecord, metrics: Mapping[str, Any], state: RoundState
    ) -> ParsedUpdate:
        """The ciphertexts pass :class:`UpdateChecker` and the weight is ``n_i / S``; the
        silo's answers to check requests, if any, come along."""
        try:
            update = update_from_record(record)
            checker = self._checker or UpdateChecker(self.he_keys)
            parsed = checker.check(update)
            report = check_report_of(record)
        except InvalidUpdateError as err:
            raise InvalidReplyError(str(err)) from err
        n = float(metrics[self.weight_key])
        expected = n / self.weight_total
        if not math.isclose(update.weight, expected, rel_tol=self.weight_tolerance):
            raise InvalidReplyError(
                f"weight {update.weight!r} is not {self.weight_key} / S = "
                f"{n:g} / {self.weight_total:g} = {expected!r}"
            )
        return parsed if report is None else dataclasses.replace(parsed, check=report)

    def distance(self, update: ParsedUpdate) -> float | None:
        """``None``: the server cannot read a ciphertext (the silos check aggregates)."""
        return None

    def add(self, update: ParsedUpdate, *, weight: float) -> None:
        """Keep an accepted update (its weight is inside the ciphertext)."""
        self._parsed.append(update)

    @property
    def count(self) -> int:
        """Updates added this round."""
        return len(self._parsed)

    def result(self) -> ArrayRecord:
        """``sum_i Enc(w_i u_i)`` with ``sum_i w_i``."""
        if not self._parsed:
            raise ValueError("cannot aggregate zero updates")
        aggregate = aggregate_updates(self.he_keys, self._parsed)
        if self.blame is not None and self._round is not None:
            self.blame.aggregated(self._round.server_round, aggregate)
        return update_to_record(aggregate)

    def _harvest(self) -> None:
        """Every screened silo's dataset size of the last round (for the next S)."""
        if self._round is not None:
            for silo, record in self._round.reports.items():
                # A rejected claim (fl_lbbsp.security.claims) must not set S.
                if self.weight_key in record and "rejected-claim" not in record:
                    self.num_examples[silo] = float(record[self.weight_key])

    def settings(self) -> dict[str, Any]:
        """The key fingerprint (the model is encrypted under it)."""
        return {"fingerprint": self.he_keys.fingerprint}

    def state_dict(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """Every silo's last dataset size (for the total S)."""
        self._harvest()
        return {"num_examples": dict(self.num_examples)}, {}

    def load_state_dict(self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]) -> None:
        """Restore :meth:`state_dict`."""
        self.num_examples = {str(s): float(n) for s, n in state["num_examples"].items()}
        self._round = None


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
    exclude_named_for : int | None (default: None)
        When most silos refuse an aggregate, the next round's silos that refused it check
        its contributions and the silo that spoiled it is named
        (:mod:`fl_lbbsp.strategies.encrypted_blame`); it is left out for this many
        rounds, the round it is named in included. ``None``: for the rest of the run.
    **kwargs :
        Keyword arguments of :class:`LBBSPFedAvg` (``initial_batch_size``,
        ``local_steps``, ``lr``, ..., ``checkpoint_dir``). ``fraction_evaluate`` should
        stay above 0: the server cannot evaluate the model itself, and an ``evaluate_fn``
        passed to :meth:`start` receives the encrypted record. A checkpoint holds the
        encrypted global model and the silos' last dataset sizes, and is resumed only
        with the same key (fingerprint).

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
        initial_weight_total: float | None = None,
        weight_tolerance: float = 1e-6,
        exclude_named_for: int | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            checked = EncryptionConfig(
                initial_weight_total=initial_weight_total,
                weight_tolerance=weight_tolerance,
                exclude_named_for=exclude_named_for,
            )
        except ValidationError as err:
            raise setting_error(err, owner=type(self).__name__) from None
        super().__init__(**kwargs)
        self.he_keys = server_keys(public_context, fingerprint)
        self.updates = EncryptedSum(
            self.he_keys,
            keys=self.keys,
            weight_key=self.weighted_by_key,
            initial_weight_total=checked.initial_weight_total,
            weight_tolerance=checked.weight_tolerance,
        )
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
        "CKKS: N=%d, primes %s bits, scale 2^%d, key %s...; the server only adds",
        c.poly_modulus_degree,
        list(c.coeff_mod_bit_sizes),
        c.scale_bits,
        he_keys.fingerprint[:16],
    )
