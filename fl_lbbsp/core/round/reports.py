"""Reporting a round's accepted replies to the balancer, and closing the round.

The part of the round engine (:class:`~fl_lbbsp.core.round.engine.RoundEngine`) that comes
after a reply is screened: :meth:`RoundReporting.report` has what an accepted reply claims
judged by the engine's claim policy (:class:`~fl_lbbsp.core.round.trust.ClaimPolicy`) and
queues its timing; :meth:`RoundReporting.close`
notes who missed the round, learns the messaging overhead, judges the first observed
round's held claims against its honest gap, and feeds the round's reports to the balancer
together; :meth:`RoundReporting.select` keeps a backup-worker round's fastest replies.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ...contract import PREDICTED_SPEED, SLOWDOWN, TRANSFER_TIME, WAITED_TIME, RecordKeys
from ..balancer import BatchSizeBalancer, InvalidReportError, SiloReport
from ..settings import BalancingConfig
from ..silo.transfer import TransferTimes
from .deadline import OverheadTracker, honest_gap
from .memory_caps import MemoryCaps
from .rewriters import FastestReplies, InstructionRewriter
from .state import Node, RoundState, Verdict, silo_round_time
from .trust import ClaimPolicy

__all__ = ["RoundReporting", "held_start_up"]

log = logging.getLogger("fl_lbbsp")


class RoundReporting:
    """Reports and round closing of :class:`~fl_lbbsp.core.round.engine.RoundEngine` (a part of
    it, over its state: the balancer, the claim checker, the overhead, the node <-> silo
    ids)."""

    config: BalancingConfig
    keys: RecordKeys
    weight_key: str
    rewriter: InstructionRewriter | None
    selector: FastestReplies | None
    require_valid_report: bool
    balancer: BatchSizeBalancer
    claims: ClaimPolicy
    memory: MemoryCaps
    overhead: OverheadTracker
    transfer: TransferTimes
    silo_of_node: dict[Node, str]
    node_of_silo: dict[str, Node]
    provisional: dict[str, SiloReport]
    _unlearned_wall: float | None

    def silo_id(self, node: Node) -> str:
        """The stable silo id last reported by ``node`` (``node-<id>``, or a legacy
        client's cid, before that)."""
        return self.silo_of_node.get(node, node if isinstance(node, str) else f"node-{node}")

    def report(
        self,
        state: RoundState,
        verdict: Verdict[Any],
        metrics: Mapping[str, Any],
        *,
        observed: float | None = None,
        waited: float | None = None,
        misuse: str | None = None,
    ) -> bool:
        """Bound an accepted reply's claims, feed its timing to the balancer; record it.

        The claim policy judges the claims first (the defence layer's rules:
        :mod:`fl_lbbsp.security.claims`): in FL a dataset size it rejects leaves the update
        out, with one warning, the balancer not fed; times it replaces (with
        ``check_times`` and ``observed``) are warned of, the record keeping the claim as
        ``claimed-train-time`` / ``claimed-he-time``. An unusable report (non-finite
        time, zero batch size, ...) is left out of balancing with a warning and
        ``invalid-report`` in the record; the silo keeps its estimate.

        Parameters
        ----------
        state : RoundState
            The round.
        verdict : Verdict
            The accepted reply's verdict.
        metrics : Mapping[str, Any]
            Its metrics.
        observed : float | None (default: None)
            Seconds the server observed from sending the silo its instruction to
            receiving its reply (the adapter's ``received_at - sent_at``); ``None``: not
            observed (no cross-check).
        waited : float | None (default: None)
            Seconds from sending the instruction to receiving the reply, as the server
            saw them, when ``observed`` is something else (the reply's own compute
            interval): what the silo's transfer time is learned from (its link, its
            start-up, its messaging: :meth:`_add_transfer`). ``None``: ``observed``.
        misuse : str | None (default: None)
            What the silo says it did other than instructed (its own loader, extra
            epochs, another batch size): its time does not measure its capacity at the
            batch size sent, so it is kept out of balancing (noted as ``misuse`` and
            ``invalid-report``); in FL its update still counts.

        Returns
        -------
        bool
            Whether the reply enters the aggregate: in FL unless its dataset size is
            rejected; in cluster mode (``require_valid_report``) only with a usable report.
        """
        keys, silo = self.keys, verdict.silo
        if self.node_of_silo.get(silo) != verdict.node:
            state.cold.add(silo)  # first report, or the silo came back on another node
            self.transfer.forget(silo)  # on another node, perhaps behind another link
        self.node_of_silo[silo] = verdict.node
        self.silo_of_node[verdict.node] = silo
        if self.rewriter is not None:
            metrics = self.rewriter.to_balancer_units(metrics, keys, self.config)
        sent = state.instructions.get(verdict.node)
        share = None if sent is None else sent.share
        record: dict[str, Any] = {k: v for k, v in metrics.items() if not isinstance(v, list)}
        record["batch-size-sent"] = share
        if self.weight_key == keys.num_examples and keys.num_examples in metrics:
            refused = self.claims.check_size(silo, metrics[keys.num_examples])
            if refused is not None:
                log.warning(
                    "round %d: update of silo %s left out, claim rejected: %s",
                    state.server_round,
                    silo,
                    refused,
                )
                record["invalid-report"] = record["rejected-claim"] = refused
                state.reports[silo] = record
                return False
        if misuse is not None:
            record["misuse"] = misuse
            record["invalid-report"] = f"misuse: {misuse}"
            state.reports[silo] = record
            return not self.require_valid_report
        if sent is not None:  # trained as instructed: that size fits its memory
            self.memory.ran(silo, sent.batch_size)
        if self.config.tuning.check_times is False:
            observed = None
        train = _real(metrics.get(keys.train_time))
        if train is not None and waited is not None:
            record[WAITED_TIME] = waited
        if train is not None and observed is not None:
            record["observed-time"] = observed
            record["claimed-time"] = train + (_real(metrics.get(keys.he_time)) or 0.0)
            if not self.claims.learned and not self.require_valid_report:
                # No overhead learned yet: judged at close, against the whole round's
                # gaps (a first round's wall times hold cold starts; one silo's alone
                # cannot tell a lie from a slow start)
                state.held[silo] = (metrics, record, share, observed)
                state.reports[silo] = record
                return True
        self._feed(state, silo, metrics, record, share, observed)
        state.reports[silo] = record
        if self.require_valid_report and "invalid-report" in record:
            log.warning(
                "update of silo %s left out of this round: %s", silo, record["invalid-report"]
            )
            return False
        return True

    def _feed(
        self,
        state: RoundState,
        silo: str,
        metrics: Mapping[str, Any],
        record: dict[str, Any],
        share: int | None,
        observed: float | None,
        *,
        overhead: float | None = None,
    ) -> None:
        """Bound a report's claimed times and queue it for the balancer, which gets the
        round's reports together when it closes (:meth:`BatchSizeBalancer.report_round`);
        note it in ``record``."""
        keys = self.keys
        metrics = self._bounded_times(state, silo, metrics, record, observed, overhead)
        cap = metrics.get(keys.max_batch_size)
        report = SiloReport(
            batch_size=metrics.get(keys.batch_size, share or 0),
            train_time=metrics.get(keys.train_time, math.nan),
            samples=metrics.get(keys.samples_processed),
            cpu_percent=metrics.get(keys.cpu_percent),
            memory_percent=metrics.get(keys.memory_percent),
            max_batch_size=cap if cap else None,
            fixed_time=metrics.get(keys.he_time),
        )
        try:
            report.validate()
        except InvalidReportError as err:
            log.warning("round report of silo %s left out of balancing: %s", silo, err)
            record["invalid-report"] = str(err)
        else:
            state.feed[silo] = (report, record)

    def _bounded_times(
        self,
        state: RoundState,
        silo: str,
        metrics: Mapping[str, Any],
        record: dict[str, Any],
        observed: float | None,
        overhead: float | None,
    ) -> Mapping[str, Any]:
        """The metrics with their claimed times bounded and cross-checked against
        ``observed`` net of ``overhead`` (``None``: the learned one)
        (:meth:`~fl_lbbsp.core.round.trust.ClaimPolicy.check_times`); ``record`` notes what
        changed."""
        keys = self.keys
        train, he = _real(metrics.get(keys.train_time)), _real(metrics.get(keys.he_time))
        if train is None:
            return metrics  # the balancer rejects it
        checked = self.claims.check_times(
            train, he, observed=observed, overhead=overhead, silo=silo
        )
        if checked.note is None:
            return metrics
        log.warning(
            "round %d: claimed times of silo %s replaced: %s%s",
            state.server_round,
            silo,
            checked.note,
            " (the silo emulates its times: a cost model's, or a slowdown's not waited out, "
            "@lbbsp_train(emulate_wait=False), are not wall time; give the strategy "
            "check_times=False for such an emulation)"
            if SLOWDOWN in metrics
            else "",
        )
        bounded = dict(metrics)
        record["claimed-train-time"] = train
        bounded[keys.train_time] = record[keys.train_time] = checked.train_time
        if he is not None:
            record["claimed-he-time"] = he
            bounded[keys.he_time] = record[keys.he_time] = checked.he_time
        return bounded

    def select(self, state: RoundState, silos: Iterable[str]) -> tuple[set[str], dict[str, Any]]:
        """The accepted silos whose updates enter the aggregate, and the records of those
        dropped (taken out of the round's reports): all of them without a selector."""
        accepted = list(silos)
        if self.selector is None:
            return set(accepted), {}
        times = {silo: silo_round_time(state.reports[silo], self.keys) for silo in accepted}
        kept = self.selector.select(times, sent=len(state.instructions))
        return kept, {silo: state.reports.pop(silo) for silo in accepted if silo not in kept}

    def close(
        self, state: RoundState, *, replied: Iterable[Node], wall: float | None
    ) -> dict[str, Any]:
        """Note who sent no usable reply in time; learn the messaging overhead.

        Returns
        -------
        dict
            Telemetry fields of the round: ``deadline``, ``missed``, ``sent``, ``sent_at``
            and ``common_factor`` (the slowdown the round's silos shared, taken out of
            their reports: :meth:`BatchSizeBalancer.report_round`).
        """
        got = set(replied)
        missed = [node for node in state.instructions if node not in got]
        if missed:
            log.warning(
                "no usable reply from %s within %s s: left out, estimates kept",
                ", ".join(self.silo_id(node) for node in missed),
                "n/a" if state.deadline is None else f"{state.deadline:.1f}",
            )
        times = [
            silo_round_time(r, self.keys)
            for r in state.reports.values()
            if "invalid-report" not in r and self.keys.train_time in r
        ]
        # observed minus claimed time of each timed reply: the messaging overhead (a cold
        # start is not messaging: a silo's first round does not teach it)
        gaps = [
            r["observed-time"] - r["claimed-time"]
            for silo, r in state.reports.items()
            if "observed-time" in r and silo not in state.cold
        ]
        if state.held:
            # the first observed round: each claim judged against the round's honest gap
            # (a silo the selector dropped is fed too: its timing is no less true)
            reference = honest_gap(
                gaps
                or [
                    r["observed-time"] - r["claimed-time"]
                    for r in state.reports.values()
                    if "observed-time" in r
                ]
            )
            for silo, (metrics, record, share, observed) in state.held.items():
                self._feed(state, silo, metrics, record, share, observed, overhead=reference)
            state.held.clear()
        if wall is not None and state.cold and not missed:
            self._unlearned_wall = wall  # a round that waited on its deadline says nothing
        # the deadline's overhead: what each timed reply took beyond its claimed compute
        # from the send on (``waited-time``, where ``observed-time`` is only the reply's
        # own compute interval: a ClientApp's start-up and its messaging count too)
        waits = [
            r.get(WAITED_TIME, r["observed-time"]) - r["claimed-time"]
            for silo, r in state.reports.items()
            if "observed-time" in r and silo not in state.cold
        ]
        if waits and not state.cold:
            # the round's overhead as its silos saw it, at most twice what its honest ones
            # did (:func:`honest_gap`): room for the spread between honest silos, none for
            # a silo late for its own reasons, which would stretch every later deadline
            honest = honest_gap(waits) or 0.0
            self.overhead.observe(min(max(waits), 2.0 * honest), 0.0)
        elif not missed and not state.cold and not state.slow and wall is not None and times:
            self.overhead.observe(wall, max(times))
        self.claims.learn_overhead(gaps)
        self._feed_balancer(state)
        return {
            "deadline": state.deadline,
            "missed": [self.silo_id(node) for node in missed],
            "sent": state.shares,
            "sent_at": state.sent_at,
            "common_factor": self.balancer.common_factor,
        }

    def _feed_balancer(self, state: RoundState) -> None:
        """Feed the round's usable reports to the balancer at once (so that it can take
        out the slowdown they share) and note each silo's new predicted speed.

        A cold report (:attr:`RoundState.cold`) is fed, since it is all that is known of
        the silo, but only until the silo's first warm report: where no cost line of the
        silo explains both (:func:`held_start_up`: start-up, not capacity), it restarts
        the silo's estimate instead of being averaged with it (Chen et al., TCC 2021, Sec.
        3.3: the speed to predict is the silo's steady capacity, not its start-up)."""
        threshold = self.balancer.tuning.change_threshold
        self._add_transfer(state)
        for silo, (report, _) in state.feed.items():
            if silo in state.cold:
                self.provisional[silo] = report
            elif silo in self.provisional:
                cold = self.provisional.pop(silo)
                if held_start_up(cold, report, threshold=threshold):
                    self.balancer.restart(silo)  # the cold report was start-up, not speed
        self.balancer.report_round({silo: report for silo, (report, _) in state.feed.items()})
        for silo, (_, record) in state.feed.items():
            record[PREDICTED_SPEED] = self.balancer.predicted_speed(silo)
        state.feed.clear()

    def _add_transfer(self, state: RoundState) -> None:
        """Learn each fed silo's transfer time from the seconds the server waited for its
        reply (``waited-time``, else ``observed-time``) less its bounded claimed compute
        (a claim the observation contradicted was replaced by it, so a time lie teaches no
        transfer; a cold report teaches none, nor does a round whose silos queued), and
        add its learned transfer time beyond the smallest silo's
        (:meth:`~fl_lbbsp.core.silo.transfer.TransferTimes.excess`) to its report's fixed
        per-round time, which its silo model smooths and its cost line carries as
        ``he-time`` (a silo behind a slow link gets a smaller batch, to finish with the
        others); noted as ``transfer-time`` in its record."""
        self.transfer.observe(
            {
                silo: waited - report.train_time - (report.fixed_time or 0.0)
                for silo, (report, record) in state.feed.items()
                if silo not in state.cold
                and not state.queued
                and (waited := record.get(WAITED_TIME, record.get("observed-time"))) is not None
            }
        )
        extra = self.transfer.excess(state.feed)
        for silo, seconds in extra.items():
            report, record = state.feed[silo]
            record[TRANSFER_TIME] = seconds
            if seconds > 0:
                fixed = (report.fixed_time or 0.0) + seconds
                state.feed[silo] = (replace(report, fixed_time=fixed), record)


def held_start_up(cold: SiloReport, warm: SiloReport, *, threshold: float) -> bool:
    """Whether a silo's first (cold) report held start-up, judged by its first warm one.

    Both are one silo's capacity when one cost line ``t = tau (a x + b)`` with ``a, b >= 0``
    explains them: its step time at the warm batch size is then between the cold one's
    and the cold one's scaled by the batch sizes' ratio ``r = x_warm / x_cold`` (``a = 0``
    and ``b = 0`` are the two ends). The cold report held start-up (or the silo changed)
    when the warm step time lies outside ``[min(1, r), max(1, r)]`` times the cold one by
    more than the factor ``1 + threshold``. A speed (samples per second) cannot be
    compared across batch sizes: with a fixed cost per step a silo given a smaller batch
    processes fewer samples per second at the same capacity, and a cold report would be
    judged start-up for that alone.

    Parameters
    ----------
    cold, warm : SiloReport
        The silo's first report and its first warm one (valid).
    threshold : float
        The smallest relative deviation that counts (``change_threshold``), > 0.

    References
    ----------
    Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments", IEEE
    TCC 2021, Sec. 3.3 (the steady capacity to predict); the cost line is Chen et al.,
    SoCC 2020, Sec. 3.3.
    """
    step_cold = float(cold.train_time) / cold.steps
    step_warm = float(warm.train_time) / warm.steps
    ratio = float(warm.batch_size) / float(cold.batch_size)
    low, high = min(1.0, ratio) * step_cold, max(1.0, ratio) * step_cold
    outside = max(math.log(low / step_warm), math.log(step_warm / high), 0.0)
    return outside > math.log1p(threshold)


def _real(value: object) -> float | None:
    """``value`` as a float if it is a finite real number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
