"""The defence layer composed onto a round engine, as Flower's DP wrappers wrap a strategy:
a :class:`~fl_lbbsp.core.round.engine.RoundEngine` believes every reply until :func:`guard`
gives it this package's gate and claim policy (:mod:`fl_lbbsp.core.round.trust`); the
strategies guard their engine by default."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.round.engine import RoundEngine
from .claims import ClaimChecker
from .identity import SiloRegistry
from .reply_screen import ReplyScreen

__all__ = ["guard"]


def guard(
    engine: RoundEngine,
    *,
    registry: SiloRegistry | None = None,
    max_weight_ratio: float | None = 2.0,
    also_known: Iterable[str] = (),
) -> ReplyScreen:
    """Put the defences between ``engine`` (before its first round) and its replies: the
    :class:`~.reply_screen.ReplyScreen` as its gate, the :class:`~.claims.ClaimChecker` as
    its claim policy.

    Parameters
    ----------
    engine : RoundEngine
        The engine; its ``gate`` and ``claims`` are replaced.
    registry, also_known :
        As in :class:`~.reply_screen.ReplyScreen`; the registry's declared dataset sizes
        are the claim checker's too.
    max_weight_ratio : float | None (default: 2.0)
        An undeclared dataset size weighs at most this many times the federation's median
        (``None``: every size counts whole).

    Returns
    -------
    ReplyScreen
        The gate installed (it screens evaluation replies too).
    """
    engine.gate = screen = ReplyScreen(
        keys=engine.keys,
        weight_key=engine.weight_key,
        limits=engine.limits,
        registry=registry,
        also_known=also_known,
    )
    engine.claims = ClaimChecker(
        **engine.config.claim_bounds(),
        overhead_rounds=engine.deadline.overhead_rounds,
        declared_sizes=None if registry is None else registry.dataset_sizes,
        max_weight_ratio=max_weight_ratio,
    )
    return screen
