"""Screening one reply of a round: its signature, size, records and the contract's metrics.

:class:`ReplyScreen` is the defence layer's :class:`~fl_lbbsp.core.round.trust.ReplyGate`
(composed onto the round engine by :func:`fl_lbbsp.security.guard.guard`). The engine
itself checks that the reply answers this round's instruction to its node, in time, once.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..contract import InvalidReplyError, RecordKeys, few
from ..core.round.state import Reply, RoundState
from ..core.round.trust import ReplyGate
from ..core.settings import ReplyLimits
from .identity import SiloRegistry, instruction_of
from .screening import contract_metric_keys

__all__ = ["MAX_CPU_PERCENT", "ReplyScreen", "default_reply_cap"]

log = logging.getLogger("fl_lbbsp")

MAX_CPU_PERCENT = 100.0 * 4096
"""The largest ``cpu-percent`` accepted: psutil's percent of one core, on up to 4,096
cores (the shipped silos send the machine's share, at most 100)."""

_EXACT_INT = 2**53  # largest integer a float64 holds exactly: num-examples' default bound


def default_reply_cap(expected_bytes: int) -> int:
    """Largest reply accepted by default: four times the update expected (or the model
    sent) plus 1 MiB for metrics and framing."""
    return 4 * expected_bytes + (1 << 20)


class ReplyScreen(ReplyGate):
    """Checks one reply at a time, train or evaluation; no Flower, no torch.

    Parameters
    ----------
    keys, weight_key : RecordKeys, str
        Names of the contract's entries, and the aggregation weight's (``num-examples`` in
        FL, ``batch-size`` in cluster mode).
    limits : ReplyLimits (default: ReplyLimits())
        What a reply may be (``extra_metric_keys`` set: strict mode, the only metrics
        accepted beyond the contract's, finite numbers).
    registry : SiloRegistry | None (default: None)
        The federation's silos and their public keys (:mod:`fl_lbbsp.security.identity`):
        every reply must be signed by the key of the silo it claims, for this run and
        round. ``None``: silo ids are believed (one warning, at the first reply).
    also_known : iterable of str (default: ())
        Metric keys a reply may hold beyond the contract's, of any type (the legacy API's
        ``silo-id``).
    """

    def __init__(
        self,
        *,
        keys: RecordKeys,
        weight_key: str,
        limits: ReplyLimits | None = None,
        registry: SiloRegistry | None = None,
        also_known: Iterable[str] = (),
    ) -> None:
        self.keys, self.weight_key = keys, weight_key
        self.limits = limits = limits or ReplyLimits()
        self.contract = contract_metric_keys(keys)
        self.known = self.contract | frozenset(also_known)
        extra = limits.extra_metric_keys
        self.extra = None if extra is None else frozenset(extra)
        self.max_num_examples = limits.max_num_examples or _EXACT_INT
        self.registry = registry

    def admit(self, state: RoundState, reply: Reply, silo: str) -> None:
        """Check a reply's signature against the silo registry (before the duplicate
        checks, so that an impostor replying first cannot shut the honest silo out):
        :class:`InvalidReplyError` for a malformed reply, a silo not in the registry, a
        missing signature, or one not the claimed silo's over this run, round, metrics and
        arrays."""
        if self.registry is None:
            _say_unverified()  # once a process, when a federation first replies
            return
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        self.registry.verify(
            reply.signature,
            run_id=state.run_id,
            server_round=state.server_round,
            instruction=instruction_of(state.sent, reply.node),
            silo=silo,
            metrics=reply.metrics or {},
            arrays=() if reply.signed_arrays is None else reply.signed_arrays(),
        )

    def check(self, state: RoundState, reply: Reply) -> None:
        """Under the size cap (``max_reply_bytes``, or four times the update expected plus
        1 MiB), well formed, the contract's metrics (with the batch size sent); the first
        check that fails raises :class:`InvalidReplyError`."""
        cap = self.limits.max_reply_bytes or default_reply_cap(state.expected_bytes)
        if reply.nbytes > cap:
            raise InvalidReplyError(f"reply of {reply.nbytes} bytes is over the {cap}-byte cap")
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        sent = state.instructions.get(reply.node)
        self.check_metrics(
            reply.metrics or {}, sent_batch_size=None if sent is None else sent.batch_size
        )

    def check_metrics(self, metrics: Mapping[str, Any], *, sent_batch_size: int | None) -> None:
        """Check a reply's metrics against the contract.

        Parameters
        ----------
        metrics : Mapping[str, Any]
            The reply's MetricRecord (or legacy FitRes metrics with ``num-examples``).
        sent_batch_size : int | None
            The batch size the server sent this silo; ``None`` skips that comparison.

        Raises
        ------
        InvalidReplyError
            At the first check that fails: a required key missing, in strict mode a key
            not allowed, a value out of range, a batch size other than the one sent.
        """
        k = self.keys
        required = (k.num_examples, k.train_time, k.batch_size, self.weight_key)
        missing = [key for key in dict.fromkeys(required) if key not in metrics]
        if missing:
            hint = ""
            if k.train_time in missing and k.batch_size in missing:
                hint = (
                    " (the silo's train function must be decorated with @lbbsp_train() from "
                    "fl_lbbsp.clients, under @app.train(), or send them itself)"
                )
            raise InvalidReplyError(f"missing metrics {few(missing)}{hint}")
        if self.extra is not None:
            unknown = sorted(set(metrics) - self.known - self.extra)
            if unknown:
                raise InvalidReplyError(
                    f"unexpected metrics {few(unknown)} (allow them with extra_metric_keys)"
                )
        for key, value in metrics.items():
            if key in self.contract:
                _number(key, value)
            elif self.extra is not None and key not in self.known and not _finite_metric(value):
                raise InvalidReplyError(f"metric {key!r} is not a finite number: {_short(value)}")
        time = float(metrics[k.train_time])
        if time <= 0:
            raise InvalidReplyError(f"{k.train_time} must be positive, got {time!r}")
        batch = _count(k.batch_size, metrics[k.batch_size], high=_EXACT_INT)
        if sent_batch_size is not None and batch != sent_batch_size:
            raise InvalidReplyError(
                f"{k.batch_size} {batch} differs from the {sent_batch_size} sent to this silo"
            )
        _count(k.num_examples, metrics[k.num_examples], high=self.max_num_examples)
        if k.samples_processed in metrics:
            _count(k.samples_processed, metrics[k.samples_processed], high=_EXACT_INT)
        if k.max_batch_size in metrics:
            _count(k.max_batch_size, metrics[k.max_batch_size], high=_EXACT_INT, low=0)
        if k.he_time in metrics and float(metrics[k.he_time]) < 0:
            raise InvalidReplyError(f"{k.he_time} must not be negative, got {metrics[k.he_time]!r}")
        for key, high in ((k.cpu_percent, MAX_CPU_PERCENT), (k.memory_percent, 100.0)):
            if key in metrics and not 0 <= float(metrics[key]) <= high:
                raise InvalidReplyError(f"{key} must lie in [0, {high:g}], got {metrics[key]!r}")

    def check_evaluation(self, metrics: Mapping[str, Any]) -> None:
        """Check an evaluation reply's metrics: the weight is a count in range, every value
        a finite number (or list of them).

        Raises
        ------
        InvalidReplyError
            On a missing or out-of-range weight or a value that is not a finite number.
        """
        if self.weight_key not in metrics:
            raise InvalidReplyError(f"missing metrics {self.weight_key!r}")
        _count(self.weight_key, metrics[self.weight_key], high=self.max_num_examples)
        for key, value in metrics.items():
            if not _finite_metric(value):
                raise InvalidReplyError(f"metric {key!r} is not a finite number: {_short(value)}")


def _number(key: str, value: object) -> float:
    if not _is_number(value):
        raise InvalidReplyError(f"metric {key!r} must be a number, got {_short(value)}")
    number = _as_float(value)
    if not math.isfinite(number):
        raise InvalidReplyError(f"metric {key!r} must be finite, got {_short(value)}")
    return number


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond the float range
        return math.inf


def _finite_metric(value: object) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(_is_number(v) and math.isfinite(_as_float(v)) for v in values)


def _count(key: str, value: object, *, high: int, low: int = 1) -> int:
    number = _number(key, value)
    if not number.is_integer() or not low <= number <= high:
        bound = f"an integer in [{low}, {high}]"
        raise InvalidReplyError(f"{key} must be {bound}, got {value!r}")
    return int(number)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def _say_unverified() -> None:
    """Warn, once in a process (``compare`` runs two strategies), that replies are unsigned."""
    log.warning(
        "silo identities are unverified: any node may reply as any silo (give the strategy "
        "a silo_registry from `fl-lbbsp keys silos` to check signatures)"
    )
