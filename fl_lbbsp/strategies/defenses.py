"""The server's defences against a registered silo's model, weight and refusals.

A signature proves which silo sent a reply, not that its content is sane. After a round's
replies are screened one by one (:mod:`fl_lbbsp.strategies.validation`), the accepted
updates are judged together (:mod:`fl_lbbsp.security.update_screen`):

- an update far outside the round's others (distance to the global model sent, or a
  gradient's norm) is rejected, and its silo's streak of rejected updates counted;
- a round whose silos' median ``train-loss`` (of the model they were sent) is not finite
  or ``max_loss_ratio`` times the first round's has diverged: the model is rolled back to
  the last one that trained sanely, with an error (never a NaN model, never silently);
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
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from flwr.app import ArrayRecord, Message

from ..contract import MODEL_REFUSED, RecordKeys
from ..core.round.state import RoundState
from ..security.update_screen import UpdateScreen
from .updates import Updates
from .validation import config_record

__all__ = ["Defenses", "EncryptedJudge", "noise_scales"]

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
    max_loss_ratio : float (default: 10.0)
        A round's median ``train-loss`` over this many times the first round's (or not
        finite) has diverged (:meth:`diverged`).
    """

    def __init__(
        self,
        *,
        max_update_ratio: float,
        update_spread_sigmas: float,
        max_loss_ratio: float = 10.0,
    ) -> None:
        self.max_loss_ratio = max_loss_ratio
        self.first_loss: float | None = None
        """The first round's median ``train-loss`` (``None``: none seen yet)."""
        self.rollbacks = 0
        """Rounds rolled back because the model diverged."""
        self.screen = UpdateScreen(
            max_update_ratio=max_update_ratio, spread_sigmas=update_spread_sigmas
        )
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
                    "other silo's): check that silo. If it is honest, its data may differ "
                    "from the others' more than the bound allows (the model then drifts from "
                    "its data and its updates grow, so it stays out): raise max_update_ratio "
                    "(now %g) to keep it in",
                    silo,
                    self.screen.max_update_ratio,
                )
        return rejected

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

    def diverged(self, losses: Iterable[Any]) -> str | None:
        """Why the model the round's silos were sent diverged (``None``: it did not).

        ``losses`` are the round's replies' ``train-loss`` metrics (any reply, accepted or
        not; a missing or non-numeric one is left out, a NaN counts as infinite): the
        median of them, which a minority cannot move, is judged against the first round's
        median (the loss of the model the run started from): non-finite, or more than
        ``max_loss_ratio`` times it, the model exploded (an honest run's loss falls from
        its first round's). Without any loss reported nothing is judged."""
        values = [
            math.inf if math.isnan(float(v)) else float(v)
            for v in losses
            if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        if not values:
            return None
        median = statistics.median(values)
        if self.first_loss is None:
            if math.isfinite(median):
                self.first_loss = max(median, 1e-12)
                return None
            return f"the silos' median train-loss is {median:g}"
        if not math.isfinite(median) or median > self.max_loss_ratio * self.first_loss:
            return (
                f"the silos' median train-loss is {median:.4g}, over {self.max_loss_ratio:g}x "
                f"the first round's {self.first_loss:.4g}"
            )
        return None

    def settle(
        self,
        state: RoundState,
        result: ArrayRecord | None,
        *,
        refused: int,
        replied: int,
        diverged: str | None = None,
    ) -> ArrayRecord | None:
        """The round's model: ``result``; the last model most silos accepted when most of
        this round's silos refused the one they were sent; the last one that trained sanely
        when the model sent ``diverged`` (both logged as errors)."""
        if diverged is not None:
            self.rollbacks += 1
            if self.last_accepted is not None:
                log.error(
                    "round %d: the model diverged (%s): rolled back to the last one that "
                    "trained sanely (%d rollbacks so far); check the silos' updates",
                    state.server_round,
                    diverged,
                    self.rollbacks,
                )
                return self.last_accepted
            log.error(
                "round %d: the model diverged (%s) and there is no earlier model to roll back to",
                state.server_round,
                diverged,
            )
            return result
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


def noise_scales(state: RoundState) -> dict[str, float]:
    """``sqrt(B_eq / B_i)`` for each silo the round sent less than the equal split
    ``B_eq = X / n`` (the others 1): how much longer its honest update may be from
    minibatch noise alone (:mod:`fl_lbbsp.security.update_screen`), the widening of its
    radius in a robust aggregation (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`)."""
    sent = {i.silo: i.batch_size for i in state.instructions.values()}
    if not sent or not state.total > 0:
        return {}
    equal = state.total / len(sent)
    return {silo: math.sqrt(equal / b) for silo, b in sent.items() if 0 < b < equal}
