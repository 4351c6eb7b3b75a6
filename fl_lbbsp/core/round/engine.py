"""The round engine: every decision of an LB-BSP round, with no Flower and no torch.

One round is ``plan`` -> ``screen`` and ``report`` for each reply -> ``close``:

- :meth:`RoundEngine.plan` is the one place where a batch size is decided. It takes the
  nodes sampled for the round and gives one :class:`Instruction` per node (batch size,
  local steps, learning rate, where its samples start in cluster mode) and the round's
  deadline; the total ``X = n * B_init`` stays that of the largest federation seen, so
  the silos still there take the share of those gone.
- :meth:`RoundEngine.screen` checks one reply (origin, what its gate admits, duplicates,
  not an error, what its gate checks, then the update through the adapter's parser) and
  gives a :class:`Verdict`: accepted with its parsed update, or the reason it is not.
- :meth:`RoundEngine.report` has an accepted reply's claims judged by its claim policy,
  feeds its timing to the balancer and returns the round's telemetry record of that silo.
- :meth:`RoundEngine.close` notes who missed the round and learns the messaging overhead.

Planning and the round's bookkeeping live here; reporting and closing are
:class:`~fl_lbbsp.core.round.reports.RoundReporting`, the plan's timing and deadline
:class:`~fl_lbbsp.core.round.timing.RoundTiming`. What a reply is trusted to say is asked
of its gate and claim policy (:mod:`fl_lbbsp.core.round.trust`, believing by default; the
strategies' are the defence layer's, :func:`fl_lbbsp.security.guard.guard`).

The baselines rewrite a balanced round (:mod:`.rewriters`); aggregation is an
:class:`~fl_lbbsp.core.aggregation.Aggregator`. :meth:`RoundEngine.state_dict` and
:meth:`RoundEngine.load_state_dict` are all a checkpoint needs of the engine.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021: Sec. 3.3 (batch sizes from predicted speeds), Sec. 3.4
(cluster mode, gradients weighted by batch size), Sec. 3.5 (FL: the same tau and eta for
every silo; the tau and eta variants rejected in Fig. 13).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...contract import (
    InvalidReplyError,
    RecordKeys,
    error_summary,
    out_of_memory_batch_size,
)
from ..balancer import BatchSizeBalancer, SiloReport
from ..balancer_state import MAX_SILOS, BalancerState, NodeId, SiloId
from ..settings import BalancingConfig, ReplyLimits
from ..silo.state import MAX_ENTRIES, Seconds
from ..silo.transfer import TransferTimes
from .deadline import DeadlinePolicy, OverheadTracker, StragglerWatch
from .memory_caps import MemoryCaps, MemoryState
from .reports import RoundReporting
from .rewriters import FastestReplies, InstructionRewriter
from .state import Instruction, Node, Reply, RoundState, Verdict
from .timing import RoundTiming
from .trust import ClaimPolicy, ClaimsState, ReplyGate

__all__ = ["RoundEngine"]

log = logging.getLogger("fl_lbbsp")

U = TypeVar("U")


class EngineState(BaseModel):
    """The round engine's state between two rounds (:meth:`RoundEngine.state_dict`): each
    part's own state model, and what the engine itself keeps.

    Parameters
    ----------
    balancer : BalancerState
        The balancer's (:class:`~fl_lbbsp.core.balancer_state.BalancerState`).
    silo_of_node : dict of str to str
        Flower node id (decimal) -> silo id.
    overhead : list of float
        Measured messaging overhead, seconds.
    federation_size : int (default: 0)
        The most silos seen in a round; at most the silos the state knows.
    claims : ClaimsState (default: empty)
        The claim policy's (:class:`~fl_lbbsp.core.round.trust.ClaimsState`).
    memory : MemoryState (default: empty)
        The caps learned from silos that ran out of memory
        (:class:`~fl_lbbsp.core.round.memory_caps.MemoryState`).
    """

    model_config = ConfigDict(extra="forbid")

    balancer: BalancerState
    silo_of_node: dict[NodeId, SiloId] = Field(max_length=MAX_SILOS)
    overhead: list[Seconds] = Field(max_length=MAX_ENTRIES)
    federation_size: int = Field(default=0, ge=0, le=MAX_SILOS, strict=True)
    claims: ClaimsState = Field(default_factory=ClaimsState)
    memory: MemoryState = Field(default_factory=MemoryState)

    @property
    def silos(self) -> set[str]:
        """Every silo the state knows."""
        return set(self.balancer.silos) | set(self.silo_of_node.values())

    @model_validator(mode="after")
    def _consistent(self) -> EngineState:
        if self.federation_size > len(self.silos):
            raise ValueError(
                f"federation_size={self.federation_size} exceeds the {len(self.silos)} "
                "silos this state has seen"
            )
        return self


class RoundEngine(RoundTiming, RoundReporting):
    """Plans every round, screens every reply, feeds the balancer; no Flower, no torch, no
    defences of its own (its ``gate`` and ``claims``).

    Parameters
    ----------
    config : BalancingConfig
        B_init, tau, eta and the balancer's settings.
    keys : RecordKeys
        Names of the contract's entries.
    limits : ReplyLimits
        What a reply may claim (``min_train_silos``, ``max_num_examples``, ...).
    weight_key : str
        The aggregation weight's metric (``num-examples`` in FL, ``batch-size`` in cluster
        mode).
    deadline : DeadlinePolicy | None (default: None)
        How long a round may take; ``None``: ``DeadlinePolicy()``.
    rewriter : InstructionRewriter | None (default: None)
        Rewrites the balanced instructions (the tau and eta baselines).
    offsets : bool (default: False)
        Cluster mode: give each node where its samples start in the round's global batch.
    require_valid_report : bool (default: False)
        Leave a reply out of the aggregate when its timing report is unusable (cluster
        mode: its gradient weight is its reported batch size); in FL every accepted reply
        counts, weighted by its dataset size.
    selector : FastestReplies | None (default: None)
        Backup workers: only the fastest accepted replies enter the aggregate.
    gate : ReplyGate | None (default: None)
        Admits each reply (:class:`~fl_lbbsp.core.round.trust.ReplyGate`); ``None``: every
        reply is admitted.
    claims : ClaimPolicy | None (default: None)
        Judges each reply's claims (:class:`~fl_lbbsp.core.round.trust.ClaimPolicy`);
        ``None``: every claim is believed.
    """

    def __init__(
        self,
        *,
        config: BalancingConfig,
        keys: RecordKeys,
        limits: ReplyLimits,
        weight_key: str,
        deadline: DeadlinePolicy | None = None,
        rewriter: InstructionRewriter | None = None,
        offsets: bool = False,
        require_valid_report: bool = False,
        selector: FastestReplies | None = None,
        gate: ReplyGate | None = None,
        claims: ClaimPolicy | None = None,
    ) -> None:
        self.config = config
        self.gate = gate or ReplyGate()
        self.claims = claims or ClaimPolicy()
        self.selector = selector
        self.keys = keys
        self.limits = limits
        self.weight_key = weight_key
        self.deadline = deadline or DeadlinePolicy()
        self.rewriter = rewriter
        self.offsets = offsets
        self.require_valid_report = require_valid_report
        self.balancer = BatchSizeBalancer(
            initial_batch_size=config.initial_batch_size, knobs=config
        )
        self.silo_of_node: dict[Node, str] = {}
        self.node_of_silo: dict[str, Node] = {}
        self.stragglers = StragglerWatch(ratio=self.deadline.slow_ratio)
        self._unlearned_wall: float | None = None
        self.provisional: dict[str, SiloReport] = {}
        """Silos whose speed estimate rests only on a cold report (see
        :attr:`RoundState.cold`): their next warm report replaces it."""
        self.federation_size = 0
        self.overhead = OverheadTracker(self.deadline.overhead_rounds)
        self.transfer = TransferTimes()
        """Each silo's learned transfer time (a fixed per-round cost of its cost line)."""
        self.memory = MemoryCaps()
        """Caps learned from silos that ran out of memory at the size they were sent."""
        self._budget_held: tuple[str, ...] = ()  # the silos last said to be held down

    def total(self, sampled: int) -> int:
        """X for a round sent to ``sampled`` nodes: ``n * B_init`` for the largest n seen."""
        return self.config.initial_batch_size * max(sampled, self.federation_size)

    def shares(self, silos: Mapping[Node, str], *, total: int) -> dict[Node, int]:
        """Each node's share of ``total`` (B_init for all when not balancing)."""
        if not self.config.balance:
            return {node: self.config.initial_batch_size for node in silos}
        # Only an estimator with a warm-up (NARX) has anything to say; no scan otherwise.
        warming = self.balancer.warming_up() if self.config.tuning.estimator == "narx" else {}
        if warming:
            seen, warmup = min(warming.values())
            log.info(
                "%s: %d silo(s) still predicted by the EMA warm-up (%d of %d reports; "
                "set the estimator's warmup to train sooner)",
                self.config.tuning.estimator,
                len(warming),
                seen,
                warmup,
            )
        # FL averages the updates by dataset size: the noise budget weighs each silo by
        # it (pinned or declared sizes). Gradients weighted by batch size (cluster mode)
        # carry the same noise whatever the split: no budget there; nor where a rewriter
        # turns the shares into steps or learning rates at B_init (the baselines).
        by_size = self.weight_key == self.keys.num_examples and self.rewriter is None
        sizes = self.balancer.allocate(
            silos.values(),
            total=total,
            weights=self.budget_weights() if by_size else None,
            budget=by_size,
            caps=self.memory.caps,
        )
        self._say_budget_binds()
        return {node: sizes[silo] for node, silo in silos.items()}

    def _say_budget_binds(self) -> None:
        """One line whenever the silos the noise budget holds below the round time change:
        they finish early by design (``noise_budget``), which a user would otherwise read as
        idle time the balancer missed. Each is named with its batch size and the one the
        predicted round time allows it, where that is at least one sample more (the rest
        finish with the round)."""
        balancer, held = self.balancer, {}
        why = balancer.last_allocation
        if not any(reason == "noise-budget" for _, reason in why.values()):
            self._budget_held = ()
            return  # the budget does not bind: no round time to predict
        slowest = balancer.predicted_round_time({silo: size for silo, (size, _) in why.items()})
        for silo, (size, reason) in why.items():
            line = balancer.cost_line(silo)
            if reason != "noise-budget" or line is None or slowest is None or line[0] <= 0:
                continue
            room = (slowest - line[1]) / line[0]  # the samples its round time allows
            if math.isfinite(room) and (allowed := int(room + 1e-9)) > size:
                held[silo] = f"{silo!r} {size} of {allowed}"
        names = tuple(sorted(held))
        if names and names != self._budget_held:
            more = f" (and {len(names) - 5} more silos)" if len(names) > 5 else ""
            log.info(
                "noise budget (rho %.3g) binds: these silos get fewer samples than the "
                "predicted round time allows them and finish early (silo: batch size of "
                "allowed): %s%s, so that the slower silos keep batches large enough for the "
                "update's noise; a larger noise_budget (--noise-budget) trades noise for time",
                balancer.noise_budget,
                ", ".join(held[s] for s in names[:5]),
                more,
            )
        self._budget_held = names

    def weights(self, claimed: Mapping[str, float]) -> dict[str, tuple[float, str | None]]:
        """Silo -> (its aggregation weight, why it differs from ``claimed`` or ``None``): in
        FL its dataset size as the claim policy weighs it (:meth:`ClaimPolicy.weights`;
        the defence layer caps an undeclared size), else the batch size the server sent."""
        if self.weight_key != self.keys.num_examples:
            return {silo: (weight, None) for silo, weight in claimed.items()}
        return self.claims.weights(claimed)

    def claimed(self, silo: str) -> bool:
        """Whether ``silo``'s aggregation weight is its own unchecked claim: in FL a
        dataset size the registry did not declare; never a batch size the server sent."""
        return self.weight_key == self.keys.num_examples and silo not in self.claims.declared

    def budget_weights(self) -> dict[str, float]:
        """The silos' weights in the noise budget: their dataset sizes as the aggregate
        weighs them (:meth:`weights`), so that an inflated claim can no more steer the
        schedule than the model."""
        sizes = {**self.claims.sizes, **self.claims.declared}
        return {silo: weight for silo, (weight, _) in self.weights(sizes).items()}

    def plan(
        self,
        server_round: int,
        nodes: Iterable[Node],
        *,
        timeout_cap: float | None = None,
        expected_bytes: int = 0,
    ) -> RoundState:
        """Decide the round: one instruction per node, the total X and the deadline.

        Parameters
        ----------
        server_round : int
            The round.
        nodes : iterable of int or str
            The nodes (legacy API: the clients' cids) sampled for it.
        timeout_cap : float | None (default: None)
            The longest any round may wait (``start``'s ``timeout``).
        expected_bytes : int (default: 0)
            The size of the update a reply should carry (the model sent).
        """
        silos = {node: self.silo_id(node) for node in nodes}
        self.federation_size = max(self.federation_size, len(silos))
        total = self.total(len(silos))
        c = self.config
        instructions = {
            node: Instruction(
                silo=silos[node], batch_size=share, local_steps=c.local_steps, lr=c.lr, share=share
            )
            for node, share in self.shares(silos, total=total).items()
        }
        if self.rewriter is not None:
            rewriter = self.rewriter
            instructions = {n: rewriter.rewrite(i, c) for n, i in instructions.items()}
        if self.offsets:
            offset = 0
            for node in sorted(instructions):
                instructions[node] = replace(instructions[node], batch_offset=offset)
                offset += instructions[node].batch_size
        state = RoundState(
            server_round=server_round,
            instructions=instructions,
            total=sum(i.share for i in instructions.values()),
            deadline=None,
            expected_bytes=expected_bytes,
        )
        self.time_plan(state, timeout_cap=timeout_cap)
        return state

    def claimed_silo(self, reply: Reply) -> str:
        """The silo id a reply claims (its node's known id if it claims none); one that is
        not a string (or an integer) raises :class:`~fl_lbbsp.contract.InvalidReplyError`."""
        if reply.silo is None:
            return self.silo_id(reply.node)
        if isinstance(reply.silo, bool) or not isinstance(reply.silo, str | int):
            raise InvalidReplyError(f"{self.keys.silo_id} must be a string, got {reply.silo!r:.60}")
        return str(reply.silo)

    def screen(self, state: RoundState, reply: Reply, parse: Callable[[], U]) -> Verdict[U]:
        """Check one reply; ``parse`` reads and checks its update, last.

        In order: it answers this round, was sent to this node and came in time; the gate
        admits it (:meth:`ReplyGate.admit`, before anything in it is trusted); it is the
        first from its node and for its silo; it is not an error; the gate passes its
        content (:meth:`ReplyGate.check`); its update parses (``parse`` raises
        :class:`~fl_lbbsp.contract.InvalidReplyError` with the reason). An error reply
        saying the silo ran out of memory at the size it was sent caps that silo from the
        next round (:class:`~fl_lbbsp.core.round.memory_caps.MemoryCaps`).
        """
        node = reply.node
        try:
            silo = self.claimed_silo(reply)  # to name the silo in a rejection
        except InvalidReplyError:
            silo = self.silo_id(node)
        try:
            self._check_origin(state, reply)
            if reply.error is None:
                self.gate.admit(state, reply, self.claimed_silo(reply))
            # The first reply of this round from a node, or for a silo, is the one.
            if node in state.nodes:
                raise InvalidReplyError(f"a second reply from node {node} in this round")
            state.nodes.add(node)
            silo = self.claimed_silo(reply)
            if silo in state.silos:
                raise InvalidReplyError(f"a second reply for silo {silo} in this round")
            state.silos.add(silo)
            if reply.error is not None:
                raise InvalidReplyError(f"error reply: {error_summary(reply.error)}")
            self.gate.check(state, reply)
            try:
                update = parse()
            except InvalidReplyError:
                raise
            except Exception as err:  # noqa: BLE001 - hostile bytes may break any parser
                raise InvalidReplyError(f"unreadable arrays ({type(err).__name__}: {err})") from err
            verdict: Verdict[U] = Verdict(node=node, silo=silo, update=update)
        except InvalidReplyError as err:
            verdict = Verdict(node=node, silo=silo, reason=str(err))
        failed = None if reply.error is None else out_of_memory_batch_size(reply.error)
        sent = state.instructions.get(node)
        if failed is not None and sent is not None and self.rewriter is None:
            # the size the server sent, whatever the text says (it only says that it failed)
            self.memory.failed(verdict.silo, sent.batch_size)
        return verdict

    def _check_origin(self, state: RoundState, reply: Reply) -> None:
        if reply.stale:
            raise InvalidReplyError("not a reply to a train message of this round (stale)")
        if state.instructions and reply.node not in state.instructions:
            raise InvalidReplyError(f"node {reply.node} was not sent a train message this round")
        if reply.seconds_late is not None:
            waited = state.waited if state.waited is not None else state.deadline
            raise InvalidReplyError(
                f"arrived {reply.seconds_late:.2f} s after the round deadline of "
                f"{waited or 0:.1f} s"
            )

    def state_dict(self) -> EngineState:
        """The engine's state between two rounds: the balancer, the node -> silo ids,
        the messaging overhead, the most silos seen in a round, the claims, the memory
        caps."""
        return EngineState(
            balancer=BalancerState.model_validate(self.balancer.state_dict()),
            silo_of_node={str(node): silo for node, silo in self.silo_of_node.items()},
            overhead=self.overhead.seen,
            federation_size=self.federation_size,
            claims=self.claims.state_dict(),
            memory=self.memory.state_dict(),
        )

    def load_state_dict(self, state: EngineState | Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (a mapping is validated as an :class:`EngineState`).

        Raises
        ------
        pydantic.ValidationError
            A mapping that is not an engine's state.
        """
        state = EngineState.model_validate(state)
        self.balancer = BatchSizeBalancer.from_state_dict(
            state.balancer.model_dump(mode="json", exclude_unset=True)
        )
        self.silo_of_node = {int(node): silo for node, silo in state.silo_of_node.items()}
        self.node_of_silo = {silo: node for node, silo in self.silo_of_node.items()}
        self.overhead = OverheadTracker(self.deadline.overhead_rounds, state.overhead)
        self.federation_size = state.federation_size
        self.claims.load_state_dict(state.claims)
        self.memory.load_state_dict(state.memory)
