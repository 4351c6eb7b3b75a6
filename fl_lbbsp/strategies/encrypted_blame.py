"""The server's side of naming the silo behind a refused encrypted aggregate.

:class:`ContributionBlame` keeps the contributions of the last rounds (ciphertexts, as
received) and which round's contributions each aggregate sums. When most silos refuse an
aggregate (:class:`~fl_lbbsp.strategies.defenses.Defenses` rolls the model back), the
next round's train messages ask the silos that refused it to check its contributions,
each contribution sent to two of them other than its sender; their signed answers come
back with that round's replies, and a silo whose contribution a majority of at least two
checkers found out of range is named (one error line, a ``named`` telemetry event, the
metric ``named/<silo>`` of the round in Flower's ``Result``) and left out: its update is
rejected from that round on, for ``exclude_for`` rounds or for good. The rule and what it
leaks: :mod:`fl_lbbsp.crypto.blame`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from flwr.app import ArrayRecord

from ..core.round.state import RoundState
from ..crypto import EncryptedUpdate, ParsedUpdate
from ..crypto.blame import CheckRequest, assign_checkers, judge_checks
from ..crypto.records import is_encrypted, request_records, update_from_record
from ..telemetry import TelemetryWriter

__all__ = ["ContributionBlame", "NamedSilo"]

log = logging.getLogger("fl_lbbsp")

_KEEP_ROUNDS = 3
"""Rounds of contributions (and aggregates) kept: the refused one is at most two back."""


@dataclass(frozen=True)
class NamedSilo:
    """A silo named in round ``named_in`` (its update that round already left out) for
    spoiling round ``bad_round``'s aggregate, left out up to round ``until`` (``None``: for
    good), with what its checkers found (``reason``)."""

    silo: str
    named_in: int
    bad_round: int
    until: int | None
    reason: str

    def left_out(self, server_round: int) -> bool:
        """Whether its update is left out of ``server_round``."""
        return server_round >= self.named_in and (self.until is None or server_round <= self.until)


class ContributionBlame:
    """Find and leave out the silo whose encrypted contribution spoiled an aggregate.

    Parameters
    ----------
    max_ratio : float
        A contribution whose norm is more than this factor above or below the checker's
        own model's is out of range (the server's ``max_update_ratio``).
    exclude_for : int | None (default: None)
        Rounds a named silo is left out, the round it is named in included; ``None``:
        for the rest of the run.
    telemetry, scheme : TelemetryWriter | None, str (default: None, "lbbsp")
        Where the ``named`` events go, and the scheme they name.
    """

    def __init__(
        self,
        *,
        max_ratio: float,
        exclude_for: int | None = None,
        telemetry: TelemetryWriter | None = None,
        scheme: str = "lbbsp",
    ) -> None:
        self.max_ratio = max_ratio
        self.exclude_for = exclude_for
        self.telemetry = telemetry
        self.scheme = scheme
        self.named: dict[str, NamedSilo] = {}
        """Every silo named so far."""
        self._contributions: dict[int, dict[str, EncryptedUpdate]] = {}
        self._made: dict[tuple[str, ...], int] = {}
        self._pending: tuple[int, dict[str, EncryptedUpdate], frozenset[str]] | None = None
        self._asked: dict[int, tuple[int, dict[str, list[str]]]] = {}

    # ------------------------------------------------------------- the round's updates
    def judge(self, state: RoundState, accepted: Mapping[str, ParsedUpdate]) -> dict[str, str]:
        """Leave out the named silos; read the answers to this round's checks and name
        the silo they show; keep the rest of the round's contributions.

        Returns
        -------
        dict
            Silo -> why its update is left out of this round.
        """
        r = state.server_round
        rejected = {
            silo: (
                f"left out: named in round {named.named_in} for spoiling round "
                f"{named.bad_round}'s aggregate"
            )
            for silo in accepted
            if (named := self.named.get(silo)) is not None and named.left_out(r)
        }
        asked = self._asked.pop(r, None)
        for old in [k for k in self._asked if k < r]:  # rounds that aggregated nothing
            del self._asked[old]
        if asked is not None:
            bad_round, assignment = asked
            reports = {
                checker: update.check
                for checker, update in accepted.items()
                if checker in assignment and checker not in rejected and update.check is not None
            }
            verdict = judge_checks(
                assignment, reports, bad_round=bad_round, max_ratio=self.max_ratio
            )
            for silo, why in verdict.named.items():
                rejected[silo] = self._name(silo, r, bad_round, why)
            for silo, why in verdict.disputed.items():
                log.warning("round %d: silo %s is not named: %s", r, silo, why)
            for silo, why in verdict.undecided.items():
                log.warning("round %d: silo %s cannot be judged: %s", r, silo, why)
        self._contributions[r] = {s: u.update for s, u in accepted.items() if s not in rejected}
        _prune(self._contributions)
        return rejected

    def aggregated(self, server_round: int, aggregate: EncryptedUpdate) -> None:
        """Remember that ``aggregate`` sums the contributions of ``server_round``."""
        self._made[aggregate.digests] = server_round
        if len(self._made) > _KEEP_ROUNDS:
            del self._made[next(iter(self._made))]

    # ----------------------------------------------------------- refusals and checks
    def refused(self, state: RoundState, refused_by: set[str]) -> None:
        """Most silos refused the model sent in ``state``'s round: if it is an aggregate
        of a recent round, its contributions are checked in the next round by the silos
        that refused it."""
        model = state.model
        if not isinstance(model, ArrayRecord) or not is_encrypted(model):
            return
        bad_round = self._made.get(update_from_record(model).digests)
        contributions = self._contributions.get(bad_round or -1)
        if bad_round is None or not contributions:
            log.warning(
                "round %d: the refused model is no aggregate of the last rounds: no "
                "contribution to check",
                state.server_round,
            )
            return
        self._pending = (bad_round, contributions, frozenset(refused_by))

    def requests(self, state: RoundState) -> dict[int, dict[str, ArrayRecord]]:
        """The check requests of this round's train messages, by node: each contribution
        of the refused round to two silos of this round that refused it, other than its
        sender (and no named silo)."""
        if self._pending is None:
            return {}
        bad_round, contributions, refusers = self._pending
        self._pending = None
        r = state.server_round
        nodes = {
            ins.silo: int(node)
            for node, ins in state.instructions.items()
            if ins.silo in refusers
            and not ((named := self.named.get(ins.silo)) is not None and named.left_out(r))
        }
        assignment = assign_checkers(list(contributions), list(nodes))
        if not assignment:
            log.warning(
                "round %d: no silo of this round refused round %d's aggregate: its "
                "contributions cannot be checked",
                r,
                bad_round,
            )
            return {}
        self._asked[r] = (bad_round, assignment)
        log.info(
            "round %d: silos %s check the %d contributions to round %d's refused aggregate",
            r,
            ", ".join(sorted(assignment)),
            len(contributions),
            bad_round,
        )
        return {
            nodes[checker]: request_records(
                [CheckRequest(silo=o, bad_round=bad_round, update=contributions[o]) for o in owned]
            )
            for checker, owned in assignment.items()
        }

    def named_in(self, server_round: int) -> dict[str, int]:
        """Silo -> the round it spoiled, for the silos named in ``server_round``."""
        return {s: n.bad_round for s, n in self.named.items() if n.named_in == server_round}

    def _name(self, silo: str, server_round: int, bad_round: int, why: str) -> str:
        until = None if self.exclude_for is None else server_round + self.exclude_for - 1
        self.named[silo] = NamedSilo(
            silo=silo, named_in=server_round, bad_round=bad_round, until=until, reason=why
        )
        span = "for good" if until is None else f"up to round {until}"
        log.error(
            "round %d: silo %s is named: its contribution spoiled round %d's aggregate (%s); "
            "it is left out %s",
            server_round,
            silo,
            bad_round,
            why,
            span,
        )
        if self.telemetry is not None:
            self.telemetry.write(
                {
                    "event": "named",
                    "scheme": self.scheme,
                    "round": server_round,
                    "silo": silo,
                    "bad_round": bad_round,
                    "until": until,
                    "reason": why,
                }
            )
        return f"named: its contribution spoiled round {bad_round}'s aggregate; left out {span}"


def _prune(rounds: dict[int, dict[str, EncryptedUpdate]]) -> None:
    for old in sorted(rounds)[:-_KEEP_ROUNDS]:
        del rounds[old]
