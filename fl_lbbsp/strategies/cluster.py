"""Centralized-cluster LB-BSP on Flower's Message API: the server is the parameter server.

One round is one synchronous iteration. Every worker computes the gradient of the mean
loss over its ``x_i`` samples at the current weights; the server aggregates
``g = sum_i x_i * g_i / X`` (weighted gradient aggregation: every sample counts the same
whatever batch it was in, so convergence matches BSP with the global batch X), applies
SGD (optional momentum) with learning rate eta, and sends the new weights with the next
batch sizes. ``aggregation="naive"`` gives the biased plain mean ``sum_i g_i / n`` for
comparison. The same balancer as the FL strategy decides the batch sizes.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.2-3.4 (Alg. 1, Alg. 2, Eq. 5-7) and Alg. 3.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..contract import RecordKeys, read_int
from ..core.optim import SGD
from .config import ParameterServerConfig
from .fedavg import LBBSPFedAvg, _array_record
from .validation import DEFAULT_EXTRA_METRIC_KEYS

__all__ = ["LBBSPCluster"]

log = logging.getLogger("fl_lbbsp")


class LBBSPCluster(LBBSPFedAvg):
    """Parameter-server LB-BSP: one round = one gradient step, weighted by batch size.

    Workers get ``batch-size`` (their x_i), ``batch-offset`` (where their share starts in
    the round's global batch), ``local-steps`` = 1 and ``server-round`` in their
    ConfigRecord and reply with their gradient arrays (named like the weights)
    and the contract's MetricRecord; ``batch-size`` there is the weight. A reply that
    fails validation (non-finite, zero or negative time, a batch size other than the one
    sent, gradients of another layout or with NaN, ...) is logged and left out of that
    update; the round goes on with the others.

    Parameters
    ----------
    initial_batch_size : int
        Every worker's batch size before any report; the global batch is
        ``X = n * initial_batch_size`` every iteration.
    lr : float
        Learning rate eta of the server's SGD.
    momentum : float (default: 0.0)
        SGD momentum in [0, 1).
    aggregation : {"weighted", "naive"} (default: "weighted")
        ``"weighted"``: ``g = sum_i x_i g_i / X`` (Sec. 3.4). ``"naive"``: plain mean of
        the workers' gradients, biased toward small batches (Eq. 6); for comparison.
    balance : bool (default: True)
        ``False``: every worker keeps ``initial_batch_size`` (plain BSP).
    estimator, alpha, allocator, min_batch_size, max_batch_size, max_change_ratio, \
keys, telemetry_path :
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`; ``allocator`` may also be
        ``"iterative"`` (Alg. 2) and ``estimator`` ``"narx"``.
    estimator_options, allocator_options : dict | None (default: None)
        Extra arguments of the estimator (NARX ``warmup``, ...) and of the iterative
        allocator (``step``, ``window``, ...).
    balancer_options : dict | None (default: None)
        Further balancer settings, by :class:`~fl_lbbsp.strategies.config.BalancingConfig`
        name: ``min_batch_fraction`` (the floor as a share of B_init, 0.25), ``fit``
        (``"robust"`` or ``"wls"``), ``change_sigmas``, ``change_threshold``,
        ``change_confirm``, ``order_tolerance``, ``equal_split_guard``; each defaults to
        :data:`fl_lbbsp.core.BALANCER_DEFAULTS`.
    min_train_nodes, min_available_nodes :
        As in :class:`flwr.serverapp.strategy.FedAvg` (every available worker trains).
    min_train_silos, max_num_examples, max_reply_bytes, extra_metric_keys :
        Reply validation, as in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`; gradients
        must have the weights' names, shapes and dtypes, and ``batch-size`` must be the
        one sent. An iteration whose step would put NaN or inf into the weights is
        skipped and leaves the momentum unchanged.
    checkpoint_dir : str | Path | None (default: None)
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`; the checkpoint also holds the
        SGD momentum buffers.

    Raises
    ------
    pydantic.ValidationError
        On a bad setting; the message names the keyword and the value.
    """

    weight_key = "batch_size"
    batch_offset_key = "batch-offset"

    def __init__(
        self,
        *,
        initial_batch_size: int,
        lr: float,
        momentum: float = 0.0,
        aggregation: Literal["weighted", "naive"] = "weighted",
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
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        min_train_silos: int = 1,
        max_num_examples: int | None = None,
        max_reply_bytes: int | None = None,
        extra_metric_keys: Iterable[str] | None = DEFAULT_EXTRA_METRIC_KEYS,
        checkpoint_dir: str | Path | None = None,
    ) -> None:
        self.ps_config = ParameterServerConfig(momentum=momentum, aggregation=aggregation)
        super().__init__(
            initial_batch_size=initial_batch_size,
            local_steps=1,
            lr=lr,
            balance=balance,
            estimator=estimator,
            alpha=alpha,
            allocator=allocator,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            max_change_ratio=max_change_ratio,
            estimator_options=estimator_options,
            allocator_options=allocator_options,
            balancer_options=balancer_options,
            keys=keys,
            telemetry_path=telemetry_path,
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=0,
            min_available_nodes=min_available_nodes,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            min_train_silos=min_train_silos,
            max_num_examples=max_num_examples,
            max_reply_bytes=max_reply_bytes,
            extra_metric_keys=extra_metric_keys,
            checkpoint_dir=checkpoint_dir,
        )
        self.aggregation = self.ps_config.aggregation
        self.optimizer = SGD(lr=self.config.lr, momentum=self.ps_config.momentum)
        self._weights: ArrayRecord | None = None

    @property
    def scheme(self) -> str:
        """``"bsp"``, ``"lbbsp"``, or ``"lbbsp-naive"`` for the biased aggregation."""
        if not self.config.balance:
            return "bsp" if self.aggregation == "weighted" else "bsp-naive"
        return "lbbsp" if self.aggregation == "weighted" else "lbbsp-naive"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure like FL, and give each worker its ``batch-offset``: where its x_i
        samples start in the round's global batch of X, so workers drawing from a shared
        dataset split one global batch between them exactly as BSP would draw it."""
        self._weights = arrays
        messages = list(super().configure_train(server_round, arrays, config, grid))
        offset = 0
        for msg in sorted(messages, key=lambda m: m.metadata.dst_node_id):
            node_config = msg.content.config_records[self.configrecord_key]
            node_config[self.batch_offset_key] = offset
            offset += read_int(node_config, self.keys.batch_size)
        return messages

    def _accept(self, silo: str, record: dict[str, Any]) -> bool:
        if "invalid-report" in record:
            log.warning(
                "[%s] gradient of worker %s left out of this update: %s",
                self.scheme,
                silo,
                record["invalid-report"],
            )
            return False
        return True

    def _combine(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """Weighted (or naive) mean gradient, then one SGD step on the current weights."""
        if self._weights is None:
            raise RuntimeError("aggregate_train called before configure_train")
        names, gradient = self._weighted_layers(contents, equal=self.aggregation == "naive")
        params = [self._weights[name].numpy() for name in names]
        buffers = self.optimizer.buffers
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # checked in _array_record
                stepped = self.optimizer.step(params, gradient)
            return _array_record(names, stepped)
        except ValueError:
            self.optimizer.buffers = buffers  # a skipped step leaves the momentum as it was
            raise

    # -------------------------------------------------------------- checkpoints
    def checkpoint_settings(self) -> dict[str, Any]:
        """LB-BSP's settings plus the momentum and the aggregation."""
        return {
            **super().checkpoint_settings(),
            "parameter_server": self.ps_config.model_dump(mode="json"),
        }

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, ArrayRecord]]:
        """LB-BSP's state plus the SGD momentum buffers (record ``optimizer``)."""
        state, records = super().checkpoint_state()
        if self.optimizer.buffers is not None:
            records["optimizer"] = ArrayRecord(
                {f"{k:05d}": Array(np.asarray(b)) for k, b in enumerate(self.optimizer.buffers)}
            )
        return state, records

    def load_checkpoint_state(self, state: dict[str, Any], records: dict[str, ArrayRecord]) -> None:
        """Restore :meth:`checkpoint_state`."""
        super().load_checkpoint_state(state, records)
        buffers = records.get("optimizer")
        self.optimizer.buffers = (
            None if buffers is None else [buffers[name].numpy() for name in sorted(buffers)]
        )
