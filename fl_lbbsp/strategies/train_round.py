"""The Flower side of a training round's replies, around the round engine's decisions.

:class:`TrainRound` is what :meth:`LBBSPFedAvg.aggregate_train
<fl_lbbsp.strategies.LBBSPFedAvg.aggregate_train>` does with a round's replies: each one
is read into a :class:`~fl_lbbsp.core.round.state.Reply`, screened and reported to the
engine with the time the server observed
(:func:`~fl_lbbsp.strategies.intervals.observed_time`); the accepted updates are judged
together (:class:`~fl_lbbsp.strategies.defenses.Defenses`) and summed
(:class:`~fl_lbbsp.strategies.updates.Updates`); the round closes in the engine and is
logged (:func:`~fl_lbbsp.strategies.outcomes.log_decision`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from threadpoolctl import ThreadpoolController

from ..contract import CLIPPED, DISTRUSTED, STALE_SUPERLINK, TRAIN_LOSS, RecordKeys, read_float
from ..core.round.engine import RoundEngine
from ..core.round.state import RoundState, Verdict, silo_round_time
from ..telemetry import TelemetryWriter
from .deadline import DeadlineGrid
from .defenses import Defenses, noise_scales
from .intervals import POOL_FIX, observed_time, queued, reply_interval
from .outcomes import RoundOutcomes, log_decision
from .updates import PlainMean, Updates
from .validation import config_record, log_rejected, log_skipped, reply_of

__all__ = ["RoundResult", "TrainRound", "one_blas_thread"]

log = logging.getLogger("fl_lbbsp")


@functools.cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()  # scans the loaded BLAS libraries once


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """Hold numpy's BLAS (OpenBLAS) to one thread in the block (``threadpoolctl``).

    The server's reductions over the replies (each update's distance, the mean, the
    clipping) are memory-bound: BLAS threads gain nothing on them, and on a busy machine
    they spin for a core that is not free. Measured on this 2-core machine beside other
    work: ``np.vdot`` of a LeNet-5 update took 0.16 ms or, at random, 3-13 ms, which made a
    1,000-silo round's screening 13 s instead of 0.2 s; on one thread it stays at 0.2 ms.
    """
    limit: contextlib.AbstractContextManager[Any] = _blas().limit(limits=1, user_api="blas")
    return limit


@dataclass
class RoundResult:
    """What a round's replies came to.

    Parameters
    ----------
    arrays : ArrayRecord | None
        The new global model (``None``: the round is skipped).
    contents : list[RecordDict]
        The replies whose updates entered it, each at the weight its update had (for the
        app's metric aggregation).
    skipped : str | None
        Why there is no new model (``None``: there is one).
    """

    arrays: ArrayRecord | None
    contents: list[RecordDict]
    skipped: str | None


class TrainRound:
    """Screens, reports, judges, sums and logs one training round's replies.

    Parameters
    ----------
    engine, keys, defenses, outcomes, telemetry :
        The strategy's (:class:`~fl_lbbsp.strategies.LBBSPFedAvg` builds it).
    weight_key : str
        The aggregation weight's metric (``num-examples``, or ``batch-size`` on a
        parameter server).
    poll_interval : float | None
        Seconds between two pulls for replies (a telemetry field).
    clock : Callable[[], float] (default: time.perf_counter)
        The clock of the round's wall time, which started ``state.started`` on it.
    """

    def __init__(
        self,
        *,
        engine: RoundEngine,
        keys: RecordKeys,
        weight_key: str,
        defenses: Defenses,
        outcomes: RoundOutcomes,
        telemetry: TelemetryWriter,
        poll_interval: float | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.engine = engine
        self.keys = keys
        self.weight_key = weight_key
        self.defenses = defenses
        self.outcomes = outcomes
        self.telemetry = telemetry
        self.poll_interval = poll_interval
        self.clock = clock
        self.taken: list[tuple[float, dict[str, int]]] = []
        """Each closed round's time and the batch size sent to each silo: its wall time, or
        its slowest silo's reported round where that is longer (times emulated and not
        waited out, which the run stands for)."""

    def aggregate(
        self,
        state: RoundState,
        replies: Iterable[Message],
        *,
        updates: Updates[Any],
        scheme: str,
        grid: DeadlineGrid | None,
        observe: bool,
    ) -> RoundResult:
        """The round's new global model from its replies, the round closed and logged.

        Parameters
        ----------
        state : RoundState
            The round, as the engine planned it.
        replies : iterable of Message
            The train replies the grid collected.
        updates : Updates
            How the replies' updates are read, checked and summed (begun for this round).
        scheme : str
            The strategy's scheme, for the logs.
        grid : DeadlineGrid | None
            The grid that ran the round under its deadline (``None``: another one).
        observe : bool
            Whether the grid's observed wall times check the silos' claimed times.
        """
        wall = self.clock() - state.started
        received_at = time.time()
        replies = list(replies)
        state.waited = None if grid is None else grid.last_timeout
        sent_ids = {msg.metadata.message_id for msg in state.sent} - {""}
        accepted: dict[str, tuple[Verdict[Any], RecordDict, float]] = {}
        answered: dict[str, Message] = {}
        losses: list[Any] = []
        intervals: dict[str, tuple[float, float]] = {}
        stale = self._undecorated(replies)
        for msg in replies:
            late = None if grid is None else grid.seconds_late(msg)
            reply = reply_of(msg, keys=self.keys, sent_ids=sent_ids, seconds_late=late)
            losses.append((reply.metrics or {}).get(TRAIN_LOSS))
            parse = partial(updates.parse, reply.payload, reply.metrics or {}, state)
            verdict = self.engine.screen(state, reply, parse)
            if not verdict.accepted:
                reason = verdict.reason or ""
                if stale and "@lbbsp_train()" in reason:
                    reason = STALE_SUPERLINK
                self.reject(state, scheme, verdict.silo, verdict.node, reason)
                continue
            answered[verdict.silo] = msg
            metrics = reply.metrics or {}
            wall_time = grid.observed(msg) if grid is not None else None
            observed = observed_time(metrics, wall_time) if observe else None
            if (interval := reply_interval(metrics)) is not None:
                intervals[verdict.silo] = interval
            misuse = self.misuse(state, verdict.silo, msg)
            counts = self.engine.report(
                state, verdict, metrics, observed=observed, waited=wall_time, misuse=misuse
            )
            state.reports[verdict.silo]["replied-at"] = msg.metadata.created_at
            if counts:
                weight = read_float(metrics, self.weight_key)
                accepted[verdict.silo] = (verdict, msg.content, weight)
        # a silo's first round holds its start-up, whose skew is no queue
        warm = [interval for silo, interval in intervals.items() if silo not in state.cold]
        self._queued(state, warm, warn=observe)
        kept, dropped = self._sum(state, accepted, updates, scheme)
        contents = [
            _at_weight(accepted[silo][1], self.weight_key, state.reports[silo].get("capped-weight"))
            for silo in accepted
            if silo in kept
        ]
        arrays, skipped = self._result(state, len(contents), updates, scheme)
        refused = self.defenses.refusals(state, answered, self.keys)
        diverged = self.defenses.diverged(losses)
        arrays = self.defenses.settle(
            state, arrays, refused=refused, replied=len(answered), diverged=diverged
        )
        if diverged is not None and arrays is not None:
            skipped = None  # rolled back: the round's model is the last sane one
        extra = self.engine.close(
            state, replied=(m.metadata.src_node_id for m in replies), wall=wall
        )
        extra["poll_interval"] = self.poll_interval
        if isinstance(updates, PlainMean) and updates.robust is not None:
            extra[CLIPPED] = updates.robust.clipped
            if updates.distrusted:
                extra[DISTRUSTED] = updates.distrusted  # named in the log by the clip
        self.taken.append((max(wall, self._slowest(state)), dict(state.shares)))
        # last reply created (its silo's clock) -> here: reply transfer and polling
        created = [r["replied-at"] for r in [*state.reports.values(), *dropped.values()]]
        extra["reply_delay"] = received_at - max(created) if created else None
        if self.engine.selector is not None:
            extra["dropped"] = dropped
        log_decision(
            scheme=scheme,
            state=state,
            keys=self.keys,
            rejected=state.rejected,
            telemetry=self.telemetry,
            wall=wall,
            extra={**extra, "skipped": skipped},
            silo_id=self.engine.silo_id,
        )
        return RoundResult(arrays=arrays, contents=contents, skipped=skipped)

    def _sum(
        self,
        state: RoundState,
        accepted: dict[str, tuple[Verdict[Any], RecordDict, float]],
        updates: Updates[Any],
        scheme: str,
    ) -> tuple[set[str], dict[str, Any]]:
        """Add the updates the selector keeps and the defences let through, each at its
        (capped) weight; return the silos kept and the records of those dropped."""
        kept, dropped = self.engine.select(state, accepted)
        far = self.defenses.judge(
            state, updates, {s: accepted[s][0].update for s in accepted if s in kept}
        )
        for silo, why in far.items():
            self.reject(state, scheme, silo, accepted[silo][0].node, why)
        kept -= set(far)
        weights = self.engine.weights({s: accepted[s][2] for s in accepted if s in kept})
        scales = noise_scales(state)
        for silo, (weight, capped) in weights.items():
            if capped is not None:
                state.reports[silo]["capped-weight"] = weight
                if self.outcomes.first_time(silo, "capped weight"):
                    log.warning("round %d: silo %s: %s", state.server_round, silo, capped)
            updates.add(
                accepted[silo][0].update,
                weight=weight,
                scale=scales.get(silo, 1.0),
                silo=silo,
                claimed=self.engine.claimed(silo),
            )
        return kept, dropped

    def _result(
        self, state: RoundState, n: int, updates: Updates[Any], scheme: str
    ) -> tuple[ArrayRecord | None, str | None]:
        """The new global model from ``n`` accepted updates, or why the round is skipped."""
        skipped = arrays = None
        least = self.engine.limits.min_train_silos
        if n < least:
            replies = "reply" if n == 1 else "replies"
            skipped = f"{n} valid {replies}, min_train_silos is {least}"
        else:
            try:
                arrays = updates.result()
            except ValueError as err:
                skipped = f"no aggregate: {err}"
        if skipped is not None:
            log_skipped(
                self.telemetry, scheme=scheme, server_round=state.server_round, reason=skipped
            )
        return arrays, skipped

    def _undecorated(self, replies: list[Message]) -> bool:
        """Whether every reply of the round lacks the silo id and the decorator's metrics
        (``train-time``, ``batch-size``): the app that ran is not decorated, or it is not
        the app the user decorated (a stale local SuperLink)."""
        if not replies:
            return False
        for msg in replies:
            if msg.has_error():
                return False
            record = config_record(msg.content, self.keys.silo_record)
            if record is not None and self.keys.silo_id in record:
                return False
            for metrics in msg.content.metric_records.values():
                if self.keys.train_time in metrics or self.keys.batch_size in metrics:
                    return False
        return True

    def _slowest(self, state: RoundState) -> float:
        """The longest round a silo of ``state`` reported (``train-time`` plus ``he-time``,
        as the claim check left them); 0 without one."""
        times = []
        for record in state.reports.values():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                times.append(silo_round_time(record, self.keys))
        return max((t for t in times if math.isfinite(t)), default=0.0)

    def _queued(
        self, state: RoundState, intervals: list[tuple[float, float]], *, warn: bool
    ) -> None:
        """Warn, once a run, when the replies' intervals show the silos queued (a pool of
        fewer actors than silos); DEBUG after, and always where the wall time is not the
        silos' (``warn`` off: an in-process grid runs them in turn by design)."""
        most = queued(intervals)
        if most is None:
            return
        state.queued = True  # its waits hold the queue, not the links
        first = self.outcomes.first_time("", "silos queued") and warn
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "round %d: at most %d of the %d silos computed at a time: %s",
            state.server_round,
            most,
            len(intervals),
            POOL_FIX,
        )

    def misuse(self, state: RoundState, silo: str, msg: Message) -> str | None:
        """What the silo says it did other than it was told (its own loader, extra
        epochs, another batch size), logged once per silo; ``None``: nothing."""
        record = config_record(msg.content, self.keys.silo_record)
        text = None if record is None else record.get(self.keys.misuse)
        if not isinstance(text, str) or not text:
            return None
        text = text[:300]
        level = logging.WARNING if self.outcomes.first_time(silo, "misuse") else logging.DEBUG
        log.log(
            level,
            "round %d: silo %s did not train as instructed, its time is left out of balancing: %s",
            state.server_round,
            silo,
            text,
        )
        return text

    def reject(
        self, state: RoundState, scheme: str, silo: str, node: int | str, reason: str
    ) -> None:
        """One telemetry event for a reply left out of the round, and one warning the
        first time this silo's reply is rejected for this cause (DEBUG after)."""
        state.rejected.append(
            log_rejected(
                self.telemetry,
                scheme=scheme,
                server_round=state.server_round,
                silo=silo,
                node=node,
                reason=reason,
                first=self.outcomes.first_time(silo, reason),
            )
        )


def _at_weight(content: RecordDict, key: str, weight: float | None) -> RecordDict:
    """``content`` for the app's metric aggregation, its ``key`` (the aggregation weight)
    replaced by the ``weight`` the model gave it (``None``: as it is), so that an inflated
    claim steers the round's averaged metrics no more than the model; the reply itself is
    left untouched."""
    if weight is None:
        return content
    return RecordDict(
        {
            name: MetricRecord({**record, key: weight})
            if isinstance(record, MetricRecord) and key in record
            else record
            for name, record in content.items()
        }
    )
