"""LB-BSP on Flower's Message API: FedAvg with a per-silo batch size every round.

:class:`LBBSPFedAvg` is FedAvg driven by the round engine (:mod:`fl_lbbsp.core.round.engine`).
Like Flower's FedProx it changes FedAvg's training round only (``configure_train``,
``aggregate_train``, the latter through a
:class:`~fl_lbbsp.strategies.train_round.TrainRound`); the rest is composed in: the update
arithmetic (:class:`~fl_lbbsp.strategies.updates.Updates`), a rewriter or selector (the
baselines), the deadlines (:class:`~fl_lbbsp.strategies.deadline.DeadlineGrid`) and the
checkpoints (the wrapper :class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL: tune B per silo, keep tau and eta).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Self

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from pydantic import ValidationError

from ..contract import RecordKeys
from ..core.centered_clip import CenteredClip
from ..core.round.deadline import DeadlinePolicy
from ..core.round.engine import RoundEngine
from ..core.round.rewriters import FastestReplies, InstructionRewriter
from ..core.round.state import Node, RoundState
from ..core.settings import CLAIM_SETTINGS, ReplyLimits, balancing_config
from ..core.trusted_clip import TrustedClip
from ..instruction import RoundInstruction
from ..security.guard import guard
from ..security.identity import SiloRegistry, load_registry
from ..telemetry import TelemetryWriter
from .checkpoint import Checkpoint
from .checkpointing import Checkpointing, store_of
from .config import (
    ServerConfig,
    record_keys,
    refuse_numeric_strings,
    setting_error,
    settings_of_run_config,
    split_settings,
)
from .deadline import DeadlineGrid
from .defenses import Defenses
from .gain import report_gain, spend_saved
from .later_rounds import EvaluateFn, LaterRounds
from .outcomes import (
    NoUpdateError,
    RoundOutcomes,
    round_metrics,
    route_to_flower,
    warn_overridden_lr,
)
from .rounds import EngineView
from .train_round import TrainRound, one_blas_thread
from .updates import PlainMean, Updates
from .validation import log_rejected, screen_evaluations

__all__ = ["EngineStrategy", "LBBSPFedAvg", "NoUpdateError"]

log = logging.getLogger("fl_lbbsp")


class LBBSPFedAvg(EngineView, FedAvg):
    """FedAvg whose silos get batch sizes proportional to their predicted speed.

    Before each round the balancer predicts every silo's sample-processing speed (EMA by
    default) and splits the fixed total ``X = n * B_init`` so that all silos finish
    their tau local steps together; tau and eta stay the same for all, and aggregation is
    weighted by each silo's local dataset size (``num-examples``), never by the samples
    it processed, so a faster silo gets a bigger batch and the same say in the model.

    Every train message carries its own ConfigRecord with ``batch-size``,
    ``local-steps``, ``lr`` and ``server-round`` (the caller's record is copied). One log
    line per round gives the batch sizes, the round time and the idle fraction; the same
    figures go to ``telemetry_path`` as JSON lines. Every reply is screened before any of
    it is used (:func:`fl_lbbsp.security.guard.guard`): a rejected one gets one warning and
    a ``rejected`` telemetry event.

    Parameters
    ----------
    initial_batch_size, local_steps, lr : int, int, float
        B_init (every silo's batch size in round 1; X = n * B_init every round), tau and
        eta, sent to every silo.
    **settings :
        Every other setting is declared once, with its doc, default and bounds, in a
        settings model: balancing (``balance``, ``noise_budget``, ``min_batch_size``,
        ``max_batch_size``; ``tuning=Tuning(...)`` or a tuning knob by its name,
        ``allocator``, ``estimator``, ...): :class:`~fl_lbbsp.core.settings.BalancingConfig`; the
        server (deadlines, polling, node sampling, telemetry, ``checkpoint_dir``, the
        defences): :class:`~fl_lbbsp.strategies.config.ServerConfig`; reply limits
        (``min_train_silos``, ``extra_metric_keys``, ...):
        :class:`~fl_lbbsp.core.settings.ReplyLimits`; ``arrayrecord_key``,
        ``configrecord_key``, ``train_metrics_aggr_fn``, ``evaluate_metrics_aggr_fn``: as
        in :class:`flwr.serverapp.strategy.FedAvg` (the weight is ``keys.num_examples``).
    keys : RecordKeys | Mapping | None (default: None)
        Names of the config and metric entries (``batch-size``, ``train-time``, ...).
    updates : Updates | None (default: None)
        How the replies' updates are read, checked and summed; ``None``: FedAvg's mean by
        dataset size.
    rewriter : InstructionRewriter | None (default: None)
        Rewrites every balanced instruction (the tau and eta baselines).
    selector : FastestReplies | None (default: None)
        Backup workers: only the fastest accepted replies enter the aggregate.
    silo_registry : str | Path | Mapping | SiloRegistry | None (default: None)
        The silos' public signing keys and declared dataset sizes (``fl-lbbsp keys
        silos``): every reply must be signed by the silo it claims. ``None``: silo ids
        are believed (one warning).
    parameter_server : bool (default: False)
        ``True`` (:class:`~fl_lbbsp.strategies.LBBSPCluster`): one round is one
        synchronous iteration (replies weighted by their batch sizes, sample offsets in
        the instructions, a reply without a usable report left out).
    clock : Callable[[], float] (default: time.monotonic)
        The clock that times each round and each reply from push to pull; injected by
        tests.

    Raises
    ------
    InvalidSettingError
        (a ``ValueError``) On a bad setting, naming the keyword, its bounds and value.
    TypeError
        ``keys`` is neither a ``RecordKeys`` nor a mapping of its fields.
    """

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
        parameter_server: bool = False,
        clock: Callable[[], float] = time.monotonic,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        **settings: Any,
    ) -> None:
        self.keys = record_keys(keys)
        refuse_numeric_strings(
            {
                **settings,
                "initial_batch_size": initial_batch_size,
                "local_steps": local_steps,
                "lr": lr,
            },
            owner=type(self).__name__,
        )
        server, limits, balancing = split_settings(settings)
        try:
            config = self.server_config = ServerConfig(**server)
            self.engine = RoundEngine(
                config=balancing_config(
                    initial_batch_size=initial_batch_size,
                    local_steps=local_steps,
                    lr=lr,
                    **balancing,
                ),
                keys=self.keys,
                limits=ReplyLimits(**limits),
                weight_key=self.keys.batch_size if parameter_server else self.keys.num_examples,
                deadline=DeadlinePolicy(
                    margin=config.deadline_margin,
                    floor=config.deadline_floor,
                    ceiling=config.deadline_ceiling,
                ),
                rewriter=rewriter,
                selector=selector,
                offsets=parameter_server,
                require_valid_report=parameter_server,
            )
            self.reply_screen = guard(
                self.engine,
                registry=None if silo_registry is None else load_registry(silo_registry),
                max_weight_ratio=config.max_weight_ratio,
            )
        except ValidationError as err:
            raise setting_error(err, owner=type(self).__name__) from None
        super().__init__(
            fraction_train=config.fraction_train,
            fraction_evaluate=config.fraction_evaluate,
            min_train_nodes=config.min_train_nodes,
            min_evaluate_nodes=config.min_evaluate_nodes,
            min_available_nodes=config.min_available_nodes,
            weighted_by_key=self.engine.weight_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.telemetry = TelemetryWriter(config.telemetry_path)
        self.poll_interval = config.poll_interval
        self.outcomes = RoundOutcomes(max_empty_rounds=config.max_empty_rounds)
        """Rejections logged once per silo and cause, empty rounds counted."""
        self.defenses = Defenses(
            max_update_ratio=config.max_update_ratio,
            update_spread_sigmas=config.update_spread_sigmas,
            max_loss_ratio=config.max_loss_ratio,
        )
        self.updates: Updates[Any] = updates or PlainMean(robust=self.robust_aggregator())
        self.rounds = TrainRound(
            engine=self.engine,
            keys=self.keys,
            weight_key=self.weighted_by_key,
            defenses=self.defenses,
            outcomes=self.outcomes,
            telemetry=self.telemetry,
            poll_interval=self.poll_interval,
            clock=clock,
        )
        self.round: RoundState | None = None
        """The round in flight (``None`` before the first ``configure_train``)."""
        self.clock = clock
        self._observe = False
        self._grid: DeadlineGrid | None = None
        self._timeout_cap: float | None = None
        self._config_checked = False
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

    # ------------------------------------------------------------ what it says
    def robust_aggregator(self) -> CenteredClip | None:
        """The plaintext updates' robust aggregation the settings ask for (``None``:
        FedAvg's mean, ``robust_aggregation="mean"``); a new one per call."""
        if self.server_config.robust_aggregation == "mean":
            return None
        server = self.server_config
        chosen = TrustedClip if server.robust_aggregation == "trusted-clip" else CenteredClip
        return chosen(factor=server.clip_factor, bound_claims=server.bound_claimed_pull)

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
        """Log FedAvg's settings (Flower's tree), then how this strategy splits the batch
        on its own line (:meth:`split_summary`), once a run (not in the middle of
        Flower's tree)."""
        super().summary()
        log.info("%s", self.split_summary())

    def split_summary(self) -> str:
        """What the rounds will send each silo, in one line: B_init every round without
        balancing (FedAvg's split); with it, B_init until the silos' speeds are known
        (round 1 of a fresh run), then batch sizes by speed."""
        c, b_init = self.config, self.config.initial_batch_size
        steps = f"{c.local_steps} local steps, lr {c.lr:g} for every silo"
        if not c.balance:
            named = "" if self.scheme == "fedavg" else f" ({self.scheme})"
            return f"FedAvg split{named}: batch size {b_init} per silo every round | {steps}"
        return (
            f"LB-BSP ({self.scheme}): batch size {b_init} per silo until the silos' speeds "
            f"are known, then by speed | {steps} | speed estimate {c.tuning.estimator} "
            f"(alpha {c.tuning.alpha:g}), allocator {c.tuning.allocator}"
        )

    def record_evaluation(
        self, server_round: int, *, loss: float, accuracy: float, federated: bool
    ) -> None:
        """One ``evaluate`` telemetry event and log line for the global model's test
        accuracy: evaluated by the server on the held-out split, or (``federated``) by the
        silos on their shares of it."""
        self.telemetry.evaluation(
            scheme=self.scheme,
            server_round=server_round,
            loss=loss,
            accuracy=accuracy,
            federated=federated,
        )
        where = "federated " if federated else ""
        log.info("[%s] round %d | %stest accuracy %.4f", self.scheme, server_round, where, accuracy)

    # ---------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does; the engine gives each its instruction.

        Raises
        ------
        ValueError
            With ``checkpoint_dir`` or ``spend_saved_time`` set, when the rounds are not
            run by :meth:`start` (e.g. by a wrapper strategy's own ``start``).
        """
        if self._grid is None and (name := self.server_config.start_only) is not None:
            raise ValueError(
                f"{type(self).__name__}({name}=...) works only in its own start(); inside "
                f"a wrapper strategy (e.g. Flower's differential-privacy wrappers) leave "
                f"{name} unset"
            )
        # FedAvg's sample (fraction_train, min_train_nodes, min_available_nodes, its log
        # line), in node-id order: Flower's comes in a random order, and a simulation
        # whose silos reply in the order sent would add the updates in that order, so the
        # same seed would not give the same model twice.
        sampled = super().configure_train(server_round, arrays, ConfigRecord(), grid)
        nodes = sorted(msg.metadata.dst_node_id for msg in sampled)
        state = self.engine.plan(server_round, nodes, timeout_cap=self._timeout_cap)
        state.model, state.started = arrays, self.clock()
        if not self._config_checked:
            self._config_checked = True
            warn_overridden_lr(
                config,
                keys=self.keys,
                lr=self.engine.config.lr,
                owner=self,
                local_steps=self.engine.config.local_steps,
            )
        self.updates.begin(arrays, state)
        state.expected_bytes = self.updates.expected_bytes(arrays)
        self.round = state
        state.sent = self.train_messages(state, arrays, config)
        state.run_id = state.sent[0].metadata.run_id if state.sent else 0
        return state.sent

    def train_messages(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> list[Message]:
        """One train message per instruction: the model and the node's own ConfigRecord
        (the hook the encrypted strategies extend)."""
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

        In FL the updates are weighted by ``num-examples`` (the local dataset size),
        whatever batch size each silo ran with; on a parameter server the gradients by
        their batch sizes (the :class:`~fl_lbbsp.strategies.updates.Updates` sum them).
        With fewer than ``min_train_silos`` valid replies, or if no aggregate can be
        formed, the round is skipped: ``(None, None)``, and Flower keeps the previous
        global model.

        Raises
        ------
        NoUpdateError
            In rounds run by :meth:`start`: the run's first round, or
            ``max_empty_rounds`` rounds in a row, aggregated no update.
        """
        state = self.round
        if state is None:
            raise RuntimeError("aggregate_train called before configure_train")
        with one_blas_thread():  # the replies' reductions are memory-bound
            result = self.rounds.aggregate(
                state,
                replies,
                updates=self.updates,
                scheme=self.scheme,
                grid=self._grid,
                observe=self._observe,
            )
        if self._grid is not None:  # rounds driven by start(): stop a run that learns nothing
            self.outcomes.close(state, aggregated=result.arrays is not None, skipped=result.skipped)
        if result.arrays is None:
            return None, None
        try:
            aggregated = self.train_metrics_aggr_fn(result.contents, self.weighted_by_key)
        except (ValueError, TypeError, ArithmeticError) as err:
            log.warning("round %d: train metrics not aggregated: %s", server_round, err)
            aggregated = None
        return result.arrays, round_metrics(
            aggregated, state=state, keys=self.keys, silo_id=self.engine.silo_id
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the evaluation metrics like FedAvg, without the replies that would make
        Flower's aggregation fail (:func:`~fl_lbbsp.strategies.validation.screen_evaluations`),
        each logged and written to the telemetry as ``rejected``."""
        usable, rejected = screen_evaluations(replies, self.reply_screen)
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
        evaluate_fn: EvaluateFn | None = None,
        *,
        resume: Checkpoint | None = None,
    ) -> Result:
        """Run the rounds like FedAvg, under per-round deadlines and fine polling.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, except that every
        ``send_and_receive`` waits until the round's deadline (``deadline_margin``), at
        most ``timeout`` seconds, collecting replies every ``poll_interval`` seconds. With
        ``checkpoint_dir`` the rounds run inside
        :class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`: every round is
        checkpointed, and a checkpoint of round k found there resumes the run with round
        k+1. ``resume``: that checkpoint, already restored by the caller
        (:func:`~fl_lbbsp.strategies.checkpointing.resume_from`).

        With ``spend_saved_time``, rounds ``num_rounds + 1 ..`` follow, as many as fit in
        the time the rounds run saved (:func:`~fl_lbbsp.strategies.gain.spend_saved`), in
        the same ``Result`` and ``evaluate_fn`` round numbers; with ``checkpoint_dir``
        they are checkpointed too. A resumed run spends only what its own rounds saved
        (those before the restart were not timed here); one resumed after round
        ``num_rounds`` runs none.
        """
        store = store_of(self)
        loop = LaterRounds(self) if store is None else Checkpointing(self, store=store)
        options: dict[str, Any] = {
            "grid": self.deadline_grid(grid, timeout=timeout),
            "timeout": timeout,
            "train_config": train_config,
            "evaluate_config": evaluate_config,
            "evaluate_fn": evaluate_fn,
        }
        if isinstance(loop, Checkpointing):
            result = loop.start(initial_arrays=initial_arrays, num_rounds=num_rounds,
                                resume=resume, **options)  # fmt: skip
        else:  # Flower's own loop, this strategy's name in its log
            result = super().start(initial_arrays=initial_arrays, num_rounds=num_rounds, **options)
        taken, cost_line = self.rounds.taken, self.engine.balancer.cost_line
        if self.server_config.spend_saved_time:
            result = spend_saved(
                loop, result, taken=taken, cost_line=cost_line, scheme=self.scheme,
                after=num_rounds, **options,
            )  # fmt: skip
        report_gain(result, taken=taken, cost_line=cost_line)
        return result

    def deadline_grid(self, grid: Grid, *, timeout: float) -> DeadlineGrid:
        """``grid`` behind this strategy's round deadlines and reply polling, as
        :meth:`start` uses it; for a wrapper's round loop see
        :func:`fl_lbbsp.strategies.composition.start_wrapped`.

        ``timeout``: the longest any round may wait (``start``'s ``timeout``).
        """
        self._timeout_cap = timeout
        check = self.config.tuning.check_times
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
        balancing = self.config.model_dump(mode="json", exclude={"tuning": set(CLAIM_SETTINGS)})
        # One flat group, as checkpoints have always held it (a tuning knob by its name;
        # the allocator's settings, its defaults left out, as they always were).
        allocator = self.config.tuning.batch_allocator()
        options = allocator.model_dump(mode="json", exclude_defaults=True)
        tuning = {**balancing.pop("tuning"), "allocator_options": options}
        return {"balancing": {**balancing, **tuning}, **self.updates.settings()}

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds (a
        :class:`~fl_lbbsp.strategies.checkpoint.StrategyState`'s JSON) and the updates'
        ArrayRecords: each part's as its state model dumps it."""
        state, records = self.updates.state_dict()
        return {
            "engine": self.engine.state_dict().model_dump(mode="json"),
            "updates": state,
        }, records

    def load_checkpoint_state(
        self, state: Mapping[str, Any], records: Mapping[str, ArrayRecord]
    ) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.engine.load_state_dict(state["engine"])
        self.updates.load_state_dict(state.get("updates", {}), records)


EngineStrategy = LBBSPFedAvg
"""The Message-API LB-BSP strategy every variant is composed from (the name the encrypted
strategies and the runners use)."""
