"""What the round engine asks before it believes a reply, believing by default.

The principle: the core holds LB-BSP itself, what it decides from what it is told (batch
sizes from predicted speeds, tau and eta the same for all, each update weighted by its
silo's dataset size: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.3 and 3.5) and the round's bookkeeping (a reply
answers this round's instruction to its node, in time, once; an error reply counts for
nothing). What a silo is trusted to say is not the core's call: the engine
(:class:`~fl_lbbsp.core.round.engine.RoundEngine`) asks two collaborators, injected:

- a :class:`ReplyGate`: who sent a reply (before anything in it is believed) and whether
  its content may be read (size, records, the contract's metrics);
- a :class:`ClaimPolicy`: which dataset size and times of a silo to believe, and the
  weight each size gets in the aggregate and in the noise budget.

Both, as defined here, believe every reply: for runs whose silos are honest by
construction and for tests of the engine alone. The defence layer (:mod:`fl_lbbsp.security`:
signatures, bounded claims, capped weights, the reply screen) overrides them and is
composed onto the engine by :func:`fl_lbbsp.security.guard.guard`, which the strategies
apply by default, as Flower's DP wrappers wrap a strategy. A cap on an undeclared dataset
size is such a defence: LB-BSP weighs a silo by the size it has; capping is distrust of
the size it claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from ..balancer_state import MAX_SILOS, SiloId
from ..silo.state import MAX_ENTRIES, Count, Seconds
from .state import Reply, RoundState

__all__ = ["CheckedTimes", "ClaimPolicy", "ClaimsState", "ReplyGate"]


class ClaimsState(BaseModel):
    """A claim policy's state (:meth:`ClaimPolicy.state_dict`, a checkpoint's).

    Parameters
    ----------
    sizes : dict of str to int (default: {})
        Silo id -> its pinned dataset size (a positive integer).
    distrusted : list of str (default: [])
        Silos timed by the server since they were caught lying.
    contradicted : dict of str to int (default: {})
        Silo -> consecutive rounds its claimed time was contradicted (not yet distrusted).
    overhead : list of float (default: [])
        The learned messaging overhead of recent rounds, seconds (finite, >= 0).
    """

    model_config = ConfigDict(extra="forbid")

    sizes: dict[SiloId, Annotated[int, Field(gt=0, le=2**53, strict=True)]] = Field(
        default_factory=dict, max_length=MAX_SILOS
    )
    distrusted: list[SiloId] = Field(default_factory=list, max_length=MAX_SILOS)
    contradicted: dict[SiloId, Count] = Field(default_factory=dict, max_length=MAX_SILOS)
    overhead: list[Seconds] = Field(default_factory=list, max_length=MAX_ENTRIES)


class CheckedTimes(NamedTuple):
    """A reply's times after the checks: the compute and encryption times to believe
    (``he_time`` ``None``: none claimed), and why the claim was changed (``note``
    ``None``: believed as claimed)."""

    train_time: float
    he_time: float | None
    note: str | None = None


class ReplyGate:
    """Admits a train reply before the engine believes it; each check raises
    :class:`~fl_lbbsp.contract.InvalidReplyError` with the reason. This one admits every
    reply: silo ids are believed."""

    def admit(self, state: RoundState, reply: Reply, silo: str) -> None:
        """Who sent ``reply`` (not an error reply, claiming ``silo``): before the duplicate
        checks, so that an impostor replying first cannot shut the silo out."""

    def check(self, state: RoundState, reply: Reply) -> None:
        """What ``reply`` (not an error reply) carries, before its update is parsed."""


class ClaimPolicy:
    """Which of a silo's claims the engine believes, and the weight of its dataset size.
    This one believes every claim: a silo's size is the last positive whole number it
    claimed, its times are its claims, each size weighs as it is."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        """Silo -> the dataset size believed (pinned at its first accepted claim)."""
        self.declared: dict[str, int] = {}
        """Silo -> its size declared beforehand (a silo registry)."""

    @property
    def learned(self) -> bool:
        """Whether claimed times can be judged as they come; ``False``: the engine holds a
        round's timings until it closes (:meth:`check_times` with its ``overhead``)."""
        return True

    def check_size(self, silo: str, claimed: Any) -> str | None:
        """Why ``silo``'s claimed dataset size is rejected; ``None``: believed."""
        if isinstance(claimed, int | float) and 0 < claimed <= 2**53:  # exact in a float64
            self.sizes[silo] = int(claimed)
        return None

    def check_times(
        self,
        train_time: float,
        he_time: float | None,
        *,
        observed: float | None,
        overhead: float | None = None,
        silo: str | None = None,
    ) -> CheckedTimes:
        """The claimed times to believe, given the wall time ``observed`` by the server
        (``None``: not observed) net of the messaging ``overhead`` (``None``: learned)."""
        return CheckedTimes(train_time, he_time)

    def learn_overhead(self, gaps: Iterable[float]) -> None:
        """Learn from one round's gaps between observed and claimed times."""

    def weights(self, claimed: Mapping[str, float]) -> dict[str, tuple[float, str | None]]:
        """Silo -> (its aggregation weight for the dataset size it claims, why it is not
        that size or ``None``)."""
        return {silo: (float(size), None) for silo, size in claimed.items()}

    def state_dict(self) -> ClaimsState:
        """The policy's state, for a checkpoint."""
        return ClaimsState(sizes=dict(self.sizes))

    def load_state_dict(self, state: ClaimsState | Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (a mapping is validated as a :class:`ClaimsState`)."""
        self.sizes = dict(ClaimsState.model_validate(state).sizes)
