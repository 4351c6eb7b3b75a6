"""LB-BSP on Flower's Message API: FedAvg with a per-silo batch size every round.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL: tune B per silo, keep tau and eta).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..contract import RecordKeys, read_float
from ..core import BatchSizeBalancer
from ..core.aggregation import weighted_average
from ..telemetry import TelemetryWriter
from .checkpoint import start_with_checkpoints
from .config import BalancingConfig, ServerConfig
from .deadline import DeadlineGrid, DeadlinePolicy, OverheadTracker, predicted_compute_time
from .rounds import (
    allocate_batch_sizes,
    balancer_from_config,
    feed_balancer,
    log_round,
    missing,
    silo_round_time,
)
from .validation import (
    DEFAULT_EXTRA_METRIC_KEYS,
    InvalidReplyError,
    Layout,
    check_array_record,
    error_summary,
    layout_of,
    log_rejected,
    log_skipped,
    reply_checks,
    reply_nbytes,
)

__all__ = ["LBBSPFedAvg"]

log = logging.getLogger("fl_lbbsp")


class LBBSPFedAvg(FedAvg):
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
    initial_batch_size : int
        B_init: every silo's batch size in round 1; X = n * B_init every round.
    local_steps : int
        Local SGD steps tau sent to every silo.
    lr : float
        Learning rate eta sent to every silo.
    balance : bool (default: True)
        ``False`` sends B_init to every silo: plain FedAvg with LB-BSP's telemetry, the
        baseline to compare against.
    estimator : str (default: "ema")
        Speed predictor: ``"ema"``, ``"last"``, ``"narx"`` or ``"change-ema"``.
    alpha : float (default: 0.2)
        EMA weight of the latest observation, in (0, 1].
    allocator : str (default: "linear")
        ``"proportional"``: B_i proportional to predicted speed (Alg. 1). ``"linear"``:
        also fits each silo's fixed per-round cost ``t = a*B + b`` once it has seen two
        batch sizes, which settles in a few rounds where per-step overhead is large; it
        equals proportional allocation when ``b = 0``. ``"iterative"``: Alg. 2.
    min_batch_size : int (default: 1)
        Smallest batch size handed to a silo.
    max_batch_size : int | None (default: None)
        Largest batch size handed to a silo; a silo's reported ``max-batch-size`` lowers it.
    max_change_ratio : float | None (default: 2.0)
        After its first report, a silo's batch size changes by at most this factor per
        round, so one noisy or false speed report cannot swing it; ``None``: no limit.
    estimator_options, allocator_options : dict | None (default: None)
        Extra arguments of the estimator (NARX ``warmup``, ...) and of the iterative
        allocator (``step``, ``window``, ...).
    balancer_options : dict | None (default: None)
        Further balancer settings, by :class:`~fl_lbbsp.strategies.config.BalancingConfig`
        name: ``min_batch_fraction`` (the floor as a share of B_init, 0.25), ``fit``
        (``"robust"`` or ``"wls"``), ``change_sigmas``, ``change_threshold``,
        ``change_confirm``, ``order_tolerance``, ``equal_split_guard``; each defaults to
        :data:`fl_lbbsp.core.BALANCER_DEFAULTS`.
    keys : RecordKeys | None (default: None)
        Names of the config and metric entries (``batch-size``, ``train-time``, ...).
    telemetry_path : str | Path | None (default: None)
        JSON-lines file the per-round telemetry is appended to.
    deadline_margin : float | None (default: 3.0)
        Round deadline = ``deadline_margin`` times the predicted round time (the
        slowest silo's predicted compute ``B_i * tau / v_i`` plus the messaging overhead
        of recent complete rounds), clipped to ``[deadline_floor, deadline_ceiling]``.
        Replies that miss it are left out of the round and their silos keep their speed
        estimates. ``None``: no deadline, every round waits up to ``start``'s ``timeout``.
    deadline_floor : float (default: 30.0)
        Shortest round deadline in seconds.
    deadline_ceiling : float (default: 3600.0)
        Longest round deadline in seconds, and the deadline of round 1 (nothing
        predicted yet); ``start``'s ``timeout`` caps it too.
    poll_interval : float | None (default: 0.1)
        Seconds between two pulls for replies when the strategy runs through
        :meth:`start`. ``None`` uses the Grid's own ``send_and_receive``, which polls
        every 3 s in a deployment and rounds each round up to a multiple of 3 s.
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, \
evaluate_metrics_aggr_fn :
        As in :class:`flwr.serverapp.strategy.FedAvg`; the aggregation weight key is
        ``keys.num_examples``.
    min_train_silos : int (default: 1)
        Fewest valid replies a round needs: with fewer, the round is skipped (the global
        model stays as it was, ``aggregate_train`` returns ``(None, None)``) and the reason
        is logged. Flower's ``min_train_nodes`` is how many nodes are *sampled*.
    max_num_examples : int | None (default: None)
        Largest ``num-examples`` a reply may claim; a reply above it is rejected.
        ``None``: 2**53, the largest integer a float holds exactly.
    max_reply_bytes : int | None (default: None)
        A reply whose records hold more bytes is rejected before any of it is converted.
        ``None``: four times the size of the model sent (the largest ciphertext update in
        encrypted mode) plus 1 MiB.
    extra_metric_keys : iterable of str | None (default: DEFAULT_EXTRA_METRIC_KEYS)
        Metrics a reply may send beyond the contract's (``compute-time``, ``busy-time``,
        ``startup-time``, ``slowdown``, ``train-loss`` by default, what the shipped silo
        apps send); a reply with any other key is rejected. Add yours with
        ``(*DEFAULT_EXTRA_METRIC_KEYS, "train-acc")``
        (:mod:`fl_lbbsp.strategies.validation`); ``None`` accepts any key.
    checkpoint_dir : str | Path | None (default: None)
        Folder for checkpoints: after each round's aggregation :meth:`start` saves the
        global model, the balancer and the rest of the strategy's state there (see
        :mod:`fl_lbbsp.strategies.checkpoint`), and a strategy started on a folder that
        holds a checkpoint of round k resumes with round k+1. ``None``: no checkpoints.

    Raises
    ------
    pydantic.ValidationError
        On a bad setting (the message names the keyword and the value); see
        :class:`~fl_lbbsp.strategies.config.BalancingConfig` and
        :class:`~fl_lbbsp.strategies.config.ServerConfig`.

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

    def __init__(
        self,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        balance: bool = True,
        estimator: str = "ema",
        alpha: float = 0.2,
        allocator: str = "linear",
        min_batch_size: int = 1,
        max_batch_size: int | None = None,
        max_change_ratio: float | None = 2.0,
        estimator_options: dict[str, Any] | None = None,
        allocator_options: dict[str, Any] | None = None,
        balancer_options: dict[str, Any] | None = None,
        keys: RecordKeys | None = None,
        telemetry_path: str | Path | None = None,
        deadline_margin: float | None = 3.0,
        deadline_floor: float = 30.0,
        deadline_ceiling: float = 3600.0,
        poll_interval: float | None = 0.1,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        min_train_silos: int = 1,
        max_num_examples: int | None = None,
        max_reply_bytes: int | None = None,
        extra_metric_keys: Iterable[str] | None = DEFAULT_EXTRA_METRIC_KEYS,
        checkpoint_dir: str | Path | None = None,
    ) -> None:
        self.keys = keys or RecordKeys()
        self.server_config = ServerConfig(
            deadline_margin=deadline_margin,
            deadline_floor=deadline_floor,
            deadline_ceiling=deadline_ceiling,
            poll_interval=poll_interval,
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            telemetry_path=telemetry_path,  # type: ignore[arg-type]
            checkpoint_dir=checkpoint_dir,  # type: ignore[arg-type]
        )
        server = self.server_config
        super().__init__(
            fraction_train=server.fraction_train,
            fraction_evaluate=server.fraction_evaluate,
            min_train_nodes=server.min_train_nodes,
            min_evaluate_nodes=server.min_evaluate_nodes,
            min_available_nodes=server.min_available_nodes,
            weighted_by_key=getattr(self.keys, self.weight_key),
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.config = BalancingConfig(
            initial_batch_size=initial_batch_size,
            local_steps=local_steps,
            lr=lr,
            balance=balance,
            estimator=estimator,  # type: ignore[arg-type]
            alpha=alpha,
            allocator=allocator,  # type: ignore[arg-type]
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            max_change_ratio=max_change_ratio,
            estimator_options=estimator_options or {},
            allocator_options=allocator_options or {},
            **(balancer_options or {}),
        )
        self.balancer = balancer_from_config(self.config)
        self.telemetry = TelemetryWriter(server.telemetry_path)
        self._silo_of_node: dict[int, str] = {}
        self._sent: dict[int, int] = {}
        self._round_started: float | None = None
        # Round deadlines and reply polling
        self._sent_at: float | None = None
        self.deadline = DeadlinePolicy(
            margin=server.deadline_margin,
            floor=server.deadline_floor,
            ceiling=server.deadline_ceiling,
        )
        self.poll_interval = server.poll_interval
        self._overhead = OverheadTracker(self.deadline.overhead_rounds)
        self._timeout_cap: float | None = None
        self._round_deadline: float | None = None
        # Reply validation and lost silos
        limits, self.validator = reply_checks(
            keys=self.keys,
            weight_key=self.weighted_by_key,
            limits={
                "min_train_silos": min_train_silos,
                "max_num_examples": max_num_examples,
                "max_reply_bytes": max_reply_bytes,
                "extra_metric_keys": extra_metric_keys,
            },
        )
        self.min_train_silos = limits.min_train_silos
        self.max_reply_bytes = limits.max_reply_bytes
        self._layout: Layout | None = None
        self._sent_bytes = 0
        self._messages: list[Message] = []
        self._federation_size = 0
        self._deadline_grid: DeadlineGrid | None = None

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` when balancing, ``"fedavg"`` otherwise."""
        return "lbbsp" if self.config.balance else "fedavg"

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
    def silo_id(self, node_id: int) -> str:
        """The stable silo id last reported by ``node_id`` (``node-<id>`` before that)."""
        return self._silo_of_node.get(node_id, f"node-{node_id}")

    def batch_sizes(self, node_ids: Iterable[int]) -> dict[int, int]:
        """Batch size of each node for the next round (B_init for all when not balancing).

        The total is ``X = n * B_init`` for the largest number n of nodes sampled in any
        round so far: when silos are gone (crashed, disconnected), the others take their
        share, so the global batch stays the same.
        """
        silo_of = {node: self.silo_id(node) for node in node_ids}
        total = self.config.initial_batch_size * max(len(silo_of), self._federation_size)
        return allocate_batch_sizes(self.balancer, self.config, silo_of, total=total)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes like FedAvg, then give each its own ConfigRecord and batch size.

        Raises
        ------
        ValueError
            With ``checkpoint_dir`` set, when the rounds are not run by :meth:`start`
            (e.g. by a wrapper strategy's own ``start``, which would never checkpoint).
        """
        if self._deadline_grid is None and self.server_config.checkpoint_dir is not None:
            raise ValueError(
                f"{type(self).__name__}(checkpoint_dir=...) checkpoints only in its own "
                "start(); inside a wrapper strategy (e.g. Flower's differential-privacy "
                "wrappers) leave checkpoint_dir unset"
            )
        sampled = list(
            super().configure_train(server_round, arrays, ConfigRecord(dict(config)), grid)
        )
        self._federation_size = max(self._federation_size, len(sampled))
        sizes = self.batch_sizes(msg.metadata.dst_node_id for msg in sampled)
        messages = []
        for node_id, batch_size in sizes.items():
            node_config = ConfigRecord(dict(config))
            node_config[self.keys.batch_size] = batch_size
            node_config[self.keys.local_steps] = self.config.local_steps
            node_config[self.keys.lr] = self.config.lr
            node_config[self.keys.server_round] = server_round
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: node_config})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        self._sent = sizes
        self._messages = messages
        # What a reply must look like: names, shapes and dtypes only, no copy of values.
        self._layout = layout_of(arrays)
        self._sent_bytes = sum(len(array.data) for array in arrays.values())
        self._round_deadline = self.round_deadline(sizes)
        self._sent_at = time.time()
        self._round_started = time.perf_counter()
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply, feed the valid ones to the balancer, average their parameters.

        Parameters are weighted by ``num-examples`` (the local dataset size), whatever
        batch size each silo ran with. Rejected replies (see the class notes) are logged
        and left out; with fewer than ``min_train_silos`` valid replies, or if the
        aggregate cannot be formed, the round is skipped: ``(None, None)``, and Flower
        keeps the previous global model.
        """
        wall = None if self._round_started is None else time.perf_counter() - self._round_started
        received_at = time.time()
        replies = list(replies)
        self._check_and_log_replies(replies, is_train=True, validate=False)
        rejected: list[dict[str, Any]] = []
        valid = self._screen(server_round, replies, rejected)
        silos: dict[str, dict[str, Any]] = {}
        accepted = []
        for msg in valid:
            silo, record = self._record_report(msg)
            record["replied-at"] = msg.metadata.created_at
            silos[silo] = record
            if self._accept(silo, record):
                accepted.append(msg)
        arrays = metrics = None
        skipped = None
        if len(accepted) < self.min_train_silos:
            skipped = (
                f"{len(accepted)} valid repl{'y' if len(accepted) == 1 else 'ies'}, "
                f"min_train_silos is {self.min_train_silos}"
            )
        else:
            contents = [msg.content for msg in accepted]
            try:
                arrays = self._combine(server_round, contents)
            except ValueError as err:
                skipped = f"no aggregate: {err}"
            else:
                metrics = self._aggregate_metrics(server_round, contents)
        if skipped is not None:
            log_skipped(
                self.telemetry, scheme=self.scheme, server_round=server_round, reason=skipped
            )
        extra = self._deadline_report(replies, silos, wall, received_at)
        self._log_round(
            server_round, silos, wall, extra={**extra, "rejected": rejected, "skipped": skipped}
        )
        return arrays, metrics

    # ------------------------------------------------------------ validation
    def _screen(
        self, server_round: int, replies: list[Message], rejected: list[dict[str, Any]]
    ) -> list[Message]:
        """The replies that pass every check, in order; the others are rejected."""
        sent_ids = {msg.metadata.message_id for msg in self._messages} - {""}
        nodes: set[int] = set()
        silos: set[str] = set()
        valid = []
        for msg in replies:
            node = msg.metadata.src_node_id
            try:
                self._check_origin(msg, sent_ids)
                # The first reply of this round from a node, or for a silo, is the one.
                if node in nodes:
                    raise InvalidReplyError(f"a second reply from node {node} in this round")
                nodes.add(node)
                silo = self._claimed_silo(msg)
                if silo in silos:
                    raise InvalidReplyError(f"a second reply for silo {silo} in this round")
                silos.add(silo)
                if msg.has_error():
                    reason = msg.error.reason or f"error code {msg.error.code}"
                    raise InvalidReplyError(f"error reply: {error_summary(reason)}")
                self._check_content(msg)
            except InvalidReplyError as err:
                self._reject(server_round, msg, str(err), rejected)
                continue
            valid.append(msg)
        return valid

    def _claimed_silo(self, msg: Message) -> str:
        """The silo id a reply claims (its node's known id if it claims none)."""
        node = msg.metadata.src_node_id
        if not msg.has_content():
            return self.silo_id(node)
        record = msg.content.config_records.get(self.keys.silo_record)
        if record is None or self.keys.silo_id not in record:
            return self.silo_id(node)
        value = record[self.keys.silo_id]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidReplyError(f"{self.keys.silo_id} must be a string, got {value!r:.60}")
        return str(value)

    def _check_origin(self, msg: Message, sent_ids: set[str]) -> None:
        """Whether the reply answers a train message of this round (``sent_ids``, once the
        grid has given them ids), in time."""
        node = msg.metadata.src_node_id
        if sent_ids and msg.metadata.reply_to_message_id not in sent_ids:
            raise InvalidReplyError("not a reply to a train message of this round (stale)")
        if self._sent and node not in self._sent:
            raise InvalidReplyError(f"node {node} was not sent a train message this round")
        grid = self._deadline_grid
        late = None if grid is None else grid.seconds_late(msg)
        if grid is not None and late is not None:
            raise InvalidReplyError(
                f"arrived {late:.2f} s after the round deadline of {grid.last_timeout or 0:.1f} s"
            )

    def _check_content(self, msg: Message) -> None:
        """Size, record structure, metrics and arrays of a reply."""
        content = msg.content
        cap = self.reply_cap()
        size = reply_nbytes(content)
        if size > cap:
            raise InvalidReplyError(f"reply of {size} bytes is over the {cap}-byte cap")
        for kind, records in (
            ("ArrayRecords", content.array_records),
            ("MetricRecords", content.metric_records),
        ):
            if len(records) != 1:
                raise InvalidReplyError(f"{len(records)} {kind} in the reply, expected 1")
        metrics = next(iter(content.metric_records.values()))
        self.validator.check_metrics(
            metrics, sent_batch_size=self.sent_batch_size(msg.metadata.src_node_id)
        )
        try:
            self._check_arrays(msg)
        except InvalidReplyError:
            raise
        except Exception as err:  # noqa: BLE001 - hostile bytes may break any parser
            raise InvalidReplyError(f"unreadable arrays ({type(err).__name__}: {err})") from err

    def sent_batch_size(self, node_id: int) -> int | None:
        """The ``batch-size`` node ``node_id`` was sent this round, which its reply must
        report (``None``: it was sent none)."""
        return self._sent.get(node_id)

    def _check_arrays(self, msg: Message) -> None:
        """Plaintext arrays: the global model's names, shapes and dtypes, all finite."""
        if self._layout is None:
            raise InvalidReplyError("no plaintext global model to compare the arrays with")
        check_array_record(next(iter(msg.content.array_records.values())), self._layout)

    def reply_cap(self) -> int:
        """Largest reply in bytes accepted this round (``max_reply_bytes`` or automatic)."""
        if self.max_reply_bytes is not None:
            return self.max_reply_bytes
        return 4 * self._expected_reply_bytes() + (1 << 20)

    def _expected_reply_bytes(self) -> int:
        return self._sent_bytes

    def _reject(
        self, server_round: int, msg: Message, reason: str, rejected: list[dict[str, Any]]
    ) -> None:
        """One warning and one telemetry event for a reply left out of the round."""
        node = msg.metadata.src_node_id
        try:
            silo = self._claimed_silo(msg)
        except InvalidReplyError:
            silo = self.silo_id(node)
        rejected.append(
            log_rejected(
                self.telemetry,
                scheme=self.scheme,
                server_round=server_round,
                silo=silo,
                node=node,
                reason=reason,
            )
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Average the evaluation metrics like FedAvg, without the replies that would make
        Flower's aggregation fail: not one MetricRecord, a weight that is not a positive
        count, a value that is not a finite number, or keys other than the first valid
        reply's. Each is logged and written to the telemetry as ``rejected``."""
        keys: set[str] | None = None
        usable: list[Message] = []
        rejected: list[dict[str, Any]] = []
        for msg in replies:
            try:
                if msg.has_content():
                    records = msg.content.metric_records
                    if len(records) != 1:
                        raise InvalidReplyError(f"{len(records)} MetricRecords, expected 1")
                    metrics = next(iter(records.values()))
                    self.validator.check_evaluation(metrics)
                    keys = set(metrics) if keys is None else keys
                    if set(metrics) != keys:
                        raise InvalidReplyError(
                            f"metrics {sorted(metrics)} differ from the others' {sorted(keys)}"
                        )
            except InvalidReplyError as err:
                self._reject(server_round, msg, f"evaluation: {err}", rejected)
                continue
            usable.append(msg)
        try:
            return super().aggregate_evaluate(server_round, usable)
        except (ValueError, TypeError, ArithmeticError) as err:
            log.warning("round %d: evaluation metrics not aggregated: %s", server_round, err)
            return None

    def _aggregate_metrics(
        self, server_round: int, contents: list[RecordDict]
    ) -> MetricRecord | None:
        try:
            return self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        except (ValueError, TypeError, ArithmeticError) as err:
            log.warning("round %d: train metrics not aggregated: %s", server_round, err)
            return None

    def _accept(self, silo: str, record: dict[str, Any]) -> bool:
        """Whether a reply enters the aggregate: in FL every reply does, weighted by its
        dataset size, even if its timing report was unusable for balancing."""
        return True

    def _combine(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """The new global arrays from the accepted replies (FedAvg: their weighted mean)."""
        return self._average_arrays(contents)

    def _record_report(self, msg: Message) -> tuple[str, dict[str, Any]]:
        keys = self.keys
        node_id = msg.metadata.src_node_id
        silo_record = msg.content.config_records.get(keys.silo_record)
        if silo_record is not None and keys.silo_id in silo_record:
            self._silo_of_node[node_id] = str(silo_record[keys.silo_id])
        silo = self.silo_id(node_id)
        metrics = next(iter(msg.content.metric_records.values()))
        record = feed_balancer(
            self.balancer, silo, metrics, keys=keys, sent_batch_size=self._sent.get(node_id)
        )
        return silo, record

    def _average_arrays(self, contents: list[RecordDict]) -> ArrayRecord:
        """Average of the replies' arrays weighted by ``weighted_by_key``."""
        names, averaged = self._weighted_layers(contents)
        return _array_record(names, averaged)

    def _weighted_layers(
        self, contents: list[RecordDict], *, equal: bool = False
    ) -> tuple[list[str], list[np.ndarray]]:
        """Layer names and the weighted average of every reply's arrays (weights from
        ``weighted_by_key``, or all equal)."""
        records = [next(iter(c.array_records.values())) for c in contents]
        names = list(records[0].keys())
        layers = [[record[name].numpy() for name in names] for record in records]
        weights = [
            1.0
            if equal
            else read_float(next(iter(c.metric_records.values())), self.weighted_by_key)
            for c in contents
        ]
        return names, [np.asarray(a) for a in weighted_average(layers, weights)]

    def _log_round(
        self,
        server_round: int,
        silos: dict[str, dict[str, Any]],
        wall: float | None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        log_round(
            scheme=self.scheme,
            server_round=server_round,
            silos=silos,
            keys=self.keys,
            total_batch_size=sum(self._sent.values()),
            wall=wall,
            telemetry=self.telemetry,
            extra=extra,
        )

    # --------------------------------------------------------- round deadlines
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
        wrapped = DeadlineGrid(grid, timeout_fn=self._timeout_for, poll_interval=self.poll_interval)
        self._deadline_grid = wrapped
        return wrapped

    def predicted_round_time(self, sizes: dict[int, int]) -> float | None:
        """Predicted seconds for a round with these batch sizes (None: unknown)."""
        compute = predicted_compute_time(
            self.balancer,
            {self.silo_id(node): size for node, size in sizes.items()},
            self.config.local_steps,
        )
        return None if compute is None else compute + self._overhead.predict()

    def round_deadline(self, sizes: dict[int, int]) -> float | None:
        """Seconds the round with these batch sizes may take (None: no limit)."""
        return self.deadline.timeout(self.predicted_round_time(sizes), cap=self._timeout_cap)

    def _timeout_for(self, timeout: float | None) -> float | None:
        if self.deadline.margin is None or self._round_deadline is None:
            return timeout
        return self._round_deadline

    def _deadline_report(
        self,
        replies: list[Message],
        silos: dict[str, dict[str, Any]],
        wall: float | None,
        received_at: float,
    ) -> dict[str, Any]:
        """Note who sent no reply in time, learn the messaging overhead; telemetry fields."""
        missed = missing(self._sent, (msg.metadata.src_node_id for msg in replies))
        if missed:
            log.warning(
                "no usable reply from %s within %s s: left out, estimates kept",
                ", ".join(self.silo_id(node) for node in missed),
                "n/a" if self._round_deadline is None else f"{self._round_deadline:.1f}",
            )
        times = [
            silo_round_time(r, self.keys)
            for r in silos.values()
            if "invalid-report" not in r and self.keys.train_time in r
        ]
        if not missed and wall is not None and times:
            self._overhead.observe(wall, max(times))
        return {
            "deadline": self._round_deadline,
            "missed": [self.silo_id(node) for node in missed],
            "sent": {self.silo_id(node): size for node, size in self._sent.items()},
            "poll_interval": self.poll_interval,
            # last reply created (its silo's clock) -> here: reply transfer and polling,
            # or the wait for a silo that missed the deadline
            "reply_delay": received_at - max(r["replied-at"] for r in silos.values())
            if silos
            else None,
            "sent_at": self._sent_at,
        }

    # -------------------------------------------------------------- checkpoints
    def checkpoint_settings(self) -> dict[str, Any]:
        """The settings a checkpoint must have been written with for this strategy to
        resume it (JSON values): those that decide batch sizes and updates."""
        return {"balancing": self.config.model_dump(mode="json")}

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """The state between two rounds: JSON (balancer, node -> silo ids, messaging
        overhead, the most silos seen in a round) and ArrayRecords (none here; subclasses
        add theirs)."""
        state = {
            "balancer": self.balancer.state_dict(),
            "silo_of_node": {str(node): silo for node, silo in self._silo_of_node.items()},
            "overhead": self._overhead.seen,
            "federation_size": self._federation_size,
        }
        return state, {}

    def load_checkpoint_state(self, state: dict[str, Any], records: dict[str, ArrayRecord]) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self._silo_of_node = {int(node): str(silo) for node, silo in state["silo_of_node"].items()}
        self._overhead = OverheadTracker(self.deadline.overhead_rounds, state["overhead"])
        self._federation_size = int(state.get("federation_size", 0))


def _array_record(names: list[str], arrays: list[np.ndarray]) -> ArrayRecord:
    """The aggregate as an ArrayRecord; ValueError if it holds NaN or inf."""
    for name, arr in zip(names, arrays, strict=True):
        if not np.isfinite(arr).all():
            raise ValueError(f"the aggregate of array {name!r} holds NaN or inf")
    return ArrayRecord({name: Array(arr) for name, arr in zip(names, arrays, strict=True)})
