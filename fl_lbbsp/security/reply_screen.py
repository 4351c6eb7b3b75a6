"""Screening one reply of a round: origin, signature, duplicates, size, contract, update.

:class:`ReplyScreen` is the round engine's (:class:`~fl_lbbsp.core.round.engine.RoundEngine`)
first look at a reply, before anything in it is believed: it says whether the reply
answers this round's instruction to its node in time, is signed by the silo it claims
(with a silo registry), is the first from its node and for its silo, is not an error,
fits the size cap, keeps the contract's metrics, and carries an update the adapter's
parser can read. Its :class:`~fl_lbbsp.core.round.state.Verdict` names the reason of a
rejection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..contract import RecordKeys
from ..core.round.state import Node, Reply, RoundState, Verdict
from ..core.settings import ReplyLimits
from .identity import SiloRegistry, instruction_of
from .screening import InvalidReplyError, ReplyValidator, error_summary

__all__ = ["ReplyScreen", "default_reply_cap"]


def default_reply_cap(expected_bytes: int) -> int:
    """Largest reply accepted by default: four times the update expected (or the model
    sent) plus 1 MiB for metrics and framing."""
    return 4 * expected_bytes + (1 << 20)


U = TypeVar("U")


class ReplyScreen:
    """Checks one reply at a time; no Flower, no torch.

    Parameters
    ----------
    keys : RecordKeys
        Names of the contract's entries.
    limits : ReplyLimits
        What a reply may be (``max_reply_bytes``, ...).
    validator : ReplyValidator
        The contract's metric checks.
    silo_id : Callable[[Node], str]
        The stable silo id last reported by a node (the engine's).
    registry : SiloRegistry | None (default: None)
        The federation's silos and their public keys: every reply must be signed by the
        key of the silo it claims. ``None``: silo ids are believed.
    """

    def __init__(
        self,
        *,
        keys: RecordKeys,
        limits: ReplyLimits,
        validator: ReplyValidator,
        silo_id: Callable[[Node], str],
        registry: SiloRegistry | None = None,
    ) -> None:
        self.keys = keys
        self.limits = limits
        self.validator = validator
        self.silo_id = silo_id
        self.registry = registry

    def reply_cap(self, state: RoundState) -> int:
        """Largest reply in bytes accepted this round (``max_reply_bytes`` or four times
        the update expected plus 1 MiB)."""
        if self.limits.max_reply_bytes is not None:
            return self.limits.max_reply_bytes
        return default_reply_cap(state.expected_bytes)

    def claimed_silo(self, reply: Reply) -> str:
        """The silo id a reply claims (its node's known id if it claims none).

        Raises
        ------
        InvalidReplyError
            If the claim is not a string (or an integer).
        """
        if reply.silo is None:
            return self.silo_id(reply.node)
        if isinstance(reply.silo, bool) or not isinstance(reply.silo, str | int):
            raise InvalidReplyError(f"{self.keys.silo_id} must be a string, got {reply.silo!r:.60}")
        return str(reply.silo)

    def screen(self, state: RoundState, reply: Reply, parse: Callable[[], U]) -> Verdict[U]:
        """Check one reply; ``parse`` reads and checks its update, last.

        In order: it answers this round, was sent to this node and came in time; with a
        silo registry, it is signed by the key of the silo it claims, for this run and
        round (:meth:`verify`; nothing else in it is trusted before); it is the first
        from its node and for its silo; it is not an error; its size is under
        the cap; its records are well formed; its metrics keep the contract (with the
        batch size sent); its update parses (``parse`` raises
        :class:`~fl_lbbsp.security.screening.InvalidReplyError` with the reason).
        """
        node = reply.node
        try:
            silo = self.claimed_silo(reply)  # to name the silo in a rejection
        except InvalidReplyError:
            silo = self.silo_id(node)
        try:
            self._check_origin(state, reply)
            if self.registry is not None and reply.error is None:
                self.verify(state, reply)
            # The first reply of this round from a node, or for a silo, is the one.
            if node in state.nodes:
                raise InvalidReplyError(f"a second reply from node {node} in this round")
            state.nodes.add(node)
            silo = self.claimed_silo(reply)
            if silo in state.silos:
                raise InvalidReplyError(f"a second reply for silo {silo} in this round")
            state.silos.add(silo)
            update = self._check_content(state, reply, parse)
        except InvalidReplyError as err:
            return Verdict(node=node, silo=silo, reason=str(err))
        return Verdict(node=node, silo=silo, update=update)

    def _check_content(self, state: RoundState, reply: Reply, parse: Callable[[], U]) -> U:
        """Not an error, under the size cap, well formed, the contract's metrics, and an
        update that parses."""
        if reply.error is not None:
            raise InvalidReplyError(f"error reply: {error_summary(reply.error)}")
        cap = self.reply_cap(state)
        if reply.nbytes > cap:
            raise InvalidReplyError(f"reply of {reply.nbytes} bytes is over the {cap}-byte cap")
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        sent = state.instructions.get(reply.node)
        self.validator.check_metrics(
            reply.metrics or {}, sent_batch_size=None if sent is None else sent.batch_size
        )
        try:
            return parse()
        except InvalidReplyError:
            raise
        except Exception as err:  # noqa: BLE001 - hostile bytes may break any parser
            raise InvalidReplyError(f"unreadable arrays ({type(err).__name__}: {err})") from err

    def verify(self, state: RoundState, reply: Reply) -> None:
        """Check a reply's signature against the silo registry (before the duplicate
        checks, so that an impostor replying first cannot shut the honest silo out).

        Raises
        ------
        InvalidReplyError
            A malformed reply, a silo not in the registry, a missing signature, or one
            that is not the claimed silo's over this run, round, metrics and arrays.
        """
        if self.registry is None:
            return
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        self.registry.verify(
            reply.signature,
            run_id=state.run_id,
            server_round=state.server_round,
            instruction=instruction_of(state.sent, reply.node),
            silo=self.claimed_silo(reply),
            metrics=reply.metrics or {},
            arrays=() if reply.signed_arrays is None else reply.signed_arrays(),
        )

    def _check_origin(self, state: RoundState, reply: Reply) -> None:
        if reply.stale:
            raise InvalidReplyError("not a reply to a train message of this round (stale)")
        if state.instructions and reply.node not in state.instructions:
            raise InvalidReplyError(f"node {reply.node} was not sent a train message this round")
        if reply.seconds_late is not None:
            waited = state.waited if state.waited is not None else state.deadline
            raise InvalidReplyError(
                f"arrived {reply.seconds_late:.2f} s after the round deadline of "
                f"{waited or 0:.1f} s"
            )
