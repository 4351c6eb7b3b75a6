"""Baselines LB-BSP is measured against: the two variants the paper rejects, and
partial aggregation (backup workers).

* :class:`LBBSPTau` tunes the number of local steps tau instead of the batch size B.
* :class:`LBBSPEta` tunes B like LB-BSP but scales the learning rate eta with it.
* :class:`PartialAggregation` aggregates only the k fastest of the n replies.

All three are :class:`~fl_lbbsp.strategies.LBBSPFedAvg` with one hook changed, so they
share its balancer, telemetry, deadlines and record keys, and run wherever it runs.

References
----------
Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments", IEEE TCC
2021, Sec. 3.5 (tune B, keep tau and eta; the tau and eta variants bias the aggregate on
non-IID silos) and Sec. 5.5, Fig. 13. Chen, Pan, Monga, Bengio and Jozefowicz, "Revisiting
Distributed Synchronous SGD", arXiv:1604.00981, 2016 (backup workers: aggregate the first
c of n updates), as partial pushing in the PSP-SGD paper (shared/seeds/003).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from ..contract import STEP_BATCH_SIZE, read_int
from .fedavg import LBBSPFedAvg
from .rounds import natural_key, silo_round_time

__all__ = ["LBBSPEta", "LBBSPTau", "PartialAggregation"]


class _PerNodeConfig(LBBSPFedAvg):
    """LB-BSP whose per-node ConfigRecords get one more change after balancing."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure like LB-BSP, then rewrite each node's ConfigRecord (see the class)."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for msg in messages:
            node_config = msg.content.config_records[self.configrecord_key]
            batch_size = read_int(node_config, self.keys.batch_size)
            self._rewrite(node_config, batch_size)
        return messages

    @abstractmethod
    def _rewrite(self, node_config: ConfigRecord, batch_size: int) -> None:
        """Change one node's ConfigRecord, given its balanced batch size."""


class LBBSPTau(_PerNodeConfig):
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

    @property
    def scheme(self) -> str:
        """``"lbbsp-tau"`` when balancing, ``"fedavg"`` otherwise."""
        return "lbbsp-tau" if self.config.balance else "fedavg"

    def local_steps_for(self, batch_size: int) -> int:
        """Local steps of a silo whose balanced share is ``batch_size``."""
        c = self.config
        return max(1, round(c.local_steps * batch_size / c.initial_batch_size))

    def _rewrite(self, node_config: ConfigRecord, batch_size: int) -> None:
        node_config[self.keys.local_steps] = self.local_steps_for(batch_size)
        node_config[self.keys.batch_size] = self.config.initial_batch_size

    def sent_batch_size(self, node_id: int) -> int | None:
        """Every silo is sent B_init as its batch size (its share is in its steps)."""
        return self.config.initial_batch_size if node_id in self._sent else None

    def _record_report(self, msg: Message) -> tuple[str, dict[str, Any]]:
        """Report a validated reply in the balancer's units: its equivalent share."""
        if msg.content.metric_records:
            self._to_equivalent(next(iter(msg.content.metric_records.values())))
        return super()._record_report(msg)

    def _to_equivalent(self, metrics: MetricRecord) -> None:
        keys = self.keys
        used = metrics.get(keys.batch_size)
        samples = metrics.get(keys.samples_processed)
        if not _positive(used) or not _positive(samples):
            return  # left as reported: the balancer rejects or handles it
        metrics[STEP_BATCH_SIZE] = used  # type: ignore[assignment]
        metrics[keys.local_steps] = round(float(samples) / float(used))  # type: ignore[arg-type]
        metrics[keys.batch_size] = max(1, round(float(samples) / self.config.local_steps))  # type: ignore[arg-type]


