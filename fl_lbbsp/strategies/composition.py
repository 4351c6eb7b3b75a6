"""LB-BSP inside Flower's strategy wrappers (differential privacy with fixed clipping).

Flower's ``DifferentialPrivacyClientSideFixedClipping`` and
``DifferentialPrivacyServerSideFixedClipping`` pass the wrapped strategy's train messages
through unchanged (the client-side one adds its ``clipping_norm`` to the config each
silo's record copies), so every silo keeps its own batch size; the server-side one clips
each reply's update before ``aggregate_train``; both add Gaussian noise to the aggregate.

A wrapper runs the rounds with its own ``start`` (Flower's loop), not
:meth:`LBBSPFedAvg.start`; :func:`start_wrapped` puts the inner strategy's round
deadlines and reply polling back. Checkpoints and the extra rounds of
``spend_saved_time`` stay with ``LBBSPFedAvg.start``: a wrapped strategy with either
refuses to run (a checkpoint would hold the aggregate before the wrapper's noise). Under
the client-side wrapper no federated evaluation is sent: Flower's ``fixedclipping_mod``
fails every evaluate reply.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    Result,
    Strategy,
)

from .fedavg import EngineStrategy

__all__ = ["inner_strategy", "start_wrapped"]

log = logging.getLogger("fl_lbbsp")


def _chain(strategy: Strategy) -> Iterator[Strategy]:
    """``strategy`` and the strategies it wraps (each wrapper's ``.strategy``)."""
    seen: Strategy | None = strategy
    for _ in range(16):
        if seen is None:
            return
        yield seen
        seen = getattr(seen, "strategy", None)


def inner_strategy(strategy: Strategy) -> EngineStrategy:
    """The LB-BSP strategy (an :class:`~fl_lbbsp.strategies.EngineStrategy`, such as
    :class:`~fl_lbbsp.strategies.LBBSPFedAvg`) a wrapper (or a chain of wrappers) holds as
    ``.strategy``.

    Raises
    ------
    TypeError
        When no LBBSPFedAvg is found.
    """
    for seen in _chain(strategy):
        if isinstance(seen, EngineStrategy):
            return seen
    raise TypeError(f"{type(strategy).__name__} wraps no LBBSPFedAvg")


def start_wrapped(
    wrapper: Strategy, *, grid: Grid, initial_arrays: ArrayRecord, **options: Any
) -> Result:
    """``wrapper.start(grid=grid, ...)`` under the wrapped LBBSPFedAvg's round deadlines
    and reply polling.

    Parameters
    ----------
    wrapper : Strategy
        A strategy wrapping an :class:`LBBSPFedAvg` (e.g.
        ``DifferentialPrivacyServerSideFixedClipping(LBBSPFedAvg(...), ...)``).
    grid, initial_arrays : Grid, ArrayRecord
        As in :meth:`flwr.serverapp.strategy.Strategy.start`.
    **options :
        The other keywords of :meth:`flwr.serverapp.strategy.Strategy.start`
        (``num_rounds``, ``timeout``, ``train_config``, ``evaluate_config``,
        ``evaluate_fn``; defaults: 3 rounds, 3600 s, ``None``).

    Raises
    ------
    TypeError
        When ``wrapper`` wraps no LBBSPFedAvg, or ``options`` has a keyword ``start``
        does not take.
    ValueError
        When the inner strategy has a ``checkpoint_dir`` or ``spend_saved_time``.
    """
    inner = inner_strategy(wrapper)
    client_side = DifferentialPrivacyClientSideFixedClipping
    if any(isinstance(s, client_side) for s in _chain(wrapper)) and inner.fraction_evaluate > 0:
        # Flower's fixedclipping_mod fails every evaluate message (it wants an ArrayRecord
        # in the reply and clipping_norm in the config): do not send any.
        log.warning(
            "client-side DP (fixedclipping_mod) fails every federated evaluation reply: "
            "fraction_evaluate set to 0; evaluate centrally with evaluate_fn instead"
        )
        inner.fraction_evaluate = 0.0
    if (name := inner.server_config.start_only) is not None:
        raise ValueError(
            f"{type(inner).__name__}({name}=...) inside {type(wrapper).__name__}: checkpoints "
            f"and extra rounds are run by LBBSPFedAvg.start only; leave {name} unset"
        )
    deadlines = inner.deadline_grid(grid, timeout=options.get("timeout", 3600))
    return wrapper.start(grid=deadlines, initial_arrays=initial_arrays, **options)
