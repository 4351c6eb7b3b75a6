"""LB-BSP on Flower's Message API: FedAvg with a per-silo batch size every round.

A thin translation between Flower's messages and the round engine
(:mod:`fl_lbbsp.core.engine`), which decides every batch size, screens every reply and
feeds the balancer; the updates are summed in place by an
:class:`~fl_lbbsp.strategies.updates.Updates` as each reply is accepted. The variants
(cluster mode, the tau / eta baselines, backup workers, encrypted updates) are the same
class with another engine option or another ``Updates``.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL: tune B per silo, keep tau and eta).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Self

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from pydantic import ValidationError

from ..contract import RecordKeys, read_float
from ..core.deadline import DeadlinePolicy
from ..core.engine import RoundEngine
from ..core.identity import SiloRegistry, load_registry
from ..core.rewriters import FastestReplies, InstructionRewriter
from ..core.round_state import Node, Reply, RoundState, Verdict
from ..core.settings import CLAIM_SETTINGS
from ..instruction import RoundInstruction
from ..telemetry import TelemetryWriter
from .checkpoint import CheckpointStore, save_checkpoint, start_with_checkpoints
from .config import (
    ServerConfig,
    record_keys,
    setting_error,
    settings_of_run_config,
    split_settings,
)
from .deadline import DeadlineGrid
from .defenses import Defenses
from .outcomes import NoUpdateError, RoundOutcomes, log_decision, round_metrics, route_to_flower
from .rounds import EngineView, log_round
from .updates import PlainMean, Updates
from .validation import log_rejected, log_skipped, reply_of, screen_evaluations

__all__ = ["LBBSPFedAvg", "NoUpdateError"]

log = logging.getLogger("fl_lbbsp")


class LBBSPFedAvg(EngineView, FedAvg):
    """FedAvg whose silos get batch sizes proportional to their predicted speed.

    Before each round the balancer predicts every silo's sample-processing speed (EMA by
    default) and splits the fixed total ``X = n * B_init`` so that all silos finish
    their tau local steps together; tau and eta stay the same for all, and aggregation is
    weighted by each silo's local dataset size (``num-examples``), never by the samples
    it processed, so a faster silo gets a bigger batch and the same say in the model.

    Every train message carries its own ConfigRecord with ``batch-size``,
    ``local-steps``, ``lr`` and ``server-round`` (the caller's record is copied, never
    modified). One log line per round gives each silo's batch size and train time, the
    round time and the idle fraction; the same figures go to ``telemetry_path`` as JSON
    lines.

    Parameters
    ----------
    initial_batch_size, local_steps, lr : int, int, float
        B_init (every silo's batch size in round 1; X = n * B_init every round), tau and
        eta, sent to every silo.
    **settings :
        Every other setting is declared once, with its doc, default and bounds, in a
        settings model, and given here by keyword:

        - balancing (``balance``, ``estimator``, ``allocator``, ``noise_budget``, ...):
          :class:`~fl_lbbsp.core.settings.BalancingConfig` (``False`` for ``balance``
          sends B_init to every silo: plain FedAvg with LB-BSP's telemetry);
        - the server (deadlines, polling, node sampling, telemetry, checkpoints, the
          defences ``max_update_ratio``, ``update_spread_sigmas``, ``max_weight_ratio``,
          and ``max_empty_rounds``): :class:`~fl_lbbsp.strategies.config.ServerConfig`;
        - reply limits (``min_train_silos``, ``max_num_examples``, ``max_reply_bytes``,
          ``extra_metric_keys``: ``None``, the default, lets your own metrics through,
          a tuple makes the check strict): :class:`~fl_lbbsp.core.settings.ReplyLimits`;
        - ``arrayrecord_key``, ``configrecord_key``, ``train_metrics_aggr_fn``,
          ``evaluate_metrics_aggr_fn``: as in :class:`flwr.serverapp.strategy.FedAvg`
          (the aggregation weight is ``keys.num_examples``).
    keys : RecordKeys | Mapping | None (default: None)
        Names of the config and metric entries (``batch-size``, ``train-time``, ...).
    updates : Updates | None (default: None)
        How the replies' updates are read, checked and summed
        (:mod:`fl_lbbsp.strategies.updates`); ``None``: FedAvg's mean by dataset size.
    rewriter : InstructionRewriter | None (default: None)
        Rewrites every balanced instruction (the tau and eta baselines,
        :mod:`fl_lbbsp.core.rewriters`).
    selector : FastestReplies | None (default: None)
        Backup workers: only the fastest accepted replies enter the aggregate.
    silo_registry : str | Path | Mapping | SiloRegistry | None (default: None)
        The federation's silos, their public signing keys and declared dataset sizes
        (``fl-lbbsp keys silos``): every train reply must carry the signature of the
        silo it claims, checked before anything else in it is trusted; a signature
        proves origin, not validity. ``None``: silo ids are believed (one warning).
    clock : Callable[[], float] (default: time.monotonic)
        The clock that times each reply from push to pull (the wall time the claimed
        times are checked against); injected by tests.

    Raises
    ------
    InvalidSettingError
        (a ``ValueError``) On a bad setting: the message names the keyword, what it must
        be and the value; see :class:`~fl_lbbsp.core.settings.BalancingConfig` and
        :class:`~fl_lbbsp.strategies.config.ServerConfig`.
    TypeError
        ``keys`` is neither a ``RecordKeys`` nor a mapping of its fields.

    Notes
    -----
    Every train reply is checked before any of it is aggregated or reported to the
    balancer (:mod:`fl_lbbsp.strategies.validation`): error replies, a second reply from
    the same node or silo, replies to another round's messages or after the deadline,
    oversized replies, missing or extra metrics, times, counts and batch sizes out of
    range, arrays that differ from the global model in names, shapes or dtypes, and NaN or
    inf. A rejected reply gets one warning naming round, silo, node and reason, and a
    ``rejected`` telemetry event; it counts neither in the sum nor in the weights.
    """

    weight_key = "num_examples"
    """Field of :class:`RecordKeys` naming the aggregation weight (the dataset size)."""
    cluster = False
    """Cluster mode: sample offsets in the instructions, unusable reports not aggregated."""

    def __init__(
        self,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        keys: RecordKeys | Mapping[str, str] | None = None,
        updates: Updates[Any] | None = None,
        rewriter: InstructionRewriter | None = None,
        selector: FastestReplies | None = None,
        silo_registry: str | Path | Mapping[str, Any] | SiloRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        **settings: Any,
    ) -> None:
        self.keys = record_keys(keys)
        server, limits, balancing = split_settings(settings)
        try:
            config = self.server_config = ServerConfig(**server)
            super().__init__(
                fraction_train=config.fraction_train,
                fraction_evaluate=config.fraction_evaluate,
                min_train_nodes=config.min_train_nodes,
                min_evaluate_nodes=config.min_evaluate_nodes,
                min_available_nodes=config.min_available_nodes,
                weighted_by_key=getattr(self.keys, self.weight_key),
                arrayrecord_key=arrayrecord_key,
                configrecord_key=configrecord_key,
                train_metrics_aggr_fn=train_metrics_aggr_fn,
                evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            )
            self.engine = RoundEngine.from_keywords(
                initial_batch_size=initial_batch_size,
                local_steps=local_steps,
                lr=lr,
                keys=self.keys,
                weight_key=self.weighted_by_key,
                balancing=balancing,
                deadline=DeadlinePolicy(
                    margin=config.deadline_margin,
                    floor=config.deadline_floor,
                    ceiling=config.deadline_ceiling,
                ),
                rewriter=rewriter,
                selector=selector,
                registry=None if silo_registry is None else load_registry(silo_registry),
                offsets=self.cluster,
                require_valid_report=self.cluster,
                **limits,
            )
        except ValidationError as err:
            raise setting_error(err, owner=type(self).__name__) from None
        self.updates: Updates[Any] = updates or PlainMean()
        self.telemetry = TelemetryWriter(config.telemetry_path)
        self.poll_interval = config.poll_interval
        self.round: RoundState | None = None
        """The round in flight (``None`` before the first ``configure_train``)."""
        self.round_offset = 0
        """Rounds done before this run started (a resumed checkpoint's round)."""
        self.checkpoints: CheckpointStore | None = None
        """Where :meth:`start` writes a checkpoint after every round (``None``: nowhere)."""
        self.clock = clock
        self.outcomes = RoundOutcomes(max_empty_rounds=config.max_empty_rounds)
        """Rejections logged once per silo and cause, empty rounds counted."""
        self.engine.max_weight_ratio = config.max_weight_ratio
        self.defenses = Defenses(
            max_update_ratio=config.max_update_ratio,
            update_spread_sigmas=config.update_spread_sigmas,
            max_weight_ratio=config.max_weight_ratio,
            weigh_by_size=self.weighted_by_key == self.keys.num_examples,
        )
        self._observe = False
        self._grid: DeadlineGrid | None = None
        self._timeout_cap: float | None = None
        route_to_flower()

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **overrides: Any) -> Self:
        """The strategy of a Flower app's run config (``context.run_config``): the keys
        of :data:`~fl_lbbsp.strategies.config.RUN_CONFIG_KEYS` it declares
        (``batch-size``, ``local-steps`` and ``lr`` required), any other constructor
        keyword in ``overrides``, which win.

        Raises
        ------
        InvalidSettingError
            A required key is missing (the message says what to declare), or a value is
            out of range.
        """
        return cls(**settings_of_run_config(run_config, overrides, owner=cls.__name__))

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` (``"lbbsp-tau"``, ``"lbbsp-partial"``, ...) when balancing,
        ``"fedavg"`` (``"partial"``) otherwise."""
        rewriter = self.engine.rewriter
        if self.engine.selector is not None:
            return "lbbsp-partial" if self.config.balance else "partial"
        if not self.config.balance:
            return "fedavg"
        return "lbbsp" if rewriter is None else f"lbbsp-{rewriter.name}"

    def summary(self) -> None:
        """Log the LB-BSP settings, then FedAvg's."""
        c = self.config
        log.info(
            "LB-BSP settings: scheme=%s B_init=%d tau=%d eta=%g estimator=%s(alpha=%g) "
            "allocator=%s",
            self.scheme,
            c.initial_batch_size,
            c.local_steps,
            c.lr,
            c.estimator,
            c.alpha,
            c.allocator,
        )
        super().summary()

    # ---------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes like FedAvg; the engine gives each its instruction.

        Raises
        ------
        ValueError
            With ``checkpoint_dir`` set, when the rounds are not run by :meth:`start`
            (e.g. by a wrapper strategy's own ``start``, which would never checkpoint).
        """
        if self._grid is None and self.server_config.checkpoint_dir is not None:
            raise ValueError(
                f"{type(self).__name__}(checkpoint_dir=...) checkpoints only in its own "
                "start(); inside a wrapper strategy (e.g. Flower's differential-privacy "
                "wrappers) leave checkpoint_dir unset"
            )
        server_round += self.round_offset
        sampled = super().configure_train(server_round, arrays, ConfigRecord(dict(config)), grid)
        state = self.engine.plan(
            server_round,
            [msg.metadata.dst_node_id for msg in sampled],
            timeout_cap=self._timeout_cap,
        )
        state.model = arrays
        self.updates.begin(arrays, state)
        state.expected_bytes = self.updates.expected_bytes(arrays)
        self.round = state
        state.sent = self.train_messages(state, arrays, config)
        state.run_id = state.sent[0].metadata.run_id if state.sent else 0
        return state.sent

    def train_messages(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """One train message per instruction: the model and the node's own ConfigRecord."""
        return [
            Message(
                content=RecordDict(
                    {
                        self.arrayrecord_key: arrays,
                        self.configrecord_key: self.node_config(state, node, config),
                    }
                ),
                message_type=MessageType.TRAIN,
                dst_node_id=int(node),
            )
            for node in state.instructions
        ]

    def node_config(self, state: RoundState, node: Node, config: ConfigRecord) -> ConfigRecord:
        """The caller's config (copied) with the node's instruction and the round."""
        ins = state.instructions[node]
        record = RoundInstruction(
            batch_size=ins.batch_size,
            local_steps=ins.local_steps,
            lr=ins.lr,
            server_round=state.server_round,
            batch_offset=ins.batch_offset,
        ).to_config(self.keys, base=config)
        record.update(self.updates.config(state))
        return record

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen every reply, feed the valid ones to the balancer, sum their updates.

        Parameters are weighted by ``num-examples`` (the local dataset size), whatever
        batch size each silo ran with. Rejected replies (see the class notes) are logged
        and left out; with fewer than ``min_train_silos`` valid replies, or if the
        aggregate cannot be formed, the round is skipped: ``(None, None)``, and Flower
        keeps the previous global model.
        """
        state = self.round
        if state is None:
            raise RuntimeError("aggregate_train called before configure_train")
        wall = time.perf_counter() - state.started
        received_at = time.time()
        replies = list(replies)
        state.waited = None if self._grid is None else self._grid.last_timeout
        sent_ids = {msg.metadata.message_id for msg in state.sent} - {""}
        accepted: dict[str, tuple[Verdict[Any], RecordDict, float]] = {}
        answered: dict[str, Message] = {}
        for msg in replies:
            late = None if self._grid is None else self._grid.seconds_late(msg)
            reply = reply_of(msg, keys=self.keys, sent_ids=sent_ids, seconds_late=late)
            verdict = self.engine.screen(state, reply, partial(self._parse, msg, reply, state))
            if not verdict.accepted:
                self._reject(state, verdict.silo, verdict.node, verdict.reason or "")
                continue
            answered[verdict.silo] = msg
            metrics = reply.metrics or {}
            observed = self._grid.observed(msg) if self._grid and self._observe else None
            misuse = self._misuse(state, verdict.silo, msg)
            counts = self.engine.report(state, verdict, metrics, observed=observed, misuse=misuse)
            state.reports[verdict.silo]["replied-at"] = msg.metadata.created_at
            if counts:
                weight = read_float(metrics, self.weighted_by_key)
                accepted[verdict.silo] = (verdict, msg.content, weight)
        kept, dropped = self.engine.select(state, accepted)
        far = self.defenses.judge(
            state, self.updates, {s: accepted[s][0].update for s in accepted if s in kept}
        )
        for silo, why in far.items():
            self._reject(state, silo, accepted[silo][0].node, why)
        kept -= set(far)
        weights = self.defenses.weights(
            {s: accepted[s][2] for s in accepted if s in kept}, self.engine.claims
        )
        for silo, (weight, capped) in weights.items():
            if capped is not None:
                state.reports[silo]["capped-weight"] = weight
                if self.outcomes.first_time(silo, "capped weight"):
                    log.warning("round %d: silo %s: %s", state.server_round, silo, capped)
            self.updates.add(accepted[silo][0].update, weight=weight)
        kept_contents = [accepted[silo][1] for silo in accepted if silo in kept]
        arrays, skipped = self._result(state, len(kept_contents))
        refused = self.defenses.refusals(state, answered, self.keys)
        arrays = self.defenses.settle(state, arrays, refused=refused, replied=len(answered))
        extra = self.engine.close(
            state, replied=(m.metadata.src_node_id for m in replies), wall=wall
        )
        extra["poll_interval"] = self.poll_interval
        # last reply created (its silo's clock) -> here: reply transfer and polling
        created = [r["replied-at"] for r in [*state.reports.values(), *dropped.values()]]
        extra["reply_delay"] = received_at - max(created) if created else None
        if self.engine.selector is not None:
            extra["dropped"] = dropped
        log_round(
            scheme=self.scheme,
            server_round=state.server_round,
            silos=state.reports,
            keys=self.keys,
            total_batch_size=state.total,
            wall=wall,
            telemetry=self.telemetry,
            extra={**extra, "rejected": state.rejected, "skipped": skipped},
        )
        left_out = {r["silo"]: f"rejected: {r['reason']}" for r in state.rejected}
        left_out.update({silo: "no reply in time" for silo in extra["missed"]})
        left_out.update(
            {s: f"not balanced: {r['misuse']}" for s, r in state.reports.items() if "misuse" in r}
        )
        log_decision(scheme=self.scheme, state=state, keys=self.keys, left_out=left_out)
        if self.checkpoints is not None:
            try:
                save_checkpoint(self.checkpoints, self, state.server_round, arrays or state.model)
            except OSError as err:
                log.error("round %d: checkpoint not written: %s", state.server_round, err)
        if self._grid is not None:  # rounds driven by start(): stop a run that learns nothing
            self.outcomes.close(state, aggregated=arrays is not None, skipped=skipped)
        if arrays is None:
            return None, None
        aggregated = self._train_metrics(state.server_round, kept_contents)
        return arrays, round_metrics(aggregated, state=state, keys=self.keys)

    def _result(self, state: RoundState, n: int) -> tuple[ArrayRecord | None, str | None]:
        """The new global model from ``n`` accepted updates, or why the round is skipped."""
        skipped = arrays = None
        if n < self.min_train_silos:
            replies = "reply" if n == 1 else "replies"
            skipped = f"{n} valid {replies}, min_train_silos is {self.min_train_silos}"
        else:
            try:
                arrays = self.updates.result()
            except ValueError as err:
                skipped = f"no aggregate: {err}"
        if skipped is not None:
            log_skipped(
                self.telemetry, scheme=self.scheme, server_round=state.server_round, reason=skipped
            )
        return arrays, skipped

    def _misuse(self, state: RoundState, silo: str, msg: Message) -> str | None:
        """What the silo says it did other than it was told (its own loader, extra
        epochs, another batch size), logged once per silo; ``None``: nothing."""
        record = msg.content.config_records.get(self.keys.silo_record)
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

    def _parse(self, msg: Message, reply: Reply, state: RoundState) -> Any:
        return self.updates.parse(reply.payload, reply.metrics or {}, state)

    def _reject(self, state: RoundState, silo: str, node: int | str, reason: str) -> None:
        """One telemetry event for a reply left out of the round, and one warning the
        first time this silo's reply is rejected for this cause (DEBUG after)."""
        state.rejected.append(
            log_rejected(
                self.telemetry,
                scheme=self.scheme,
                server_round=state.server_round,
                silo=silo,
                node=node,
                reason=reason,
                first=self.outcomes.first_time(silo, reason),
            )
        )

    def _train_metrics(self, server_round: int, contents: list[RecordDict]) -> MetricRecord | None:
        try:
            return self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        except (ValueError, TypeError, ArithmeticError) as err:
            log.warning("round %d: train metrics not aggregated: %s", server_round, err)
            return None

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """As FedAvg's, in the run's round numbers."""
        return super().configure_evaluate(server_round + self.round_offset, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the evaluation metrics like FedAvg, without the replies that would make
        Flower's aggregation fail: not one MetricRecord, a weight that is not a positive
        count, a value that is not a finite number, or keys other than the first valid
        reply's. Each is logged and written to the telemetry as ``rejected``."""
        server_round += self.round_offset
        usable, rejected = screen_evaluations(replies, self.engine.validator)
        for msg, reason in rejected:
            node = msg.metadata.src_node_id
            log_rejected(
                self.telemetry,
                scheme=self.scheme,
                server_round=server_round,
                silo=self.silo_id(node),
                node=node,
                reason=reason,
            )
        try:
            return super().aggregate_evaluate(server_round, usable)
        except (ValueError, TypeError, ArithmeticError) as err:
            log.warning("round %d: evaluation metrics not aggregated: %s", server_round, err)
            return None

    # ------------------------------------------------------ deadlines, checkpoints
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run the rounds like FedAvg, under per-round deadlines and fine polling.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, except that every
        ``send_and_receive`` waits until the current round's deadline (see
        ``deadline_margin``), at most ``timeout`` seconds, and collects replies every
        ``poll_interval`` seconds. Evaluation messages get the deadline of the round's
        training. With ``checkpoint_dir`` every round is checkpointed, and a checkpoint
        of round k found there at the start resumes the run with round k+1 (its model
        replaces ``initial_arrays``; see :mod:`fl_lbbsp.strategies.checkpoint`).
        """
        wrapped = self.deadline_grid(grid, timeout=timeout)
        run: Callable[..., Result] = super().start
        if self.server_config.checkpoint_dir is not None:
            run = partial(start_with_checkpoints, self, run)
        return run(
            grid=wrapped,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
        )

    def deadline_grid(self, grid: Grid, *, timeout: float) -> DeadlineGrid:
        """``grid`` behind this strategy's round deadlines and reply polling, as
        :meth:`start` uses it; for a wrapper's round loop see
        :func:`fl_lbbsp.strategies.composition.start_wrapped`.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        timeout : float
            The longest any round may wait (``start``'s ``timeout``).
        """
        self._timeout_cap = timeout
        check = self.config.check_times
        # Silos really wait behind Flower's own grids (deployment, Simulation Engine).
        self._observe = type(grid).__module__.startswith("flwr.") if check is None else check
        self._grid = DeadlineGrid(
            grid, timeout_fn=self._timeout_for, poll_interval=self.poll_interval, clock=self.clock
        )
        return self._grid

    def _timeout_for(self, timeout: float | None) -> float | None:
        if self.engine.deadline.margin is None or self.round is None or self.round.deadline is None:
            return timeout
        return self.round.deadline

    def checkpoint_settings(self) -> dict[str, Any]:
        """The settings a checkpoint must have been written with for this strategy to
        resume it (JSON values): those that decide batch sizes and updates."""
        balancing = self.config.model_dump(mode="json", exclude=set(CLAIM_SETTINGS))
        return {"balancing": balancing, **self.updates.settings()}

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds: the engine's (JSON) and the updates' (JSON and
        ArrayRecords)."""
        state, records = self.updates.state_dict()
        return {**self.engine.state_dict(), **state}, records

    def load_checkpoint_state(
        self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]
    ) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.engine.load_state_dict(state)
        self.updates.load_state_dict(state, records)
