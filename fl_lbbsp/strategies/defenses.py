"""The server's defences against a registered silo's model, weight and refusals.

A signature proves which silo sent a reply, not that its content is sane. After a round's
replies are screened one by one (:mod:`fl_lbbsp.strategies.validation`), the accepted
updates are judged together (:mod:`fl_lbbsp.security.update_screen`):

- an update far outside the round's others (distance to the global model sent, or a
  gradient's norm) is rejected, and its silo's streak of rejected updates counted;
- an undeclared dataset size weighs at most ``max_weight_ratio`` times the median of the
  federation's sizes (which fewer than half the silos cannot move) and no more than all
  the others together;
- the silos' ``model-refused`` notes (a silo that found the global model it was sent NaN
  or far from its last one trains from its last model instead) are read: the server logs
  an error, and when most of the round's silos refused, the round's result is the last
  global model most of them accepted (a rollback).

In encrypted mode the server cannot read an update: a contribution judge
(:class:`EncryptedJudge`, :mod:`fl_lbbsp.strategies.encrypted_blame`) takes the screen's
place, learns of every refused aggregate, and names and leaves out the silo that spoiled it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from flwr.app import ArrayRecord, Message

from ..contract import MODEL_REFUSED, RecordKeys
from ..core.round.state import RoundState
from ..security.claims import ClaimChecker
from ..security.update_screen import UpdateScreen, cap_weights
from .updates import Updates
from .validation import config_record

__all__ = ["Defenses", "EncryptedJudge"]

log = logging.getLogger("fl_lbbsp")


class EncryptedJudge(Protocol):
    """Judges updates the server cannot read, from what the silos who can say."""

    def judge(self, state: RoundState, accepted: Mapping[str, Any]) -> dict[str, str]:
        """The silos of ``accepted`` (silo -> its parsed update) left out, with why."""

    def refused(self, state: RoundState, refused_by: set[str]) -> None:
        """Most of the round's silos (``refused_by``) refused the model it sent."""


class Defenses:
    """Judge a round's accepted updates together; remember the last model most silos took.

    Parameters
    ----------
    max_update_ratio, update_spread_sigmas : float
        The update screen's bound (:class:`~fl_lbbsp.security.update_screen.UpdateScreen`).
    max_weight_ratio : float
        The weight cap of an undeclared dataset size.
    weigh_by_size : bool
        Whether the weights are dataset sizes (FL) rather than batch sizes (cluster mode,
        where the server decides the batch sizes and nothing is capped).
    """

    def __init__(
        self,
        *,
        max_update_ratio: float,
        update_spread_sigmas: float,
        max_weight_ratio: float,
        weigh_by_size: bool,
    ) -> None:
        self.screen = UpdateScreen(
            max_update_ratio=max_update_ratio, spread_sigmas=update_spread_sigmas
        )
        self.max_weight_ratio = max_weight_ratio
        self.weigh_by_size = weigh_by_size
        self.streaks: dict[str, int] = {}
        """Silo -> rounds in a row its update was rejected by the screen."""
        self.last_accepted: ArrayRecord | None = None
        """The last global model most of its round's silos accepted (``None``: none yet)."""
        self.refused_by: set[str] = set()
        """The silos that refused the global model of the last round read."""
        self.encrypted: EncryptedJudge | None = None
        """Encrypted mode: the judge of the updates the screen cannot read."""

    def judge(
        self, state: RoundState, updates: Updates[Any], accepted: Mapping[str, Any]
    ) -> dict[str, str]:
        """The silos of ``accepted`` (silo -> its parsed update) whose update is rejected,
        with why; their timing reports are taken out of the round's balancer feed."""
        distances: dict[str, float] = {}
        for silo, update in accepted.items():
            distance = updates.distance(update)
            if distance is None:  # unreadable (encrypted): the silos check the aggregate
                distances = {}
                break
            distances[silo] = distance
        if accepted and not distances:
            rejected = {} if self.encrypted is None else self.encrypted.judge(state, accepted)
            for silo in rejected:
                state.feed.pop(silo, None)
            return rejected
        sent = {i.silo: i.batch_size for i in state.instructions.values()}
        rejected = self.screen.screen(
            distances,
            batch_sizes=sent,
            equal_batch=state.total / len(sent) if sent else None,
        )
        for silo in accepted:
            if silo not in rejected:
                self.streaks.pop(silo, None)
                continue
            state.feed.pop(silo, None)
            streak = self.streaks[silo] = self.streaks.get(silo, 0) + 1
            if streak == 3:
                log.error(
                    "silo %s sent 3 rejected updates in a row (its update is far from every "
                    "other silo's): check that silo",
                    silo,
                )
        return rejected

    def weights(
        self, claimed: Mapping[str, float], claims: ClaimChecker
    ) -> dict[str, tuple[float, str | None]]:
        """Each silo's aggregation weight, an undeclared size capped (FL only)."""
        if not self.weigh_by_size:
            return {silo: (weight, None) for silo, weight in claimed.items()}
        return cap_weights(
            claimed,
            known={s: float(n) for s, n in claims.sizes.items()},
            declared={s: float(n) for s, n in claims.declared.items()},
            max_weight_ratio=self.max_weight_ratio,
        )

    def refusals(self, state: RoundState, replies: Mapping[str, Message], keys: RecordKeys) -> int:
        """Read the silos' ``model-refused`` notes; log an error if any. Returns how many
        of the round's replying silos refused the global model they were sent."""
        refused: dict[str, str] = {}
        for silo, msg in replies.items():
            record = config_record(msg.content, keys.silo_record)
            note = None if record is None else record.get(MODEL_REFUSED)
            if isinstance(note, str) and note:
                refused[silo] = note[:200]
        self.refused_by = set(refused)
        if refused:
            log.error(
                "round %d: %d of %d silos refused the global model they were sent and "
                "trained from their last one: %s",
                state.server_round,
                len(refused),
                len(replies),
                "; ".join(f"{s}: {why}" for s, why in sorted(refused.items())[:5]),
            )
        return len(refused)

    def settle(
        self, state: RoundState, result: ArrayRecord | None, *, refused: int, replied: int
    ) -> ArrayRecord | None:
        """The round's model: ``result``, or the last model most silos accepted when most
        of this round's silos refused the one they were sent (logged)."""
        if replied and refused * 2 > replied:
            if self.encrypted is not None:
                self.encrypted.refused(state, self.refused_by)
            if self.last_accepted is not None:
                log.error(
                    "round %d: most silos refused the global model: rolled back to the last "
                    "one most of them accepted",
                    state.server_round,
                )
                return self.last_accepted
            return result
        if replied and isinstance(state.model, ArrayRecord):
            self.last_accepted = state.model
        return result
