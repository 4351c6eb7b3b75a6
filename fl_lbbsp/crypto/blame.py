"""Naming the silo whose encrypted contribution spoiled an aggregate.

The server cannot read a contribution; the silos, who hold the secret key, can. When most
silos refuse an aggregate (they decrypted it and found it NaN or far from the model they
train from, and :mod:`fl_lbbsp.strategies.defenses` rolled the model back), the server
still holds the ciphertexts it summed into it. With the next round's train message it
sends each of those contributions to :data:`CHECKERS` silos that refused the aggregate,
never to the contribution's sender. Each checker decrypts what it was sent and answers,
inside its signed encrypted update, the L2 norm of each contribution and the L2 norm of the
model it trains from itself (:class:`CheckReport`). A silo is named when a strict majority
of its contribution's checkers, at least two, find that norm more than ``max_ratio`` times
above or below their own model's: the rule that made them refuse the aggregate, applied to
one contribution (:func:`judge_checks`).

Soundness, with one dishonest silo: its contribution is checked by honest silos only, so it
is named; its own check of an honest contribution is one vote of two, so it can neither
frame an honest silo nor, by reporting tiny norms, move a reference the others are judged
by (each contribution is judged against its checkers' own models, not against the other
contributions). Honest checkers decrypt the same ciphertext with the same key and agree;
a disagreement is logged with the checkers' names.

Why decryption by other silos rather than a norm computed under encryption: the default
chain has a single data prime, so the server can add ciphertexts and multiply them by
integers but not by each other (a squared norm needs one ciphertext multiplication and a
longer chain, hence larger ciphertexts every round), and a statistic built from additions
and integer products is linear, which a forger can make vanish.

What it leaks is stated in ``docs/encryption.md``: each contribution of the one refused
round to two other silos (which share the secret key anyway), and its norm to the server.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .check_report import CheckReport, InvalidUpdateError, is_count, read_note
from .ckks import EncryptedUpdate, UpdateChecker, decrypt_update
from .keys import CKKSKeys

__all__ = [
    "CHECKERS",
    "CheckReport",
    "CheckRequest",
    "Judgement",
    "assign_checkers",
    "contribution_norm",
    "contribution_ratio",
    "judge_checks",
]

CHECKERS = 2
"""Silos that check each contribution (fewer when fewer other silos refused)."""


@dataclass(frozen=True)
class CheckRequest:
    """One contribution a silo is asked to check.

    Parameters
    ----------
    silo : str
        The silo that sent it.
    bad_round : int
        The round whose aggregate it was summed into.
    update : EncryptedUpdate
        The contribution, as the silo sent it.
    """

    silo: str
    bad_round: int
    update: EncryptedUpdate

    def note(self) -> bytes:
        """Whose contribution, of which round, as JSON bytes."""
        return json.dumps({"silo": self.silo, "round": self.bad_round}, sort_keys=True).encode()

    @staticmethod
    def read_note(data: bytes) -> tuple[str, int]:
        """Inverse of :meth:`note`: the silo and the round.

        Raises
        ------
        InvalidUpdateError
            If the note is not of this format.
        """
        meta = read_note(data)
        silo, bad_round = meta.get("silo"), meta.get("round")
        if isinstance(bad_round, bool):
            bad_round = None
        if not isinstance(silo, str) or not is_count(bad_round) or not isinstance(bad_round, int):
            raise InvalidUpdateError("check request: unreadable note")
        return silo, bad_round


def contribution_norm(
    keys: CKKSKeys, checker: UpdateChecker, update: EncryptedUpdate
) -> float | None:
    """The L2 norm of a decrypted contribution divided by its weight (a silo's parameters);
    ``None`` if it fails the checks or is not finite."""
    try:
        values = decrypt_update(keys, update, checker=checker)
    except InvalidUpdateError:
        return None
    norm = float(np.linalg.norm(values))
    return norm if math.isfinite(norm) else None


def contribution_ratio(norm: float | None, reference: float) -> float:
    """How far a contribution's norm is from the checker's own model's, as a factor of at
    least 1; ``inf`` when either is missing, zero or not finite."""
    if norm is None or not (math.isfinite(norm) and math.isfinite(reference)):
        return math.inf
    if norm <= 0 or reference <= 0:
        return math.inf
    return max(norm / reference, reference / norm)


def assign_checkers(
    owners: Sequence[str], checkers: Sequence[str], *, per_contribution: int = CHECKERS
) -> dict[str, list[str]]:
    """Which contributions each checker is sent: every owner's to the ``per_contribution``
    checkers after it in a circle of the checkers (itself skipped; fewer when there are
    fewer), so that when the owners are the checkers each checks exactly that many.

    Returns
    -------
    dict
        Checker -> the owners whose contributions it checks (checkers given none left out).
    """
    pool = sorted(set(checkers))
    load: dict[str, list[str]] = {c: [] for c in pool}
    for i, owner in enumerate(sorted(set(owners))):
        start = pool.index(owner) + 1 if owner in pool else i
        circle = [pool[(start + k) % len(pool)] for k in range(len(pool))]
        for checker in [c for c in circle if c != owner][:per_contribution]:
            load[checker].append(owner)
    return {c: owned for c, owned in load.items() if owned}


@dataclass(frozen=True)
class Judgement:
    """What the checks of one refused round show.

    Parameters
    ----------
    named : dict
        Silo -> why its contribution is judged to have spoiled the aggregate.
    undecided : dict
        Silo -> why its contribution could not be judged (too few checkers answered).
    disputed : dict
        Silo -> one line naming the checkers that found its contribution out of range and
        those that did not (a minority: it is not named; one of them misreported).
    """

    named: dict[str, str]
    undecided: dict[str, str]
    disputed: dict[str, str]


def judge_checks(
    asked: Mapping[str, Sequence[str]],
    reports: Mapping[str, CheckReport],
    *,
    bad_round: int,
    max_ratio: float,
) -> Judgement:
    """Name the silos whose contribution a strict majority (at least two) of its checkers
    found more than ``max_ratio`` times above or below their own model's norm.

    Parameters
    ----------
    asked : Mapping[str, Sequence[str]]
        Checker -> the owners it was sent (:func:`assign_checkers`).
    reports : Mapping[str, CheckReport]
        Checker -> its signed answer (only checkers whose reply was accepted).
    bad_round : int
        The refused round; answers about another round are ignored.
    max_ratio : float
        The bound (> 1).
    """
    votes: dict[str, dict[str, float]] = {owner: {} for owned in asked.values() for owner in owned}
    for checker, owned in asked.items():
        report = reports.get(checker)
        if report is None or report.bad_round != bad_round:
            continue
        for owner in owned:
            if owner in report.norms:
                votes[owner][checker] = contribution_ratio(report.norms[owner], report.reference)
    named: dict[str, str] = {}
    undecided: dict[str, str] = {}
    disputed: dict[str, str] = {}
    for owner, ratios in sorted(votes.items()):
        if len(ratios) < 2:
            undecided[owner] = f"{len(ratios)} of its checkers answered, at least 2 are needed"
            continue
        bad = sorted(c for c, r in ratios.items() if r > max_ratio)
        good = sorted(c for c in ratios if c not in bad)
        if len(bad) >= 2 and 2 * len(bad) > len(ratios):
            least = min(ratios[c] for c in bad)
            size = "unreadable" if math.isinf(least) else f"{least:.3g}x"
            named[owner] = (
                f"silos {', '.join(bad)} decrypted its contribution to round {bad_round}: its "
                f"norm is {size} off their own model's (the bound is {max_ratio:g}x)"
            )
        elif bad:
            disputed[owner] = (
                f"silos {', '.join(bad)} found its contribution to round {bad_round} out of "
                f"range, silos {', '.join(good)} did not"
            )
    return Judgement(named=named, undecided=undecided, disputed=disputed)
