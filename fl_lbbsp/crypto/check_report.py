"""The records of a check round in encrypted mode (:mod:`fl_lbbsp.crypto.blame`): a
checker's :class:`CheckReport`, and :class:`InvalidUpdateError`, the error of every
encrypted record that cannot be used. Plain data, no CKKS: both the encrypted update
(:mod:`fl_lbbsp.crypto.ckks`), which carries a report, and the blame rules read them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

__all__ = [
    "MAX_REPORT_BYTES",
    "REPORT_FORMAT",
    "CheckReport",
    "InvalidUpdateError",
    "is_count",
    "read_note",
]

REPORT_FORMAT = "fl_lbbsp.ckks-check/1"
MAX_REPORT_BYTES = 1 << 16
"""Largest check report or request note read (a few silo ids and numbers)."""


class InvalidUpdateError(ValueError):
    """An encrypted update that cannot be used; the message says why."""


@dataclass(frozen=True)
class CheckReport:
    """A checker's answer: the norms of the contributions it decrypted, and its own model's.

    Parameters
    ----------
    bad_round : int
        The round of the contributions checked.
    reference : float
        L2 norm of the model the checker trains from this round.
    norms : Mapping[str, float | None] (default: {})
        Silo -> L2 norm of its decrypted contribution (divided by its weight); ``None``:
        it could not be decrypted or is not finite.
    """

    bad_round: int
    reference: float
    norms: Mapping[str, float | None] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes."""
        return json.dumps(
            {
                "format": REPORT_FORMAT,
                "round": self.bad_round,
                "reference": self.reference,
                "norms": dict(self.norms),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CheckReport:
        """Inverse of :meth:`to_bytes`.

        Raises
        ------
        InvalidUpdateError
            If the report is not of this format, or a number is not a finite float.
        """
        meta = read_note(data)
        norms = meta.get("norms")
        bad_round, reference = meta.get("round"), meta.get("reference")
        if (
            meta.get("format") != REPORT_FORMAT
            or not isinstance(bad_round, int)
            or isinstance(bad_round, bool)
            or not isinstance(norms, dict)
            or not is_count(reference)
            or not all(isinstance(s, str) and (v is None or is_count(v)) for s, v in norms.items())
        ):
            raise InvalidUpdateError("check report: not of the format " + REPORT_FORMAT)
        return cls(
            bad_round=bad_round,
            reference=float(reference),
            norms={s: None if v is None else float(v) for s, v in norms.items()},
        )


def read_note(data: bytes) -> dict[str, Any]:
    """A check note's JSON object.

    Raises
    ------
    InvalidUpdateError
        If it is too large, not JSON or not an object.
    """
    if len(data) > MAX_REPORT_BYTES:
        raise InvalidUpdateError(f"check note of {len(data)} bytes, at most {MAX_REPORT_BYTES}")
    try:
        meta = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidUpdateError(f"check note: not JSON ({err})") from err
    if not isinstance(meta, dict):
        raise InvalidUpdateError("check note: not a JSON object")
    return meta


def is_count(value: object) -> TypeGuard[float]:
    """A finite number >= 0 (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
