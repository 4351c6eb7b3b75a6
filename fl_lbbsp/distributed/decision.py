"""The decision every rank takes alike from the gathered windows: the balancer's reports,
the hold gate's verdict, the review of the balancer's allocation, the next sizes and the
next k.

Pure logic on the rows of one exchange (no collective): fed the same rows, every rank
reaches the same sizes, which is why nothing is broadcast. Tests and simulations drive it
with injected times.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021: Sec. 3.1 (batch sizes proportional to the predicted speeds),
Sec. 4 (the loop of gathering times, predicting, reallocating).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core.balancer import BatchSizeBalancer, InvalidReportError, SiloReport
from .cadence import Cadence
from .exchange import RankReport, Row
from .gate import HoldGate, Verdict, WindowStats, review_proposal

__all__ = ["Decision", "balancer_round", "rank_reports", "windows_of"]


class Decision:
    """From one exchange's rows to the next sizes and k.

    Parameters
    ----------
    balancer : BatchSizeBalancer
        The balancer fed every rank's window (as its mean iteration).
    rank_ids : sequence of str
        The balancer's id of each rank, in rank order.
    total : int
        X, the global batch the sizes add up to.
    gate : HoldGate
        The hold step: the sizes move only on a gain beyond the tolerance and the noise.
    cadence : Cadence
        k, backed off while the gate shows the ranks equal.
    review : bool
        Apply a move's allocation only when the window predicts it faster than the sizes
        in force (:func:`~.gate.review_proposal`).
    """

    def __init__(
        self,
        *,
        balancer: BatchSizeBalancer,
        rank_ids: Sequence[str],
        total: int,
        gate: HoldGate,
        cadence: Cadence,
        review: bool,
    ) -> None:
        self.balancer = balancer
        self.rank_ids = tuple(rank_ids)
        self.total = total
        self.gate = gate
        self.cadence = cadence
        self.review = review
        self.last_reports: dict[int, RankReport] = {}
        self.last_verdict: Verdict | None = None
        self.errors: dict[str, InvalidReportError] = {}

    def allocate(self, held: Sequence[int] | None = None) -> tuple[int, ...]:
        """The balancer's sizes for the ranks (``held``: the sizes the gate keeps)."""
        # DDP weights every rank's gradient by its batch size: the global batch's noise is
        # the same whatever the split, so no noise budget (it would only cost speed)
        kept = None if held is None else dict(zip(self.rank_ids, held, strict=True))
        sizes = self.balancer.allocate(self.rank_ids, total=self.total, budget=False, held=kept)
        return tuple(int(sizes[i]) for i in self.rank_ids)

    def decide(self, rows: list[list[float]], sizes: tuple[int, ...]) -> tuple[int, ...]:
        """The sizes after the exchange of ``rows`` (every rank's window, in rank order),
        the sizes in force being ``sizes``; sets :attr:`last_reports`,
        :attr:`last_verdict`, :attr:`errors` (reports the balancer left out, by rank id)
        and the cadence's next k."""
        self.last_reports = rank_reports(rows)
        # the ranks' reports fed together: a slowdown they all share is taken out of them
        self.errors = self.balancer.report_round(balancer_round(self.last_reports, self.rank_ids))
        windows = windows_of(rows)
        verdict = self.gate.judge(windows)
        if self.gate.tolerance <= 0:  # every allocation applied
            after = self.allocate()
        elif verdict.move:
            # the balancer's allocation, unless the window that moved the gate predicts it
            # no faster than the sizes in force
            proposal = self.allocate()
            if self.review:
                verdict = review_proposal(verdict, windows, proposal)
            after = proposal if verdict.move else self.allocate(held=sizes)
        else:  # the gate is the allocation's hold step: held sizes are kept ("held")
            after = self.allocate(held=sizes)
        self.last_verdict = verdict
        self.cadence.update(rows, verdict)
        return after


def rank_reports(rows: list[list[float]]) -> dict[int, RankReport]:
    """Every rank's window from the gathered rows, by rank."""
    return {
        r: RankReport(int(row[Row.SIZE]), float(row[Row.TIME]), int(row[Row.SAMPLES]),
                      int(row[Row.COUNT]))
        for r, row in enumerate(rows)
    }  # fmt: skip


def balancer_round(
    reports: Mapping[int, RankReport], rank_ids: Sequence[str]
) -> dict[str, SiloReport]:
    """One balancer round: each rank's window as its mean iteration, so that the cost fit
    (batch size -> time of a round) does not mix windows of different lengths (k
    changes)."""
    out = {}
    for r, report in reports.items():
        count = max(report.iterations, 1)
        out[rank_ids[r]] = SiloReport(
            batch_size=report.batch_size,
            train_time=report.compute_time / count,
            samples=max(1, round(report.samples / count)),
        )
    return out


def windows_of(rows: list[list[float]]) -> list[WindowStats]:
    """Every rank's window for the gate, in rank order."""
    return [
        WindowStats(batch_size=int(row[Row.SIZE]), time=row[Row.TIME], square=row[Row.SQUARE],
                    iterations=int(row[Row.COUNT]))
        for row in rows
    ]  # fmt: skip
