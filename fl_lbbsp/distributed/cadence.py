"""How often the ranks exchange their times: k iterations, fixed or automatic, backed off
while the hold gate shows the ranks equal.

On equal ranks every exchange ends in the same verdict (the sizes stay), yet each costs
an all_gather and the balancer's decision (its cost fits, a few hundred microseconds per
rank; measured 1.3 ms of CPU per rank at 4 gloo ranks). k doubles from one exchange to
the next, up to ``backoff`` times its base, only while the windows show the ranks equal
(:attr:`~.gate.Verdict.equal`: the gain within the tolerance, or within one standard
deviation of the noise measured between windows); any other window (a lead not yet told
from the noise, a lead seen, a move, no times) brings k back to its base at once, so a
rank that falls behind is judged, confirmed and moved in windows of the base length.
"""

from __future__ import annotations

from typing import Any, Literal

from .exchange import Row
from .gate import Verdict, auto_every

__all__ = ["Cadence"]


class Cadence:
    """k, the iterations between the exchanges.

    Parameters
    ----------
    every : int or "auto"
        The base k; ``"auto"``: the smallest keeping the exchange's cost within
        ``overhead_share`` of the wall time (:func:`~.gate.auto_every`), 1 until known.
    overhead_share : float
        With ``every="auto"``: the share of wall time balancing may take.
    max_every : int
        The largest k (of ``"auto"``, and of the backoff unless ``every`` is larger).
    backoff : int
        The largest factor on the base k while the gate holds the sizes (1: none).
    """

    def __init__(
        self,
        *,
        every: int | Literal["auto"],
        overhead_share: float,
        max_every: int,
        backoff: int,
    ) -> None:
        self.every = every
        self.overhead_share = overhead_share
        self.max_every = max_every
        self.backoff = backoff
        self.base = 1 if every == "auto" else every
        self.factor = 1
        self.k = self.base

    def update(self, rows: list[list[float]], verdict: Verdict) -> int:
        """k after an exchange: the base (fixed, or ``"auto"`` from the exchange's cost,
        the shortest time any rank spent in it, and rank 0's wall time per iteration),
        times the backoff's factor: doubled when ``verdict`` shows the ranks equal
        (:attr:`~.gate.Verdict.equal`), else 1."""
        if self.every != "auto":
            self.base = self.every
        else:
            head = rows[0]
            cost = min(row[Row.EXCHANGE] for row in rows)
            self.base = auto_every(
                cost,
                head[Row.WALL],
                head[Row.COUNT],
                self.overhead_share,
                self.max_every,
                self.base,
            )
        self.factor = min(2 * self.factor, self.backoff) if verdict.equal else 1
        self.k = max(self.base, min(self.base * self.factor, self.max_every))
        return self.k

    def state(self) -> dict[str, Any]:
        """k, its base and the backoff's factor (what rank 0 hands the others)."""
        return {"every": self.k, "base": self.base, "factor": self.factor}

    def adopt(self, state: dict[str, Any]) -> None:
        """Take another rank's :meth:`state`."""
        self.k, self.base, self.factor = (
            int(state["every"]),
            int(state["base"]),
            int(state["factor"]),
        )

    def restart(self, saved_base: int) -> None:
        """After a resume: the base k saved (``"auto"``; a fixed ``every`` keeps its own),
        no backoff."""
        if self.every == "auto":
            self.base = saved_base
        self.k, self.factor = self.base, 1
