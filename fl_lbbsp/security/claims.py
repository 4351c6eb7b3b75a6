"""Bounded claims: what a silo says of itself is checked against what the server knows.

A reply carries three claims the server acts on: the dataset size (``num-examples``, its
say in the FL aggregate), the compute time (``train-time``, from which its speed and next
batch size follow) and, encrypted, the encryption time (``he-time``). The
:class:`ClaimChecker` bounds each one:

- The dataset size is pinned at the silo's first accepted report (or declared beforehand,
  e.g. by a silo registry) and capped: a later change, or a claim over the cap, is
  rejected (not re-weighted, so the aggregate stays honest in the encrypted path too).
- The claimed times are clipped to finite positive bounds and checked against the wall
  time the server observed from instruction to reply, less the messaging overhead
  (:meth:`ClaimChecker.check_times`, :func:`~fl_lbbsp.core.round.deadline.honest_gap`).
  Without a learned or given overhead no claim is judged too small; the engine judges the
  first observed round's claims when it closes (its cold starts dwarf any compute).

The observation bounds the speed a silo can claim: LB-BSP hands out batch sizes in
proportion to predicted speed (Chen et al., "Accelerating Distributed Learning in
Non-Dedicated Environments", IEEE TCC 2021, Sec. 3.3, Alg. 1), so a silo that reports
its time divided by f would get about f times its share and make every round wait for it;
with the check it gains at most a factor ``tolerance`` once its true time exceeds about
``tolerance`` times the messaging overhead (a lie within the messaging jitter cannot be
told from it), and a silo caught in ``strikes`` consecutive rounds is timed by the
server from then on (one round's start-up spike on a busy machine does not brand an honest
silo for good).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.round.deadline import OverheadTracker, honest_gap
from ..core.round.trust import CheckedTimes, ClaimPolicy, ClaimsState
from .update_screen import cap_weights

__all__ = ["ClaimChecker"]


class ClaimChecker(ClaimPolicy):
    """Pins dataset sizes, bounds claimed times, caps the weights of undeclared sizes (see
    the module's notes): the :class:`~fl_lbbsp.core.round.trust.ClaimPolicy` of the
    defence layer. Its bounds are the settings' (:class:`~fl_lbbsp.core.settings.Tuning`
    validates them, :meth:`~fl_lbbsp.core.settings.BalancingConfig.claim_bounds`).

    Parameters
    ----------
    max_dataset_size, tolerance, min_time, max_time : int | None, float, float, float
        The claim bounds, as :class:`~fl_lbbsp.core.settings.Tuning` documents them
        (``max_dataset_size``, ``time_tolerance``, ``min_claimed_time``,
        ``max_claimed_time``; the same defaults).
    overhead_rounds : int (default: 3)
        The messaging overhead is the largest of this many recent rounds' (each round's
        :func:`honest_gap`).
    declared_sizes : Mapping[str, int] | None (default: None)
        Silo id -> dataset size declared beforehand (a silo registry); these are not
        capped, and a silo's claim must match its declared size.
    strikes : int (default: 2)
        Consecutive rounds whose claim an observation contradicts as far too small before
        a silo is timed by the server for good; >= 1.
    max_weight_ratio : float | None (default: 2.0)
        An undeclared size weighs at most this many times the federation's median size
        (:func:`~fl_lbbsp.security.update_screen.cap_weights`); ``None``: not capped.
    """

    def __init__(
        self,
        *,
        max_dataset_size: int | None = 10_000_000,
        tolerance: float = 2.0,
        min_time: float = 1e-6,
        max_time: float = 86400.0,
        overhead_rounds: int = 3,
        declared_sizes: Mapping[str, int] | None = None,
        strikes: int = 2,
        max_weight_ratio: float | None = 2.0,
    ) -> None:
        super().__init__()
        self.max_dataset_size = max_dataset_size
        self.tolerance = float(tolerance)
        self.min_time, self.max_time = float(min_time), float(max_time)
        self.strikes = strikes
        self.contradicted: dict[str, int] = {}
        """Silo -> consecutive rounds its claimed time was contradicted as far too small."""
        self.distrusted: set[str] = set()
        """Silos whose claimed time observations contradicted as far below them in
        ``strikes`` consecutive rounds: timed by the server since (their claim, or the
        observation net of the overhead if that is longer)."""
        self.overhead_rounds = overhead_rounds
        self.overhead = OverheadTracker(overhead_rounds)
        """Messaging overhead between a silo's compute and the server's observation."""
        self.max_weight_ratio = max_weight_ratio
        self.declare(declared_sizes or {})

    def declare(self, sizes: Mapping[str, int]) -> None:
        """Declare silos' dataset sizes (silo id -> size), e.g. from a silo registry.

        Raises
        ------
        ValueError
            If a size is not a positive integer.
        """
        for silo, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ValueError(f"declared size of silo {silo} must be a positive integer")
            self.declared[str(silo)] = size

    # ------------------------------------------------------------ dataset sizes
    def check_size(self, silo: str, claimed: Any) -> str | None:
        """Check a reply's dataset size; pin it at the silo's first accepted claim.

        Returns
        -------
        str | None
            Why the claim is rejected; ``None`` if it is accepted.
        """
        if isinstance(claimed, bool) or not isinstance(claimed, int | float):
            return f"num-examples {claimed!r:.40} is not a number"
        size = float(claimed)
        expected = self.declared.get(silo, self.sizes.get(silo))
        if expected is not None:
            if size != expected:
                source = "declared" if silo in self.declared else "pinned at its first report"
                return f"num-examples {size:g} differs from its {expected} ({source})"
            return None
        cap = self.max_dataset_size
        if cap is not None and size > cap:
            return (
                f"num-examples {size:g} is over max_dataset_size {cap} "
                "(raise it, or declare the silo's size, to accept it)"
            )
        if not size.is_integer() or size <= 0:
            return f"num-examples {size:g} is not a positive integer"
        self.sizes[silo] = int(size)
        return None

    # -------------------------------------------------------------------- times
    def check_times(
        self,
        train_time: float,
        he_time: float | None,
        *,
        observed: float | None,
        overhead: float | None = None,
        silo: str | None = None,
    ) -> CheckedTimes:
        """Bound a reply's claimed times; cross-check them with ``observed`` if given.

        ``train_time`` is clipped to ``[min_time, max_time]``, ``he_time`` to
        ``[0, max_time]``. Then a total ``c = train_time + he_time`` above
        ``observed * tolerance`` is cut to ``observed``; one with
        ``(c + h) * tolerance < observed`` (``h`` the overhead) becomes ``observed - h``,
        the missing time added to the train-time (the claim that sets the speed).

        Parameters
        ----------
        train_time : float
            The claimed compute time (finite; the balancer rejects the rest).
        he_time : float | None
            The claimed encryption time, if any.
        observed : float | None
            The observed wall time; ``None``: none (no cross-check).
        overhead : float | None (default: None)
            The messaging overhead ``h`` to take off; ``None``: the one learned from
            earlier rounds. Before any is learned (and none is given) no claim is judged
            too small.
        silo : str | None (default: None)
            The silo: one whose claim was far below its observation in ``strikes``
            consecutive rounds is distrusted from then on, its train-time at least
            ``observed - h`` (less its he-time), so that a liar cannot slip back in with
            lies that hide in the messaging jitter.
        """
        notes = []
        train, he = train_time, he_time
        if math.isfinite(train) and not self.min_time <= train <= self.max_time:
            train = min(max(train, self.min_time), self.max_time)
            notes.append(f"train-time {train_time:g} s clipped to {train:g} s")
        if he is not None and math.isfinite(he) and not 0 <= he <= self.max_time:
            he = min(max(he, 0.0), self.max_time)
            notes.append(f"he-time {he_time:g} s clipped to {he:g} s")
        if observed is not None and math.isfinite(observed) and observed > 0:
            fixed = he or 0.0
            claimed = train + fixed
            judged = overhead is not None or self.learned
            if overhead is None:
                overhead = self.overhead.predict()
            net = observed - overhead
            if claimed > observed * self.tolerance:
                train = min(train, observed)
                he = None if he is None else observed - train
                notes.append(
                    f"claimed {claimed:.4g} s is above the {observed:.4g} s observed: "
                    f"train-time {train:.4g} s, he-time {he or 0.0:.4g} s"
                )
            elif judged and (claimed + overhead) * self.tolerance < observed:
                train = net - fixed
                notes.append(
                    f"claimed {claimed:.4g} s is far below the {net:.4g} s observed "
                    f"(net of {overhead:.3g} s overhead): train-time "
                    f"{train:.4g} s"
                )
                if silo is not None:
                    self.contradicted[silo] = self.contradicted.get(silo, 0) + 1
                    if self.contradicted[silo] >= self.strikes:
                        self.distrusted.add(silo)
                return CheckedTimes(train, he, "; ".join(notes))
            elif silo in self.distrusted and net - fixed > train:
                train = net - fixed
                notes.append(
                    f"timed by the server since a contradicted claim: {net:.4g} s observed "
                    f"(net of {overhead:.3g} s overhead), train-time {train:.4g} s"
                )
            if silo is not None and judged:
                self.contradicted.pop(silo, None)  # a consistent round ends the streak
        return CheckedTimes(train, he, "; ".join(notes) or None)

    @property
    def learned(self) -> bool:
        """Whether a messaging overhead was learned (after the first observed round)."""
        return bool(self.overhead.seen)

    def learn_overhead(self, gaps: Iterable[float]) -> None:
        """Learn one round's messaging overhead from its silos' gaps (observed minus
        claimed time): their :func:`honest_gap` (the wall time minus the slowest claim,
        which the deadline's overhead uses, would let the slowest silo, a liar, set it)."""
        gap = honest_gap(gaps)
        if gap is not None:
            self.overhead.observe(gap, 0.0)

    def weights(self, claimed: Mapping[str, float]) -> dict[str, tuple[float, str | None]]:
        """Each silo's aggregation weight, an undeclared size capped relative to the
        pinned and declared ones (:func:`~fl_lbbsp.security.update_screen.cap_weights`)."""
        return cap_weights(
            claimed,
            known={s: float(n) for s, n in self.sizes.items()},
            declared={s: float(n) for s, n in self.declared.items()},
            max_weight_ratio=self.max_weight_ratio,
        )

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> ClaimsState:
        """The pinned sizes, the distrusted silos and the learned overhead."""
        return ClaimsState(
            sizes=dict(self.sizes),
            distrusted=sorted(self.distrusted),
            contradicted=dict(self.contradicted),
            overhead=[float(t) for t in self.overhead.seen],
        )

    def load_state_dict(self, state: ClaimsState | Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (a mapping is validated as a :class:`ClaimsState`)."""
        state = ClaimsState.model_validate(state)
        self.sizes = dict(state.sizes)
        self.distrusted = set(state.distrusted)
        self.contradicted = dict(state.contradicted)
        self.overhead = OverheadTracker(self.overhead_rounds, state.overhead)
