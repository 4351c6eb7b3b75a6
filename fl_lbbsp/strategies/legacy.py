"""LB-BSP for apps on Flower's legacy strategy API (``flwr.server.strategy``).

:class:`LBBSPStrategy` is ``flwr.server.strategy.FedAvg`` with one change per round: each
sampled client gets its own ``FitIns`` whose config carries its batch size B_i (from the
same :class:`~fl_lbbsp.core.BatchSizeBalancer` as :class:`~fl_lbbsp.strategies.LBBSPFedAvg`),
tau and eta; ``aggregate_fit`` reports every ``FitRes``' metrics to the balancer before
FedAvg averages the parameters, weighted by ``FitRes.num_examples`` (the local dataset
size, which must not depend on B_i). Under Flower's ``SecAggPlusWorkflow`` the server sees
only the securely aggregated parameters and each client's own metrics, which is all the
balancer needs.

The client returns, as in any legacy ``NumPyClient.fit``:
``(parameters, len(local_data), {"train-time": t, "batch-size": B_i,
"samples-processed": B_i * tau, "silo-id": "..."})``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
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
from .validation import (
    DEFAULT_EXTRA_METRIC_KEYS,
    InvalidReplyError,
    Layout,
    check_npy_list,
    layout_of_npy,
    log_rejected,
    log_skipped,
    reply_checks,
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
    balancer_options : dict | None (default: None)
        Further balancer settings, by :class:`~fl_lbbsp.strategies.config.BalancingConfig`
        name: ``min_batch_fraction`` (the floor as a share of B_init, 0.25), ``fit``
        (``"robust"`` or ``"wls"``), ``change_sigmas``, ``change_threshold``,
        ``change_confirm``, ``order_tolerance``, ``equal_split_guard``; each defaults to
        :data:`fl_lbbsp.core.BALANCER_DEFAULTS`.
    keys : RecordKeys | None (default: None)
        Names of the config and metric entries; the client's stable id is the
        ``keys.silo_id`` (``silo-id``) entry of its fit metrics (else its cid).
    telemetry_path : str | Path | None (default: None)
        JSON-lines file the per-round telemetry is appended to.
    min_train_silos, max_num_examples, max_reply_bytes, extra_metric_keys :
        Reply validation, as in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`: every
        ``FitRes`` is checked (metrics, ``num_examples``, batch size sent, the parameters'
        shapes and dtypes against those sent, NaN and inf, size, one result per client and
        per silo) before it reaches the balancer or FedAvg's average; a rejected one is
        logged, written to the telemetry and handed to FedAvg as a failure (so
        ``accept_failures=False`` drops the round). ``silo-id`` is accepted in the metrics.
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
        balancer_options: dict[str, Any] | None = None,
        keys: RecordKeys | None = None,
        telemetry_path: str | Path | None = None,
        min_train_silos: int = 1,
        max_num_examples: int | None = None,
        max_reply_bytes: int | None = None,
        extra_metric_keys: Iterable[str] | None = DEFAULT_EXTRA_METRIC_KEYS,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.keys = keys or RecordKeys()
        limits, self.validator = reply_checks(
            keys=self.keys,
            weight_key=self.keys.num_examples,
            limits={
                "min_train_silos": min_train_silos,
                "max_num_examples": max_num_examples,
                "max_reply_bytes": max_reply_bytes,
                "extra_metric_keys": extra_metric_keys,
            },
            also_known=(self.keys.silo_id,),
        )
        self.min_train_silos = limits.min_train_silos
        self.max_reply_bytes = limits.max_reply_bytes
        self._layout: Layout | None = None
        self._sent_bytes = 0
        self._federation_size = 0
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
        self._federation_size = max(self._federation_size, len(sampled))
        sizes = allocate_batch_sizes(
            self.balancer,
            self.config,
            {client.cid: self.silo_id(client.cid) for client, _ in sampled},
            total=self.config.initial_batch_size * max(len(sampled), self._federation_size),
        )
        self._layout = layout_of_npy(parameters.tensors)
        self._sent_bytes = sum(len(t) for t in parameters.tensors)
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
        """Check every result, report the valid ones to the balancer, average like FedAvg.

        Rejected results go to FedAvg as failures; with fewer than ``min_train_silos``
        valid results the round is skipped (no new parameters).
        """
        wall = None if self._round_started is None else time.perf_counter() - self._round_started
        results = self._from_secure_aggregation(results)
        valid, rejected = self._screen(server_round, results)
        silos: dict[str, dict[str, Any]] = {}
        for client, res in valid:
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
        skipped = None
        if len(valid) < self.min_train_silos:
            skipped = f"{len(valid)} valid results, min_train_silos is {self.min_train_silos}"
            log_skipped(
                self.telemetry, scheme=self.scheme, server_round=server_round, reason=skipped
            )
        log_round(
            scheme=self.scheme,
            server_round=server_round,
            silos=silos,
            keys=self.keys,
            total_batch_size=sum(self._sent.values()),
            wall=wall,
            telemetry=self.telemetry,
            extra={
                "missed": [self.silo_id(cid) for cid in missed],
                "rejected": [entry for entry, _ in rejected],
                "skipped": skipped,
            },
        )
        if skipped is not None:
            return None, {}
        failures = [*failures, *(pair for _, pair in rejected)]
        return super().aggregate_fit(server_round, valid, failures)

    def _from_secure_aggregation(
        self, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """Results as Flower's SecAgg / SecAgg+ workflows hand them over: every ``FitRes``
        carries one and the same ``Parameters`` object, the unmasked weighted mean, which
        the protocol dequantises to float64. Cast it back to the global model's dtypes so
        that the usual checks apply (and FedAvg's mean of equal arrays is that array);
        the metrics, which the balancer needs, are each client's own. Other results are
        returned unchanged."""
        if len(results) < 2 or self._layout is None:
            return results
        shared = results[0][1].parameters
        if any(res.parameters is not shared for _, res in results):
            return results
        try:
            arrays = parameters_to_ndarrays(shared)
        except Exception:  # noqa: BLE001 - left to the checks, which name the problem
            return results
        if len(arrays) != len(self._layout):
            return results
        cast = ndarrays_to_parameters(
            [np.asarray(a).astype(spec.dtype) for a, spec in zip(arrays, self._layout, strict=True)]
        )
        for _, res in results:
            res.parameters = cast
        return results

    def _screen(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> tuple[
        list[tuple[ClientProxy, FitRes]], list[tuple[dict[str, Any], tuple[ClientProxy, FitRes]]]
    ]:
        """The results that pass every check; the others with their telemetry entries."""
        valid, rejected = [], []
        cids: set[str] = set()
        silos: set[str] = set()
        for client, res in results:
            silo = self.silo_id(client.cid)
            try:
                if self._sent and client.cid not in self._sent:
                    raise InvalidReplyError(
                        f"client {client.cid} was not sent a fit instruction this round"
                    )
                if client.cid in cids:
                    raise InvalidReplyError(
                        f"a second result from client {client.cid} in this round"
                    )
                cids.add(client.cid)
                reported = res.metrics.get(self.keys.silo_id, silo)
                if isinstance(reported, bool) or not isinstance(reported, str | int):
                    raise InvalidReplyError(
                        f"{self.keys.silo_id} must be a string, got {reported!r:.60}"
                    )
                silo = str(reported)
                if silo in silos:
                    raise InvalidReplyError(f"a second result for silo {silo} in this round")
                silos.add(silo)
                self._check_result(client.cid, res)
            except InvalidReplyError as err:
                entry = log_rejected(
                    self.telemetry,
                    scheme=self.scheme,
                    server_round=server_round,
                    silo=silo,
                    node=client.cid,
                    reason=str(err),
                )
                rejected.append((entry, (client, res)))
                continue
            valid.append((client, res))
        return valid, rejected

    def _check_result(self, cid: str, res: FitRes) -> None:
        tensors = res.parameters.tensors
        size = sum(len(t) for t in tensors) + 64 * len(res.metrics)
        cap = self.max_reply_bytes or 4 * self._sent_bytes + (1 << 20)
        if size > cap:
            raise InvalidReplyError(f"reply of {size} bytes is over the {cap}-byte cap")
        metrics = {**res.metrics, self.keys.num_examples: res.num_examples}
        self.validator.check_metrics(metrics, sent_batch_size=self._sent.get(cid))
        if self._layout is None:
            raise InvalidReplyError("no numpy global model to compare the parameters with")
        check_npy_list(tensors, self._layout)
