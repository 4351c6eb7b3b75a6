"""LB-BSP for apps on Flower's legacy strategy API (``flwr.server.strategy``).

:class:`LBBSPStrategy` is ``flwr.server.strategy.FedAvg`` with one change per round: each
sampled client gets its own ``FitIns`` whose config carries its batch size B_i (from the
same :class:`~fl_lbbsp.core.BatchSizeBalancer` as
:class:`~fl_lbbsp.strategies.LBBSPFedAvg`), tau and eta; ``aggregate_fit`` reports every
``FitRes``' metrics to the balancer, then averages the parameters as FedAvg does, weighted
by ``FitRes.num_examples`` (the local dataset size, which must not depend on B_i) under the
weight cap, in the model's dtypes. Under Flower's ``SecAggPlusWorkflow`` the server sees
only the securely aggregated parameters and each client's own metrics, which is all the
balancer needs.

The client returns, as in any legacy ``NumPyClient.fit``:
``(parameters, len(local_data), {"train-time": t, "batch-size": B_i,
"samples-processed": B_i * tau, "silo-id": "..."})``.
"""

from __future__ import annotations

import logging
import time
from functools import partial
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

from ..contract import InvalidReplyError, RecordKeys
from ..core.aggregation import weighted_average
from ..core.round.engine import RoundEngine
from ..core.round.state import Reply, RoundState
from ..core.settings import BalancingKnobs, ReplyLimits, Tuning, balancing_config
from ..security.guard import guard
from ..security.screening import Layout, check_npy_list, layout_of_npy
from ..telemetry import TelemetryWriter
from .config import ServerConfig
from .outcomes import (
    RoundOutcomes,
    batch_size_metrics,
    log_decision,
    route_to_flower,
    warn_overridden_lr,
)
from .rounds import EngineView
from .validation import log_rejected, log_skipped

__all__ = ["LBBSPStrategy"]

log = logging.getLogger("fl_lbbsp")

_BALANCING = frozenset(
    {*BalancingKnobs.model_fields, *Tuning.model_fields, "balancing", "balancer_options"}
)


