"""The Flower side of every LB-BSP strategy on the Message API, driven by the engine.

:class:`EngineStrategy` is FedAvg with its training round handed to the round engine
(:mod:`fl_lbbsp.core.round.engine`): ``configure_train`` samples nodes as FedAvg does and sends
each the instruction the engine planned for it; ``aggregate_train`` hands the replies to
a :class:`~fl_lbbsp.strategies.train_round.TrainRound`; ``start`` runs Flower's loop
under the engine's round deadlines, inside
:class:`~fl_lbbsp.strategies.checkpointing.Checkpointing` when there is a
``checkpoint_dir``. The two strategies over it are the federated one
(:class:`~fl_lbbsp.strategies.LBBSPFedAvg`: models averaged by dataset size) and the
parameter server (:class:`~fl_lbbsp.strategies.LBBSPCluster`: one SGD step per round on
the gradients weighted by batch size); what differs between them is composed in
(``parameter_server``, their :class:`~fl_lbbsp.strategies.updates.Updates`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..contract import RecordKeys
from ..core.round.rewriters import FastestReplies, InstructionRewriter
from ..core.round.state import Node, RoundState
from ..instruction import RoundInstruction
from ..security.identity import SiloRegistry
from .checkpoint import ResumePoint, store_of
from .checkpointing import Checkpointing
from .config import record_keys
from .deadline import DeadlineGrid
from .outcomes import round_metrics, warn_overridden_lr
from .parts import EngineParts
from .round_loop import RoundLoop, StartCall
from .train_round import TrainRound
from .updates import PlainMean, Updates
from .validation import log_rejected, screen_evaluations

__all__ = ["EngineStrategy"]

log = logging.getLogger("fl_lbbsp")


class EngineStrategy(EngineParts, RoundLoop, FedAvg):
    """FedAvg whose training rounds the LB-BSP round engine plans and screens.

    Parameters
    ----------
    initial_batch_size, local_steps, lr : int, int, float
        B_init, tau and eta.
    parameter_server : bool
        ``True``: one round is one synchronous iteration (replies weighted by their batch
        sizes, sample offsets in the instructions, a reply without a usable report left
        out); ``False``: FL (updates weighted by dataset size).
    keys, updates, rewriter, selector, silo_registry, clock, arrayrecord_key, \
configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn, **settings :
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`.

    Raises
    ------
    InvalidSettingError, TypeError
        As :class:`~fl_lbbsp.strategies.LBBSPFedAvg` (a bad setting; ``keys`` of another
        type).
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
        parameter_server: bool,
        clock: Callable[[], float] = time.monotonic,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        **settings: Any,
    ) -> None:
        self.keys = record_keys(keys)
        server = self.build_parts(
            initial_batch_size=initial_batch_size,
            local_steps=local_steps,
            lr=lr,
            rewriter=rewriter,
            selector=selector,
            silo_registry=silo_registry,
            parameter_server=parameter_server,
            settings=settings,
        )
        super().__init__(
            fraction_train=server.fraction_train,
            fraction_evaluate=server.fraction_evaluate,
            min_train_nodes=server.min_train_nodes,
            min_evaluate_nodes=server.min_evaluate_nodes,
            min_available_nodes=server.min_available_nodes,
            weighted_by_key=self.engine.weight_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.updates: Updates[Any] = updates or PlainMean()
        self.rounds = TrainRound(
            engine=self.engine,
            keys=self.keys,
            weight_key=self.weighted_by_key,
            defenses=self.defenses,
            outcomes=self.outcomes,
            telemetry=self.telemetry,
            poll_interval=self.poll_interval,
        )
        self.round: RoundState | None = None
        """The round in flight (``None`` before the first ``configure_train``)."""
        self.clock = clock
        self._observe = False
        self._grid: DeadlineGrid | None = None
        self._timeout_cap: float | None = None
        self._config_checked = False

    def summary(self) -> None:
        """Log the LB-BSP settings, then FedAvg's."""
        self.log_settings()
        super().summary()

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
            With ``checkpoint_dir`` set, when the rounds are not run by :meth:`start`
            (e.g. by a wrapper strategy's own ``start``, which would never checkpoint).
        """
        if self._grid is None and self.server_config.checkpoint_dir is not None:
            raise ValueError(
                f"{type(self).__name__}(checkpoint_dir=...) checkpoints only in its own "
                "start(); inside a wrapper strategy (e.g. Flower's differential-privacy "
                "wrappers) leave checkpoint_dir unset"
            )
        state = self.engine.plan(
            server_round, self.sample_train_nodes(grid), timeout_cap=self._timeout_cap
        )
        state.model = arrays
        if not self._config_checked:
            self._config_checked = True
            warn_overridden_lr(config, keys=self.keys, lr=self.engine.config.lr, owner=self)
        self.updates.begin(arrays, state)
        state.expected_bytes = self.updates.expected_bytes(arrays)
        self.round = state
        state.sent = self.train_messages(state, arrays, config)
        state.run_id = state.sent[0].metadata.run_id if state.sent else 0
        return state.sent

    def sample_train_nodes(self, grid: Grid) -> list[int]:
        """The nodes of the round, sampled as FedAvg samples them (``fraction_train``,
        ``min_train_nodes``, ``min_available_nodes``), in node-id order: Flower's sample
        comes in a random order, and a simulation whose silos reply in the order they
        were sent would add their updates in that order, so the same seed would not give
        the same model twice (float sums depend on their order in the last bit)."""
        if self.fraction_train == 0.0:
            return []
        available = len(list(grid.get_node_ids()))
        size = max(int(available * self.fraction_train), self.min_train_nodes)
        nodes, everyone = sample_nodes(grid, self.min_available_nodes, size)
        FLOWER_LOGGER.info(
            "configure_train: Sampled %s nodes (out of %s)", len(nodes), len(everyone)
        )
        return sorted(nodes)

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

        In FL the updates are weighted by ``num-examples`` (the local dataset size),
        whatever batch size each silo ran with; on a parameter server the gradients by
        their batch sizes (the :class:`~fl_lbbsp.strategies.updates.Updates` sum them).
        With fewer than ``min_train_silos`` valid replies,
        or if no aggregate can be formed, the round is skipped: ``(None, None)``, and
        Flower keeps the previous global model.

        Raises
        ------
        NoUpdateError
            In rounds run by :meth:`start`: the run's first round, or
            ``max_empty_rounds`` rounds in a row, aggregated no update.
        """
        state = self.round
        if state is None:
            raise RuntimeError("aggregate_train called before configure_train")
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
        Flower's aggregation fail: not one MetricRecord, a weight that is not a positive
        count, a value that is not a finite number, or keys other than the first valid
        reply's. Each is logged and written to the telemetry as ``rejected``."""
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
    def run_rounds(self, call: StartCall, *, resume: ResumePoint | None = None) -> Result:
        """Run the rounds like FedAvg (``start``), under per-round deadlines and fine
        polling.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, except that every
        ``send_and_receive`` waits until the current round's deadline (see
        ``deadline_margin``), at most ``timeout`` seconds, and collects replies every
        ``poll_interval`` seconds. Evaluation messages get the deadline of the round's
        training. With ``checkpoint_dir`` the rounds run inside
        :class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`: every round is
        checkpointed, and a checkpoint of round k found there at the start resumes the
        run with round k+1 (its model replaces ``initial_arrays``); ``resume``: that
        checkpoint, already validated and restored into this strategy by the caller
        (:func:`~fl_lbbsp.strategies.checkpoint.resume_from`), is not read again.
        """
        call = call.but(grid=self.deadline_grid(call.grid, timeout=call.timeout))
        store = store_of(self) if resume is None else resume.store
        if store is None:
            return self.flower_rounds(call)
        return Checkpointing(self, store=store).run_rounds(call, resume=resume)

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
