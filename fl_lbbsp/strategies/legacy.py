"""LB-BSP for apps on Flower's legacy strategy API (``flwr.server.strategy``).

:class:`LBBSPStrategy` is ``flwr.server.strategy.FedAvg`` with one change per round: each
sampled client gets its own ``FitIns`` whose config carries its batch size B_i (from the
same :class:`~fl_lbbsp.core.BatchSizeBalancer` as :class:`~fl_lbbsp.strategies.LBBSPFedAvg`),
tau and eta; ``aggregate_fit`` reports every ``FitRes``' metrics to the balancer before
FedAvg averages the parameters, weighted by ``FitRes.num_examples`` (the local dataset
size, which must not depend on B_i).

The client returns, as in any legacy ``NumPyClient.fit``:
``(parameters, len(local_data), {"train-time": t, "batch-size": B_i,
"samples-processed": B_i * tau, "silo-id": "..."})``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flwr.common import FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from ..contract import RecordKeys
from ..telemetry import TelemetryWriter
from .config import BalancingConfig
from .rounds import (
    allocate_batch_sizes,
    balancer_from_config,
    feed_balancer,
    log_round,
    missing,
)

__all__ = ["LBBSPStrategy"]

log = logging.getLogger("fl_lbbsp")


class LBBSPStrategy(FedAvg):
    """Legacy-API FedAvg whose clients get batch sizes proportional to their speed.

    A drop-in for ``flwr.server.strategy.FedAvg``: add ``initial_batch_size``,
    ``local_steps`` and ``lr``, keep every FedAvg argument. Each client's ``FitIns``
    config gets ``batch-size``, ``local-steps``, ``lr`` and ``server-round`` on top of
    what ``on_fit_config_fn`` returns.

    Parameters
    ----------
    initial_batch_size : int
        B_init: every client's batch size in round 1; X = n * B_init every round.
    local_steps : int
        Local SGD steps tau sent to every client.
    lr : float
        Learning rate eta sent to every client.
    balance : bool (default: True)
        ``False`` sends B_init to everybody (plain FedAvg with LB-BSP's telemetry).
    estimator : str (default: "ema")
        Speed predictor: ``"ema"``, ``"last"``, ``"narx"`` or ``"change-ema"``.
    alpha : float (default: 0.2)
        EMA weight of the latest observation, in (0, 1].
    allocator : str (default: "linear")
        ``"proportional"`` (Alg. 1), ``"linear"`` (also fits a fixed per-round cost) or
        ``"iterative"`` (Alg. 2).
    min_batch_size : int (default: 1)
        Smallest batch size handed to a client.
    max_batch_size : int | None (default: None)
        Largest batch size handed to a client; a reported ``max-batch-size`` lowers it.
    max_change_ratio : float | None (default: 2.0)
        After its first report, a client's batch size changes by at most this factor per
        round; ``None``: no limit.
    estimator_options, allocator_options : dict | None (default: None)
        Extra arguments of the estimator and of the iterative allocator.
    keys : RecordKeys | None (default: None)
        Names of the config and metric entries; the client's stable id is the
        ``keys.silo_id`` (``silo-id``) entry of its fit metrics (else its cid).
    telemetry_path : str | Path | None (default: None)
        JSON-lines file the per-round telemetry is appended to.
    **fedavg_kwargs : Any
        Everything :class:`flwr.server.strategy.FedAvg` takes (``fraction_fit``,
        ``min_fit_clients``, ``min_available_clients``, ``on_fit_config_fn``,
        ``initial_parameters``, ``evaluate_fn``, ...).
    """

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
        keys: RecordKeys | None = None,
        telemetry_path: str | Path | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.keys = keys or RecordKeys()
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
        )
        self.balancer = balancer_from_config(self.config)
        self.telemetry = TelemetryWriter(telemetry_path)
        self._silo_of_cid: dict[str, str] = {}
        self._sent: dict[str, int] = {}
        self._round_started: float | None = None

    def __repr__(self) -> str:
        return f"LBBSPStrategy(scheme={self.scheme}, accept_failures={self.accept_failures})"

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` when balancing, ``"fedavg"`` otherwise."""
        return "lbbsp" if self.config.balance else "fedavg"

    def silo_id(self, cid: str) -> str:
        """The stable silo id last reported by client ``cid`` (the cid before that)."""
        return self._silo_of_cid.get(cid, cid)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample clients like FedAvg, then give each its own FitIns and batch size."""
        sampled = super().configure_fit(server_round, parameters, client_manager)
        sizes = allocate_batch_sizes(
            self.balancer,
            self.config,
            {client.cid: self.silo_id(client.cid) for client, _ in sampled},
        )
        instructions = []
        for client, ins in sampled:
            config: dict[str, Scalar] = dict(ins.config)
            config[self.keys.batch_size] = sizes[client.cid]
            config[self.keys.local_steps] = self.config.local_steps
            config[self.keys.lr] = self.config.lr
            config[self.keys.server_round] = server_round
            instructions.append((client, FitIns(ins.parameters, config)))
        self._sent = sizes
        self._round_started = time.perf_counter()
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Report every result to the balancer, then average like FedAvg."""
        wall = None if self._round_started is None else time.perf_counter() - self._round_started
        silos: dict[str, dict[str, Any]] = {}
        for client, res in results:
            reported = res.metrics.get(self.keys.silo_id)
            if reported is not None:
                self._silo_of_cid[client.cid] = str(reported)
            silo = self.silo_id(client.cid)
            metrics = {**res.metrics, self.keys.num_examples: res.num_examples}
            silos[silo] = feed_balancer(
                self.balancer,
                silo,
                metrics,
                keys=self.keys,
                sent_batch_size=self._sent.get(client.cid),
            )
        missed = missing(self._sent, (client.cid for client, _ in results))
        log_round(
            scheme=self.scheme,
            server_round=server_round,
            silos=silos,
            keys=self.keys,
            total_batch_size=sum(self._sent.values()),
            wall=wall,
            telemetry=self.telemetry,
            extra={"missed": [self.silo_id(cid) for cid in missed]},
        )
        return super().aggregate_fit(server_round, results, failures)
