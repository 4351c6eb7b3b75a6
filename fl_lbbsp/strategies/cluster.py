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

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from flwr.app import MetricRecord, RecordDict

from ..contract import RecordKeys
from ..core.optim import SGD
from .config import ParameterServerConfig, parameter_server_keywords
from .fedavg import LBBSPFedAvg
from .updates import GradientUpdate

__all__ = ["LBBSPCluster"]


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
    keys, telemetry_path :
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`.
    **balancing : BalancingOptions
        ``balance`` (``False``: every worker keeps ``initial_batch_size``, plain BSP),
        ``estimator``, ``allocator`` (``"iterative"`` is Alg. 2) and the other settings
        of :class:`~fl_lbbsp.core.settings.BalancingConfig`.
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
    robust_aggregation : {"mean", "centered-clip", "trusted-clip"} (default: "mean")
        ``"centered-clip"``: each gradient clipped around a robust centre before the
        batch-size-weighted mean (:class:`~fl_lbbsp.core.aggregation.CenteredClip`,
        ``clip_factor`` its radius); ``"trusted-clip"``: the same over the workers whose
        history agrees with the others' (:class:`~fl_lbbsp.core.trusted_clip.TrustedClip`).
        Off by default here: a parameter server's workers
        are one operator's machines, and the weighted mean is exactly the gradient of the
        union of their batches (Sec. 3.4), which clipping gives up.

    Raises
    ------
    pydantic.ValidationError
        On a bad ``momentum`` or ``aggregation``.
    InvalidSettingError
        (a ``ValueError``) On any other bad setting; the message names the keyword and
        the value.
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        lr: float,
        momentum: float = 0.0,
        aggregation: Literal["weighted", "naive"] = "weighted",
        keys: RecordKeys | None = None,
        telemetry_path: str | Path | None = None,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        min_train_silos: int = 1,
        max_num_examples: int | None = None,
        max_reply_bytes: int | None = None,
        extra_metric_keys: Iterable[str] | None = None,
        checkpoint_dir: str | Path | None = None,
        robust_aggregation: Literal["trusted-clip", "centered-clip", "mean"] = "mean",
        **balancing: Any,
    ) -> None:
        self.ps_config = ParameterServerConfig(momentum=momentum, aggregation=aggregation)
        super().__init__(
            **parameter_server_keywords(
                initial_batch_size=initial_batch_size, lr=lr, evaluate=False
            ),
            keys=keys,
            telemetry_path=telemetry_path,
            min_train_nodes=min_train_nodes,
            min_available_nodes=min_available_nodes,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            min_train_silos=min_train_silos,
            max_num_examples=max_num_examples,
            max_reply_bytes=max_reply_bytes,
            extra_metric_keys=extra_metric_keys,
            checkpoint_dir=checkpoint_dir,
            robust_aggregation=robust_aggregation,
            **balancing,
        )
        self.aggregation = self.ps_config.aggregation
        self.updates = GradientUpdate(
            lr=self.config.lr,
            momentum=self.ps_config.momentum,
            aggregation=self.aggregation,
            robust=self.robust_aggregator(),
        )

    @property
    def optimizer(self) -> SGD:
        """The server's SGD (its momentum buffers carry over between iterations)."""
        assert isinstance(self.updates, GradientUpdate)
        return self.updates.optimizer

    @property
    def scheme(self) -> str:
        """``"bsp"``, ``"lbbsp"``, or ``"lbbsp-naive"`` for the biased aggregation."""
        name = "lbbsp" if self.config.balance else "bsp"
        return name if self.aggregation == "weighted" else f"{name}-naive"
