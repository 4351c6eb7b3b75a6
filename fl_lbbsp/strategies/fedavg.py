"""LB-BSP on Flower's Message API: FedAvg with a per-silo batch size every round.

The federated strategy over the round engine (:mod:`fl_lbbsp.core.round.engine`), which decides
every batch size, screens every reply and feeds the balancer. Like Flower's FedProx it
changes FedAvg's training round only (:class:`~fl_lbbsp.strategies.engine_strategy.EngineStrategy`:
``configure_train`` gives each sampled node its own instruction, ``aggregate_train``
hands the replies to a :class:`~fl_lbbsp.strategies.train_round.TrainRound`). Its variants
are the same class composed with another part: a rewriter or a selector (the baselines),
encrypted sums (:class:`~fl_lbbsp.strategies.updates.Updates`); checkpointing is the
wrapper strategy :class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`; the parameter
server is its sibling, :class:`~fl_lbbsp.strategies.LBBSPCluster`.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.5 (LB-BSP for cross-silo FL: tune B per silo, keep tau and eta).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from .config import settings_of_run_config
from .engine_strategy import EngineStrategy
from .outcomes import NoUpdateError

__all__ = ["LBBSPFedAvg", "NoUpdateError"]


class LBBSPFedAvg(EngineStrategy):
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
    lines. Every reply is screened before any of it is used
    (:mod:`fl_lbbsp.security.reply_screen`): a rejected one gets one warning naming round,
    silo, node and reason, and a ``rejected`` telemetry event.

    Parameters
    ----------
    initial_batch_size, local_steps, lr : int, int, float
        B_init (every silo's batch size in round 1; X = n * B_init every round), tau and
        eta, sent to every silo.
    **settings :
        Every other setting is declared once, with its doc, default and bounds, in a
        settings model: balancing (``balance``, ``estimator``, ``allocator``,
        ``noise_budget``, ...): :class:`~fl_lbbsp.core.settings.BalancingConfig`; the
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
    clock : Callable[[], float] (default: time.monotonic)
        The clock that times each reply from push to pull; injected by tests.

    Raises
    ------
    InvalidSettingError
        (a ``ValueError``) On a bad setting, naming the keyword, its bounds and value.
    TypeError
        ``keys`` is neither a ``RecordKeys`` nor a mapping of its fields.
    """

    def __init__(
        self, *, initial_batch_size: int, local_steps: int, lr: float, **settings: Any
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            local_steps=local_steps,
            lr=lr,
            parameter_server=False,
            **settings,
        )

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
