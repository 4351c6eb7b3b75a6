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

from typing import Any, Literal

from ..core.optim import SGD
from .config import ParameterServerConfig, parameter_server_keywords
from .fedavg import LBBSPFedAvg
from .updates import GradientUpdate

__all__ = ["LBBSPCluster"]


class LBBSPCluster(LBBSPFedAvg):
    """Parameter-server LB-BSP: one round = one gradient step, weighted by batch size.

    Workers get ``batch-size`` (their x_i), ``batch-offset`` (where their share starts in
    the round's global batch) and ``local-steps`` = 1, and reply with their gradient
    arrays (named like the weights); ``batch-size`` is the weight. A rejected reply is
    logged and left out of that update.

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
    robust_aggregation : {"mean", "centered-clip", "trusted-clip"} (default: "mean")
        ``"centered-clip"``: each gradient clipped around a robust centre before the
        batch-size-weighted mean (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`,
        ``clip_factor`` its radius); ``"trusted-clip"``: the same over the workers whose
        history agrees with the others' (:class:`~fl_lbbsp.core.trusted_clip.TrustedClip`).
        Off by default here: a parameter server's workers
        are one operator's machines, and the weighted mean is exactly the gradient of the
        union of their batches (Sec. 3.4), which clipping gives up.
    **settings :
        The keywords of :class:`~fl_lbbsp.strategies.LBBSPFedAvg` (``balance``:
        ``False`` is plain BSP; ``allocator="iterative"`` is Alg. 2; ``checkpoint_dir``:
        the checkpoint also holds the SGD momentum buffers). Gradients must have the
        weights' names, shapes and dtypes, and ``batch-size`` must be the one sent; an
        iteration whose step would put NaN or inf into the weights is skipped and leaves
        the momentum unchanged.

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
        robust_aggregation: Literal["trusted-clip", "centered-clip", "mean"] = "mean",
        **settings: Any,
    ) -> None:
        self.ps_config = ParameterServerConfig(momentum=momentum, aggregation=aggregation)
        super().__init__(
            **parameter_server_keywords(
                initial_batch_size=initial_batch_size, lr=lr, evaluate=False
            ),
            robust_aggregation=robust_aggregation,
            **settings,
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
