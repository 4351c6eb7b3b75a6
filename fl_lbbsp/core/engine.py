"""The round engine: every decision of an LB-BSP round, with no Flower and no torch.

One round is ``plan`` -> ``screen`` and ``report`` for each reply -> ``close``:

- :meth:`RoundEngine.plan` is the one place where a batch size is decided. It takes the
  nodes sampled for the round and gives one :class:`Instruction` per node (batch size,
  local steps, learning rate, where its samples start in cluster mode) and the round's
  deadline; the total ``X = n * B_init`` stays that of the largest federation seen, so
  the silos still there take the share of those gone.
- :meth:`RoundEngine.screen` checks one reply (origin, the silo's signature when there is
  a silo registry, duplicates, the claimed silo, size, the contract's metrics, then the
  update through the adapter's parser) and gives
  a :class:`Verdict`: accepted with its parsed update, or the reason it is not.
- :meth:`RoundEngine.report` bounds an accepted reply's claims (dataset size pinned and
  capped, times checked against the wall time observed, :mod:`fl_lbbsp.core.claims`),
  feeds its timing to the balancer and returns the round's telemetry record of that silo.
- :meth:`RoundEngine.close` notes who missed the round and learns the messaging overhead.

The baselines are not subclasses: :class:`TauRewriter` and :class:`EtaRewriter` rewrite
the instructions (local steps tau_i or learning rate eta_i from the balanced share), and
:class:`FastestReplies` picks the replies a backup-worker round keeps. Aggregation is an
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

from ..contract import PREDICTED_SPEED, RecordKeys
from .balancer import BatchSizeBalancer, InvalidReportError, SiloReport
from .claims import honest_gap
from .deadline import (
    DeadlinePolicy,
    OverheadTracker,
    StragglerWatch,
    predicted_compute_time,
    predicted_times,
)
from .identity import SiloRegistry, instruction_of
from .rewriters import FastestReplies, InstructionRewriter
from .round_state import (
    Instruction,
    Node,
    Reply,
    RoundState,
    Verdict,
    silo_round_time,
)
from .screening import InvalidReplyError, ReplyValidator, error_summary
from .settings import (
    BalancingConfig,
    ReplyLimits,
    balancing_config,
    make_balancer,
    make_claim_checker,
)
from .update_screen import cap_weights

__all__ = ["RoundEngine"]

log = logging.getLogger("fl_lbbsp")

U = TypeVar("U")


class RoundEngine:
    """Plans every round, screens every reply, feeds the balancer; no Flower, no torch.

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
    also_known : iterable of str (default: ())
        Metric keys a reply may hold beyond the contract's (the legacy API's ``silo-id``).
    selector : FastestReplies | None (default: None)
        Backup workers: only the fastest accepted replies enter the aggregate.
    registry : SiloRegistry | None (default: None)
        The federation's silos and their public keys
        (:mod:`fl_lbbsp.core.identity`): every reply must be signed by the key of the
        silo it claims, for this run and round. ``None``: silo ids are believed (one
        warning when the first round is planned).
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
        also_known: Iterable[str] = (),
        selector: FastestReplies | None = None,
        registry: SiloRegistry | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self._unverified_warned = registry is not None
        self.selector = selector
        self.keys = keys
        self.limits = limits
        self.weight_key = weight_key
        self.deadline = deadline or DeadlinePolicy()
        self.rewriter = rewriter
        self.offsets = offsets
        self.require_valid_report = require_valid_report
        self.validator = ReplyValidator(
            keys=keys,
            weight_key=weight_key,
            extra_metric_keys=limits.extra_metric_keys,
            max_num_examples=limits.max_num_examples,
            also_known=also_known,
        )
        self.balancer = make_balancer(config)
        self.silo_of_node: dict[Node, str] = {}
        self.node_of_silo: dict[str, Node] = {}
        self.stragglers = StragglerWatch(ratio=self.deadline.slow_ratio)
        self._unlearned_wall: float | None = None
        self.max_weight_ratio = 10.0
        """The weight cap of an undeclared dataset size (the strategy's
        ``max_weight_ratio``), in the noise budget as in the aggregate."""
        self.provisional: set[str] = set()
        """Silos whose speed estimate rests only on a cold report (see
        :attr:`RoundState.cold`): their next warm report replaces it."""
        self.federation_size = 0
        self.overhead = OverheadTracker(self.deadline.overhead_rounds)
        self.claims = make_claim_checker(
            config,
            overhead_rounds=self.deadline.overhead_rounds,
            declared_sizes=None if registry is None else registry.dataset_sizes,
        )

    @classmethod
    def from_keywords(
        cls,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        keys: RecordKeys,
        weight_key: str,
        min_train_silos: int,
        max_num_examples: int | None,
        max_reply_bytes: int | None,
        extra_metric_keys: Iterable[str] | None,
        balancing: Mapping[str, Any],
        **options: Any,
    ) -> RoundEngine:
        """The engine of a strategy's keywords, validated (one place for every adapter).

        Parameters
        ----------
        initial_batch_size, local_steps, lr : int, int, float
            B_init, tau and eta.
        keys, weight_key :
            As in the constructor.
        min_train_silos, max_num_examples, max_reply_bytes, extra_metric_keys :
            The reply limits (:class:`~fl_lbbsp.core.settings.ReplyLimits`).
        balancing : Mapping[str, Any]
            The balancing keywords (:class:`~fl_lbbsp.core.settings.BalancingOptions`).
        **options :
            The constructor's other keywords (``deadline``, ``rewriter``, ...).
        """
        return cls(
            config=balancing_config(
                initial_batch_size=initial_batch_size, local_steps=local_steps, lr=lr, **balancing
            ),
            keys=keys,
            limits=ReplyLimits(
                min_train_silos=min_train_silos,
                max_num_examples=max_num_examples,
                max_reply_bytes=max_reply_bytes,
                extra_metric_keys=extra_metric_keys,  # type: ignore[arg-type]
            ),
            weight_key=weight_key,
            **options,
        )

    # ------------------------------------------------------------------ planning
    def silo_id(self, node: Node) -> str:
        """The stable silo id last reported by ``node`` (``node-<id>``, or a legacy
        client's cid, before that)."""
        return self.silo_of_node.get(node, node if isinstance(node, str) else f"node-{node}")

    def total(self, sampled: int) -> int:
        """X for a round sent to ``sampled`` nodes: ``n * B_init`` for the largest n seen."""
        return self.config.initial_batch_size * max(sampled, self.federation_size)

    def shares(self, silos: Mapping[Node, str], *, total: int) -> dict[Node, int]:
        """Each node's share of ``total`` (B_init for all when not balancing)."""
        if not self.config.balance:
            return {node: self.config.initial_batch_size for node in silos}
        # Only an estimator with a warm-up (NARX) has anything to say; no scan otherwise.
        warming = self.balancer.warming_up() if self.config.estimator == "narx" else {}
        if warming:
            seen, warmup = min(warming.values())
            log.info(
                "%s: %d silo(s) still predicted by the EMA warm-up (%d of %d reports; "
                "set the estimator's warmup to train sooner)",
                self.config.estimator,
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
        )
        return {node: sizes[silo] for node, silo in silos.items()}

    def budget_weights(self) -> dict[str, float]:
        """The silos' weights in the noise budget: their dataset sizes as the aggregate
        weighs them (declared sizes whole, others capped at ``max_weight_ratio`` times the
        others' median and all the others together, :func:`cap_weights`), so that an
        inflated claim can no more steer the schedule than the model."""
        sizes = {**self.claims.sizes, **self.claims.declared}
        capped = cap_weights(
            sizes,
            known=sizes,
            declared=self.claims.declared,
            max_weight_ratio=self.max_weight_ratio,
        )
        return {silo: weight for silo, (weight, _) in capped.items()}

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
        if not self._unverified_warned:  # once, when the federation first meets its silos
            self._unverified_warned = True
            log.warning(
                "silo identities are unverified: any node may reply as any silo (give the "
                "strategy a silo_registry from `fl-lbbsp keys silos` to check signatures)"
            )
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
        speeds = [self.balancer.predicted_speed(silo) for silo in state.shares]
        if speeds and all(v is not None and v > 0 for v in speeds):
            state.ideal = c.local_steps * state.total / math.fsum(v for v in speeds if v)
        state.slow = self._slow_silos(state)
        state.predicted = predicted_compute_time(
            self.balancer,
            {s: b for s, b in state.shares.items() if s not in state.slow},
            c.local_steps,
        )
        state.deadline = self.deadline.timeout(
            self.predicted_round_time(state),
            cap=timeout_cap,
            # the ideal bounds a balanced plan only: FedAvg's split commits to its slowest
            ideal=(
                state.ideal + self.overhead.predict()
                if state.ideal is not None and c.balance
                else None
            ),
        )
        state.deadline = self._not_below_seen(state.deadline, timeout_cap)
        return state

    def _not_below_seen(self, deadline: float | None, cap: float | None) -> float | None:
        """Until a warm round has taught the messaging overhead, no deadline shorter than
        ``margin`` times the wall time of the last round that could not (a cold first
        round holds start-up, which must not become the overhead, but is what the next
        round may well take again: a ClientApp process started per round)."""
        wall, margin = self._unlearned_wall, self.deadline.margin
        if deadline is None or margin is None or wall is None or self.overhead.seen:
            return deadline
        ceiling = self.deadline.ceiling if cap is None else min(self.deadline.ceiling, cap)
        return min(ceiling, max(deadline, margin * wall))

    def _slow_silos(self, state: RoundState) -> set[str]:
        """The plan's stragglers (:class:`~fl_lbbsp.core.deadline.StragglerWatch`); none
        without balancing (FedAvg's split holds no silo at a floor)."""
        if not self.config.balance:
            return set()
        times = predicted_times(self.balancer, state.shares, self.config.local_steps)
        if times is None:
            return set()
        why = self.balancer.last_allocation
        return self.stragglers.judge(
            times, {silo for silo, (_, reason) in why.items() if reason == "floor"}
        )

    def predicted_round_time(self, state: RoundState) -> float | None:
        """Predicted seconds of the planned round (``None``: nothing predicted yet)."""
        shares = {s: b for s, b in state.shares.items() if s not in state.slow}
        compute = predicted_compute_time(self.balancer, shares, self.config.local_steps)
        return None if compute is None else compute + self.overhead.predict()

    def reply_cap(self, state: RoundState) -> int:
        """Largest reply in bytes accepted this round (``max_reply_bytes`` or four times
        the update expected plus 1 MiB)."""
        if self.limits.max_reply_bytes is not None:
            return self.limits.max_reply_bytes
        return 4 * state.expected_bytes + (1 << 20)

    # ----------------------------------------------------------------- screening
    def claimed_silo(self, reply: Reply) -> str:
        """The silo id a reply claims (its node's known id if it claims none).

        Raises
        ------
        InvalidReplyError
            If the claim is not a string (or an integer).
        """
        if reply.silo is None:
            return self.silo_id(reply.node)
        if isinstance(reply.silo, bool) or not isinstance(reply.silo, str | int):
            raise InvalidReplyError(f"{self.keys.silo_id} must be a string, got {reply.silo!r:.60}")
        return str(reply.silo)

    def screen(self, state: RoundState, reply: Reply, parse: Callable[[], U]) -> Verdict[U]:
        """Check one reply; ``parse`` reads and checks its update, last.

        In order: it answers this round, was sent to this node and came in time; with a
        silo registry, it is signed by the key of the silo it claims, for this run and
        round (:meth:`verify`; nothing else in it is trusted before); it is the first
        from its node and for its silo; it is not an error; its size is under
        the cap; its records are well formed; its metrics keep the contract (with the
        batch size sent); its update parses (``parse`` raises
        :class:`~fl_lbbsp.core.screening.InvalidReplyError` with the reason).
        """
        node = reply.node
        try:
            silo = self.claimed_silo(reply)  # to name the silo in a rejection
        except InvalidReplyError:
            silo = self.silo_id(node)
        try:
            self._check_origin(state, reply)
            if self.registry is not None and reply.error is None:
                self.verify(state, reply)
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
            cap = self.reply_cap(state)
            if reply.nbytes > cap:
                raise InvalidReplyError(f"reply of {reply.nbytes} bytes is over the {cap}-byte cap")
            if reply.problem is not None:
                raise InvalidReplyError(reply.problem)
            sent = state.instructions.get(node)
            self.validator.check_metrics(
                reply.metrics or {}, sent_batch_size=None if sent is None else sent.batch_size
            )
            try:
                update = parse()
            except InvalidReplyError:
                raise
            except Exception as err:  # noqa: BLE001 - hostile bytes may break any parser
                raise InvalidReplyError(f"unreadable arrays ({type(err).__name__}: {err})") from err
        except InvalidReplyError as err:
            return Verdict(node=node, silo=silo, reason=str(err))
        return Verdict(node=node, silo=silo, update=update)

    def verify(self, state: RoundState, reply: Reply) -> None:
        """Check a reply's signature against the silo registry (before the duplicate
        checks, so that an impostor replying first cannot shut the honest silo out).

        Raises
        ------
        InvalidReplyError
            A malformed reply, a silo not in the registry, a missing signature, or one
            that is not the claimed silo's over this run, round, metrics and arrays.
        """
        if self.registry is None:
            return
        if reply.problem is not None:
            raise InvalidReplyError(reply.problem)
        self.registry.verify(
            reply.signature,
            run_id=state.run_id,
            server_round=state.server_round,
            instruction=instruction_of(state.sent, reply.node),
            silo=self.claimed_silo(reply),
            metrics=reply.metrics or {},
            arrays=() if reply.signed_arrays is None else reply.signed_arrays(),
        )

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

    # ----------------------------------------------------------------- reporting
    def report(
        self,
        state: RoundState,
        verdict: Verdict[Any],
        metrics: Mapping[str, Any],
        *,
        observed: float | None = None,
        misuse: str | None = None,
    ) -> bool:
        """Bound an accepted reply's claims, feed its timing to the balancer; record it.

        The claims are bounded first (:mod:`fl_lbbsp.core.claims`): in FL a dataset size
        other than the silo's pinned (or declared) one, or over ``max_dataset_size``, is
        rejected with one warning (the update is left out, the balancer not fed); claimed
        times are clipped to ``[min_claimed_time, max_claimed_time]`` and, with
        ``check_times`` and ``observed``, a claim the observation contradicts is replaced
        by it, with one warning (the record keeps the claim as ``claimed-train-time`` /
        ``claimed-he-time``). An unusable report (non-finite time, zero batch size, ...)
        is left out of balancing with a warning and ``invalid-report`` in the record; the
        silo keeps its estimate.

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
        if self.config.check_times is False:
            observed = None
        train = _real(metrics.get(keys.train_time))
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
        (:meth:`~fl_lbbsp.core.claims.ClaimChecker.check_times`); ``record`` notes what
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
            "round %d: claimed times of silo %s replaced: %s",
            state.server_round,
            silo,
            checked.note,
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
        if gaps and not state.cold:
            # the round's overhead as its silos saw it, at most twice what its honest ones
            # did (:func:`honest_gap`): room for the spread between honest silos, none for
            # a silo late for its own reasons, which would stretch every later deadline
            honest = honest_gap(gaps) or 0.0
            self.overhead.observe(min(max(gaps), 2.0 * honest), 0.0)
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
        the silo, but only until the silo's first warm report: where that one's speed
        differs from it by more than ``change_threshold`` (start-up, not capacity), it
        restarts the silo's estimate instead of being averaged with it (Chen et al.,
        TCC 2021, Sec. 3.3: the speed to predict is the silo's steady capacity, not its
        start-up)."""
        threshold = math.log1p(self.balancer.change_threshold)
        for silo, (report, _) in state.feed.items():
            if silo in state.cold:
                self.provisional.add(silo)
            elif silo in self.provisional:
                self.provisional.discard(silo)
                cold = self.balancer.predicted_speed(silo)
                if cold and abs(math.log(report.speed / cold)) > threshold:
                    self.balancer.restart(silo)  # the cold report was start-up, not speed
        self.balancer.report_round({silo: report for silo, (report, _) in state.feed.items()})
        for silo, (_, record) in state.feed.items():
            record[PREDICTED_SPEED] = self.balancer.predicted_speed(silo)
        state.feed.clear()

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The engine's state between two rounds (JSON values): the balancer, the node ->
        silo ids, the messaging overhead, the most silos seen in a round."""
        return {
            "balancer": self.balancer.state_dict(),
            "silo_of_node": {str(node): silo for node, silo in self.silo_of_node.items()},
            "overhead": self.overhead.seen,
            "federation_size": self.federation_size,
            "claims": self.claims.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self.silo_of_node = {int(node): str(silo) for node, silo in state["silo_of_node"].items()}
        self.node_of_silo = {silo: node for node, silo in self.silo_of_node.items()}
        self.overhead = OverheadTracker(self.deadline.overhead_rounds, state["overhead"])
        self.federation_size = int(state.get("federation_size", 0))
        self.claims.load_state_dict(state.get("claims", {}))


def _real(value: object) -> float | None:
    """``value`` as a float if it is a finite real number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