class LBBSPEta(_PerNodeConfig):
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

    @property
    def scheme(self) -> str:
        """``"lbbsp-eta"`` when balancing, ``"fedavg"`` otherwise."""
        return "lbbsp-eta" if self.config.balance else "fedavg"

    def lr_for(self, batch_size: int) -> float:
        """Learning rate of a silo given ``batch_size``."""
        c = self.config
        return c.lr * batch_size / c.initial_batch_size

    def _rewrite(self, node_config: ConfigRecord, batch_size: int) -> None:
        node_config[self.keys.lr] = self.lr_for(batch_size)


class PartialAggregation(LBBSPFedAvg):
    """Backup workers: aggregate only the ``replies`` fastest silos of each round.

    Every silo trains with ``B_init`` (balancing off by default, as in the baselines of
    the papers). The server averages, weighted by ``num-examples``, the ``replies``
    replies with the shortest reported round time (``train-time`` plus ``he-time``) and
    discards the others: their silos' data sits out that round. The telemetry's round
    time and idle fraction cover the kept silos only (the round ends when the k-th
    fastest silo replies); the discarded ones are listed under ``dropped``.

    The reported times decide, not the arrival order, so that silos emulated one after the
    other are ranked as if they had run side by side. Flower's grid still collects every
    reply up to the round deadline; the round time saved is the one the telemetry
    reports, realised in a deployment only where the stragglers are cut off by the
    deadline (``deadline_margin``).

    Parameters
    ----------
    replies : int | None (default: None)
        k, the replies aggregated per round; ``None``: one fewer than the silos sent
        the round (at least one). With fewer replies than k, all are aggregated.
    balance : bool (default: False)
        ``True`` also balances the batch sizes (LB-BSP with backup workers).
    initial_batch_size, local_steps, lr, **settings :
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`.
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        replies: int | None = None,
        balance: bool = False,
        **settings: Any,
    ) -> None:
        if replies is not None and (isinstance(replies, bool) or not int(replies) >= 1):
            raise ValueError(f"replies must be a positive integer or None, got {replies!r}")
        super().__init__(
            initial_batch_size=initial_batch_size,
            local_steps=local_steps,
            lr=lr,
            balance=balance,
            **settings,
        )
        self.replies = replies
        self._dropped: dict[str, float] = {}

    @property
    def scheme(self) -> str:
        """``"partial"``, or ``"lbbsp-partial"`` when also balancing."""
        return "lbbsp-partial" if self.config.balance else "partial"

    def kept(self, sent: int) -> int:
        """Replies aggregated in a round sent to ``sent`` silos."""
        return max(1, sent - 1) if self.replies is None else self.replies

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Drop all but the k fastest replies, then aggregate the rest like FedAvg."""
        replies = list(replies)
        times: dict[str, float] = {}
        for msg in replies:
            if msg.has_content():
                times[self._reply_silo(msg)] = self._reply_time(msg)
        order = sorted(times, key=lambda silo: (times[silo], natural_key(silo)))
        self._dropped = {silo: times[silo] for silo in order[self.kept(len(self._sent)) :]}
        return super().aggregate_train(server_round, replies)

    def _reply_silo(self, msg: Message) -> str:
        record = msg.content.config_records.get(self.keys.silo_record)
        if record is not None and self.keys.silo_id in record:
            return str(record[self.keys.silo_id])
        return self.silo_id(msg.metadata.src_node_id)

    def _reply_time(self, msg: Message) -> float:
        """The reply's round time; infinite when it reports none usable."""
        metrics = next(iter(msg.content.metric_records.values()), None)
        try:
            value = silo_round_time(dict(metrics or {}), self.keys)
        except (KeyError, TypeError, ValueError):
            return math.inf
        return value if math.isfinite(value) and value > 0 else math.inf

    def _accept(self, silo: str, record: dict[str, Any]) -> bool:
        return silo not in self._dropped

    def _log_round(
        self,
        server_round: int,
        silos: dict[str, dict[str, Any]],
        wall: float | None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        kept = {s: r for s, r in silos.items() if s not in self._dropped}
        dropped = {s: r for s, r in silos.items() if s in self._dropped}
        super()._log_round(server_round, kept, wall, extra={**(extra or {}), "dropped": dropped})


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