class LBBSPStrategy(EngineView, FedAvg):
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
    **settings : Any
        The balancing keywords (``balance``, ``estimator``, ``allocator``,
        ``max_change_ratio``, ... of :class:`~fl_lbbsp.core.settings.BalancingKnobs`,
        or ``balancing=BalancingKnobs(...)``), the reply limits (``min_train_silos``,
        ``max_num_examples``, ``max_reply_bytes``, ``extra_metric_keys``, as in
        :class:`~fl_lbbsp.strategies.LBBSPFedAvg`), and everything
        :class:`flwr.server.strategy.FedAvg` takes (``fraction_fit``,
        ``min_fit_clients``, ``on_fit_config_fn``, ``initial_parameters``, ...).
        Every ``FitRes`` is screened as in LBBSPFedAvg (``silo-id`` accepted in the
        metrics) before it reaches the balancer or FedAvg's average; a rejected one is
        logged, written to the telemetry and handed to FedAvg as a failure (so
        ``accept_failures=False`` drops the round).
    keys : RecordKeys | None (default: None)
        Names of the config and metric entries; the client's stable id is the
        ``keys.silo_id`` (``silo-id``) entry of its fit metrics (else its cid).
    telemetry_path : str | Path | None (default: None)
        JSON-lines file the per-round telemetry is appended to.
    max_empty_rounds : int (default: 3)
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`: rounds in a row without an
        aggregated update after which the run stops with
        :class:`~fl_lbbsp.strategies.outcomes.NoUpdateError`.
    max_weight_ratio : float | None (default: 2.0)
        As in :class:`~fl_lbbsp.strategies.LBBSPFedAvg`: an undeclared dataset size
        (``FitRes.num_examples``) weighs at most this many times the federation's median
        and never more than all the others together; ``None``: every size counts whole.

    Notes
    -----
    The parameters are averaged by ``FitRes.num_examples`` as FedAvg averages them, but
    capped (``max_weight_ratio``) and each layer kept in the global model's dtype: an
    integer one (BatchNorm's ``num_batches_tracked``) rounded, which Flower's FedAvg
    zeroes (``inplace=True``) or turns into float64 (``inplace=False``). Unlike
    ``LBBSPFedAvg`` there is no update screen and no robust aggregation: FedAvg's mean.
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        local_steps: int,
        lr: float,
        keys: RecordKeys | None = None,
        telemetry_path: str | Path | None = None,
        max_empty_rounds: int = 3,
        max_weight_ratio: float | None = 2.0,
        **settings: Any,
    ) -> None:
        if isinstance(max_empty_rounds, bool) or not isinstance(max_empty_rounds, int):
            raise TypeError(f"max_empty_rounds must be an int, got {max_empty_rounds!r}")
        if max_empty_rounds < 1:
            raise ValueError(f"max_empty_rounds must be >= 1, got {max_empty_rounds}")
        balancing = {k: v for k, v in settings.items() if k in _BALANCING}
        limits = {k: v for k, v in settings.items() if k in ReplyLimits.model_fields}
        super().__init__(**{k: v for k, v in settings.items() if k not in {*balancing, *limits}})
        self.keys = keys or RecordKeys()
        self.engine = RoundEngine(
            config=balancing_config(
                initial_batch_size=initial_batch_size, local_steps=local_steps, lr=lr, **balancing
            ),
            keys=self.keys,
            limits=ReplyLimits(**limits),
            weight_key=self.keys.num_examples,
        )
        ratio = ServerConfig(max_weight_ratio=max_weight_ratio).max_weight_ratio  # validated
        guard(self.engine, also_known=(self.keys.silo_id,), max_weight_ratio=ratio)
        self.telemetry = TelemetryWriter(telemetry_path)
        self.round: RoundState | None = None
        self._layout: Layout | None = None
        self._config_checked = False  # the app's fit config held against eta and tau once
        self.outcomes = RoundOutcomes(max_empty_rounds=max_empty_rounds)
        route_to_flower()

    def __repr__(self) -> str:
        return f"LBBSPStrategy(scheme={self.scheme}, accept_failures={self.accept_failures})"

    @property
    def scheme(self) -> str:
        """``"lbbsp"`` when balancing, ``"fedavg"`` otherwise."""
        return "lbbsp" if self.config.balance else "fedavg"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample clients like FedAvg; the engine gives each its instruction."""
        sampled = super().configure_fit(server_round, parameters, client_manager)
        self._layout = layout_of_npy(parameters.tensors)
        state = self.engine.plan(
            server_round,
            [client.cid for client, _ in sampled],
            expected_bytes=sum(len(t) for t in parameters.tensors),
        )
        self.round = state
        if sampled and not self._config_checked:  # on_fit_config_fn's, once
            self._config_checked = True
            warn_overridden_lr(
                sampled[0][1].config,
                keys=self.keys,
                lr=self.engine.config.lr,
                owner=self,
                local_steps=self.engine.config.local_steps,
            )
        fit = []
        for client, ins in sampled:
            sent = state.instructions[client.cid]
            config: dict[str, Scalar] = dict(ins.config)
            config[self.keys.batch_size] = sent.batch_size
            config[self.keys.local_steps] = sent.local_steps
            config[self.keys.lr] = sent.lr
            config[self.keys.server_round] = server_round
            fit.append((client, FitIns(ins.parameters, config)))
        return fit

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Screen every result, report the valid ones to the balancer, average like FedAvg.

        Rejected results go to FedAvg as failures; with fewer than ``min_train_silos``
        valid results the round is skipped (no new parameters).
        """
        state = self.round
        if state is None:
            raise RuntimeError("aggregate_fit called before configure_fit")
        wall = time.perf_counter() - state.started
        # In client order, not the order Flower's threads finished in: a float sum depends
        # on its order, and the same seed should give the same model twice.
        results = sorted(self._from_secure_aggregation(results), key=lambda r: r[0].cid)
        valid: list[tuple[str, ClientProxy, FitRes]] = []
        rejected: list[tuple[dict[str, Any], tuple[ClientProxy, FitRes] | None]] = []
        for client, res in results:
            metrics = {**res.metrics, self.keys.num_examples: res.num_examples}
            reply = Reply(
                node=client.cid,
                silo=res.metrics.get(self.keys.silo_id),
                metrics=metrics,
                nbytes=sum(len(t) for t in res.parameters.tensors) + 64 * len(res.metrics),
            )
            verdict = self.engine.screen(state, reply, partial(self._check_arrays, res))
            if not verdict.accepted:
                entry = log_rejected(
                    self.telemetry,
                    scheme=self.scheme,
                    server_round=server_round,
                    silo=verdict.silo,
                    node=client.cid,
                    reason=verdict.reason or "",
                )
                rejected.append((entry, (client, res)))
                continue
            if self.engine.report(state, verdict, metrics):  # False: a claim rejected
                valid.append((verdict.silo, client, res))
        failed = _failed(failures)
        state.rejected.extend({"silo": silo, "reason": why} for silo, why in failed)
        unknown = sum(1 for silo, _ in failed if silo == "?")
        for k, (silo, why) in enumerate(failed):  # said like a rejected reply
            name = silo if silo != "?" or unknown == 1 else f"?{k + 1}"
            entry = log_rejected(
                self.telemetry,
                scheme=self.scheme,
                server_round=server_round,
                silo=name,
                node=silo,
                reason=why,
            )
            rejected.append((entry, None))
        # a client that failed did reply (with its error): not a timeout; Flower does not
        # say which client an exception was raised for, but when the exceptions account for
        # every client without a result, none of them timed out
        replied = [*(c.cid for c, _ in results), *(silo for silo, _ in failed)]
        silent = [str(cid) for cid in state.instructions if str(cid) not in set(replied)]
        if len(silent) == sum(1 for silo, _ in failed if silo == "?"):
            replied += silent
        extra = self.engine.close(state, replied=replied, wall=None)
        skipped = None
        if len(valid) < self.min_train_silos:
            skipped = f"{len(valid)} valid results, min_train_silos is {self.min_train_silos}"
            log_skipped(
                self.telemetry, scheme=self.scheme, server_round=server_round, reason=skipped
            )
        log_decision(
            scheme=self.scheme,
            state=state,
            keys=self.keys,
            rejected=[entry for entry, _ in rejected],
            telemetry=self.telemetry,
            wall=wall,
            extra={"missed": extra["missed"], "skipped": skipped},
            silo_id=self.engine.silo_id,
        )
        if skipped is not None:
            self.outcomes.close(state, aggregated=False, skipped=skipped)
            return None, {}
        parameters, metrics, why = None, {}, "FedAvg aggregated nothing"
        if valid and (self.accept_failures or not (failures or rejected)):  # as FedAvg's
            try:
                parameters, metrics = self._mean(state, valid)
            except ValueError as err:  # a mean that overflows: the model stays as it was
                why = f"the mean is unusable: {err}"
                log.error("round %d skipped: %s", server_round, why)
        self.outcomes.close(state, aggregated=parameters is not None, skipped=why)
        metrics.update(batch_size_metrics(state, keys=self.keys, silo_id=self.engine.silo_id))
        return parameters, metrics

    def _mean(
        self, state: RoundState, valid: list[tuple[str, ClientProxy, FitRes]]
    ) -> tuple[Parameters, dict[str, Scalar]]:
        """FedAvg's mean of the valid results by their dataset sizes as the claim policy
        weighs them (an undeclared size capped, as in
        :class:`~fl_lbbsp.strategies.LBBSPFedAvg`: :meth:`RoundEngine.weights`), each
        layer in the global model's dtype, an integer one rounded (Flower's
        ``aggregate_inplace`` multiplies an integer layer such as BatchNorm's
        ``num_batches_tracked`` by its weight cast to an integer, 0; ``inplace=False``
        returns it as float64); then ``fit_metrics_aggregation_fn``, as FedAvg calls it,
        each result at that weight (rounded). Under SecAgg+ every result holds the same
        unmasked mean, which the protocol weighted already: it is returned as it is,
        nothing capped or decoded again."""
        shared = valid[0][2].parameters
        secure = len(valid) > 1 and all(res.parameters is shared for _, _, res in valid)
        claimed = {silo: res.num_examples for silo, _, res in valid}
        weights = (
            {s: (n, None) for s, n in claimed.items()} if secure else self.engine.weights(claimed)
        )
        for silo, (weight, capped) in weights.items():
            if capped is not None:
                state.reports.setdefault(silo, {})["capped-weight"] = weight
                if self.outcomes.first_time(silo, "capped weight"):
                    log.warning("round %d: silo %s: %s", state.server_round, silo, capped)
        metrics: dict[str, Scalar] = {}
        if self.fit_metrics_aggregation_fn is not None:
            metrics = self.fit_metrics_aggregation_fn(
                [(max(1, round(weights[silo][0])), res.metrics) for silo, _, res in valid]
            )
        if secure:
            return shared, metrics
        arrays = weighted_average(
            [parameters_to_ndarrays(res.parameters) for _, _, res in valid],
            [weights[silo][0] for silo, _, _ in valid],
        )
        return ndarrays_to_parameters(arrays), metrics

    def _check_arrays(self, res: FitRes) -> None:
        if self._layout is None:
            raise InvalidReplyError("no numpy global model to compare the parameters with")
        check_npy_list(res.parameters.tensors, self._layout)

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


def _failed(
    failures: list[tuple[ClientProxy, FitRes] | BaseException],
) -> list[tuple[str, str]]:
    """(client, why) of each failure Flower handed over: an exception raised for a client
    (its message; Flower does not say which client: ``"?"``) or a ``FitRes`` whose status
    is not OK."""
    failed = []
    for failure in failures:
        if isinstance(failure, BaseException):
            text = str(failure).strip().splitlines()
            failed.append(("?", f"failed: {type(failure).__name__}: {text[-1] if text else ''}"))
        else:
            client, res = failure
            failed.append((client.cid, f"failed: {res.status.message}"))
    return failed
