"""Screening one reply of a round: its signature, size, records and the contract's metrics.

:class:`ReplyScreen` is the defence layer's :class:`~fl_lbbsp.core.round.trust.ReplyGate`
(composed onto the round engine by :func:`fl_lbbsp.security.guard.guard`): with a silo
registry, a reply must be signed by the silo it claims before anything in it is believed;
then it must fit the size cap, be well formed and keep the contract's metrics. The engine
itself checks that the reply answers this round's instruction to its node, in time, once
(:meth:`~fl_lbbsp.core.round.engine.RoundEngine.screen`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..contract import InvalidReplyError, RecordKeys
from ..core.round.state import Reply, RoundState
from ..core.round.trust import ReplyGate
from ..core.settings import ReplyLimits
from .identity import SiloRegistry, instruction_of
from .screening import ReplyValidator

__all__ = ["ReplyScreen", "default_reply_cap"]

log = logging.getLogger("fl_lbbsp")


def default_reply_cap(expected_bytes: int) -> int:
    """Largest reply accepted by default: four times the update expected (or the model
    sent) plus 1 MiB for metrics and framing."""
    return 4 * expected_bytes + (1 << 20)


class ReplyScreen(ReplyGate):
    """Checks one reply at a time; no Flower, no torch.

    Parameters
    ----------
    keys, weight_key : RecordKeys, str
        Names of the contract's entries, and the aggregation weight's.
    limits : ReplyLimits
        What a reply may be (``max_reply_bytes``, ``extra_metric_keys``, ...).
    registry : SiloRegistry | None (default: None)
        The federation's silos and their public keys: every reply must be signed by the
        key of the silo it claims. ``None``: silo ids are believed (one warning, at the
        first reply).
    also_known : iterable of str (default: ())
        Metric keys a reply may hold beyond the contract's (the legacy API's ``silo-id``).
    """

    def __init__(
        self,
        *,
        keys: RecordKeys,
        weight_key: str,
        limits: ReplyLimits,
        registry: SiloRegistry | None = None,
        also_known: Iterable[str] = (),
    ) -> None:
        self.limits = limits
        self.validator = ReplyValidator(
            keys=keys,
            weight_key=weight_key,
            extra_metric_keys=limits.extra_metric_keys,
            max_num_examples=limits.max_num_examples,
            also_known=also_known,
        )
        """The contract's metric checks (of evaluation replies too)."""
        self.registry = registry
        self._unverified_warned = False

    def reply_cap(self, state: RoundState) -> int:
        """Largest reply in bytes accepted this round (``max_reply_bytes`` or four times
        the update expected plus 1 MiB)."""
        if self.limits.max_reply_bytes is not None:
            return self.limits.max_reply_bytes
        return default_reply_cap(state.expected_bytes)

    def admit(self, state: RoundState, reply: Reply, silo: str) -> None:
        """Check a reply's signature against the silo registry (before the duplicate
        checks, so that an impostor replying first cannot shut the honest silo out).

        Raises
        ------
        InvalidReplyError
            A malformed reply, a silo not in the registry, a missing signature, or one
            that is not the claimed silo's over this run, round, metrics and arrays.
        """
        if self.registry is None:
            if not self._unverified_warned:  # once, when the federation first replies
                self._unverified_warned = True
                log.warning(
                    "silo identities are unverified: any node may reply as any silo (give "
                    "the strategy a silo_registry from `fl-lbbsp keys silos` to check "
                    "signatures)"
                )
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
        """Under the size cap, well formed, the contract's metrics (with the batch size
        sent).

        Raises
        ------
        InvalidReplyError
            Naming the first check that failed.
        """
        cap = self.reply_cap(state)
        if reply.nbytes > cap:
            raise InvalidReplyError(f"reply of {reply.nbytes} bytes is over the {cap}-byte cap")
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        sent = state.instructions.get(reply.node)
        self.validator.check_metrics(
            reply.metrics or {}, sent_batch_size=None if sent is None else sent.batch_size
        )
