"""Baselines LB-BSP is measured against: the two variants the paper rejects, and
partial aggregation (backup workers).

* :class:`LBBSPTau` tunes the number of local steps tau instead of the batch size B.
* :class:`LBBSPEta` tunes B like LB-BSP but scales the learning rate eta with it.
* :class:`PartialAggregation` aggregates only the k fastest of the n replies.

All three are :class:`~fl_lbbsp.strategies.LBBSPFedAvg` composed with one piece of the
round engine (:class:`~fl_lbbsp.core.round.rewriters.TauRewriter`,
:class:`~fl_lbbsp.core.round.rewriters.EtaRewriter`,
:class:`~fl_lbbsp.core.round.rewriters.FastestReplies`),
so they share its balancer, telemetry, deadlines and record keys, and run wherever it runs.

References
----------
Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments", IEEE TCC
2021, Sec. 3.5 (tune B, keep tau and eta; the tau and eta variants bias the aggregate on
non-IID silos) and Sec. 5.5, Fig. 13. Chen, Pan, Monga, Bengio and Jozefowicz, "Revisiting
Distributed Synchronous SGD", arXiv:1604.00981, 2016 (backup workers: aggregate the first
c of n updates), as partial pushing in the PSP-SGD paper (shared/seeds/003).
"""

from __future__ import annotations

from typing import Any

from ..core.round.rewriters import EtaRewriter, FastestReplies, TauRewriter
from .fedavg import LBBSPFedAvg

__all__ = ["LBBSPEta", "LBBSPTau", "PartialAggregation"]


class LBBSPTau(LBBSPFedAvg):
    """LB-BSP variant that tunes the local steps tau instead of the batch size.

    The balancer splits the round's work exactly as for LB-BSP, in batch-size units
    ``x_i`` summing to ``X = n * B_init``; silo i is then sent
    ``tau_i = max(1, round(tau * x_i / B_init))`` local steps at ``B_init``, so it
    processes about ``x_i * tau`` samples, as under LB-BSP. eta stays the same for all.
    Faster silos take more steps towards their own local optimum, so on non-IID data
    their classes weigh more in the aggregate: the paper rejects this variant for that
    reason (Sec. 3.5; lower accuracy in Fig. 13).

    The balancer works in the equivalent batch size ``round(samples / tau)`` of each
    reply; the reply's metrics (and so the telemetry) carry it as ``batch-size``, the
    batch size the silo really used as ``step-batch-size`` and its steps as
    ``local-steps``.

    Parameters
    ----------
    **settings :
        The keyword arguments of :class:`~fl_lbbsp.strategies.LBBSPFedAvg`;
        ``local_steps`` is the base tau, ``initial_batch_size`` every silo's batch size.
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(rewriter=TauRewriter(), **settings)


class LBBSPEta(LBBSPFedAvg):
    """LB-BSP variant that scales the learning rate with the batch size.

    Batch sizes are balanced as in LB-BSP; silo i is sent ``eta_i = eta * B_i / B_init``
    (the linear scaling rule of large-batch SGD) with the same tau. Parameters are still
    averaged by local dataset size. Faster silos then move further each round, so their
    classes weigh more on non-IID data: the paper rejects this variant (Sec. 3.5; lower
    accuracy in Fig. 13).

    Parameters
    ----------
    **settings :
        The keyword arguments of :class:`~fl_lbbsp.strategies.LBBSPFedAvg`; ``lr`` is
        eta at ``B_init``.
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(rewriter=EtaRewriter(), **settings)


class PartialAggregation(LBBSPFedAvg):
    """Backup workers: aggregate only the ``replies`` fastest silos of each round.

    Every silo trains with ``B_init`` (balancing off by default, as in the baselines of
    the papers). The server averages, weighted by ``num-examples``, the ``replies``
    replies with the shortest reported round time (``train-time`` plus ``he-time``) and
    discards the others: their silos' data sits out that round. The telemetry's round
    time and idle fraction cover the kept silos only (the round ends when the k-th
    fastest silo replies); the discarded ones are listed under ``dropped``.

    The reported times decide, not the arrival order (silos emulated one after the other
    rank as if side by side); the round time saved is realised in a deployment only where
    the deadline (``deadline_margin``) cuts the stragglers off.

    Parameters
    ----------
    replies : int | None (default: None)
        k, the replies aggregated per round; ``None``: one fewer than the silos sent
        the round (at least one). With fewer replies than k, all are aggregated.
    balance : bool (default: False)
        ``True`` also balances the batch sizes (LB-BSP with backup workers).
    **settings :
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`.
    """

    def __init__(
        self, *, replies: int | None = None, balance: bool = False, **settings: Any
    ) -> None:
        super().__init__(balance=balance, selector=FastestReplies(replies), **settings)
