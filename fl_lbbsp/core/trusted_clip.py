"""Centred clipping with a per-silo history of agreement: a persistent opponent is dropped.

Centred clipping (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`) bounds what one round's
hostile update can do to its weight share times the clip radius. On non-IID silos that is
not enough: the honest updates are far from each other too, so the radius (a median of the
distances to the centre) is about the length of an update, and a silo that sends its own
update with the sign flipped stays inside it and keeps most of its weight every round. No
rule that looks at one round alone can tell such an update from an honest silo with
unusual data (Karimireddy, He and Jaggi, ICML 2021, show that an aggregator without
history cannot be robust to attacks spread over rounds). Cross-silo federations have what
cross-device ones lack: the silos are few, long-lived and identified (``silo-id``), so the
server can keep a history per silo.

:class:`TrustedClip` keeps, per registered silo, the exponentially decayed mean of its
**agreement**: the cosine between its update ``d_i`` and the centre of the others,
``c_-i`` (the clipped centre without silo ``i``'s own term, so that no silo agrees with
itself)::

    a_i <- decay * a_i + (1 - decay) * cos(d_i, c_-i)

Where the federation has a consensus (its silos' median agreement is positive: their
updates share a descent direction, whatever their local data add to it), an honest silo's
agreement is positive on average, and a silo that persistently sends the opposite of what
it learnt (sign flip) or of what the others send (inner-product manipulation, Xie et al.,
UAI 2020) has a negative one. A silo whose decayed agreement after ``patience`` rounds is
negative **and an outlier of the federation's**, below the round's median agreement by more
than 3 scaled MADs (the Hampel identifier [6]_), while the median agreement is positive, is
**dropped** from the aggregate (weight 0) until it is no longer one, and named: in
:attr:`TrustedClip.distrusted`, which the strategy writes to the round's telemetry, and in
a warning. Negative alone is not evidence: near a stationary point of a non-IID federation
the silos' updates nearly cancel, so an honest update opposes the others' sum (measured,
honest dirichlet:0.3: cosines of -0.07 to -0.10 on average from round 26, spread 0.18 to
0.25 per silo). The first rule (drop every negative score) left honest silos out there in 7
to 21 silo-rounds of 50 and cost 1.07 points at plateau (lower 95% bound -1.96, 8 seeds;
the Hampel rule +0.13, -0.15); it also caught a sign flip on such silos (1 of 5 at 3x: -4.2
points), which the Hampel rule, with the wide spread of 5 non-IID scores, takes for
heterogeneity (-15.0, as centred clipping; docs/security.md gives both rules' figures).
Where the median agreement is not positive, no silo is dropped: on silos of two classes
each (labels:2) honest updates oppose the others' centre (measured: decayed agreements of
-0.3 to -0.6 in an honest run), so opposition is no evidence there, and a sign flip looks
like heterogeneity (no rule can then do better than a share of the heterogeneity: the lower
bound of Karimireddy, He and Jaggi, ICLR 2022). The rest is
:class:`~fl_lbbsp.core.centered_clip.CenteredClip` over the trusted silos, so one-round
attacks (a boosted update, ALIE) are bounded as before.

What LB-BSP needs is kept:

- **Dataset-size weights.** A trusted silo keeps its (capped) weight; a dropped one has
  none, and the others are renormalised among themselves. With every silo trusted the
  result is exactly :class:`~fl_lbbsp.core.centered_clip.CenteredClip`'s.
- **Batch-size-dependent update lengths.** The cosine does not see length, so a slow
  silo's longer update (minibatch noise ``sqrt(B_eq / B_i)`` times larger) counts like a
  fast one's; zero-mean noise pulls a cosine toward 0 rather than below it, and the decay
  averages it over rounds. The clip's radii are widened by the same scale as before.

The agreement is the history of Karimireddy et al. (2021) in the form of a trust score,
as in FLTrust (Cao, Fang, Liu and Gong, NDSS 2021: a ReLU of the cosine to a reference
update), with the reference the robust centre of the other silos instead of a root data
set held by the server, and a silo's history kept across rounds as FoolsGold keeps one
(Fung, Yoon and Beschastnikh, RAID 2020). At most ``(n - 1) // 2`` of ``n`` silos are
dropped in a round (the lowest agreements): a majority that disagrees with the rest means
the reference, not the silos, is in doubt.

References
----------
.. [1] S. P. Karimireddy, L. He and M. Jaggi, "Learning from History for Byzantine Robust
   Optimization", ICML 2021 (centred clipping; history is necessary).
.. [2] X. Cao, M. Fang, J. Liu and N. Z. Gong, "FLTrust: Byzantine-robust Federated
   Learning via Trust Bootstrapping", NDSS 2021.
.. [3] C. Fung, C. J. M. Yoon and I. Beschastnikh, "The Limitations of Federated Learning
   in Sybil Settings", RAID 2020 (FoolsGold: per-client history).
.. [4] C. Xie, O. Koyejo and I. Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD
   by Inner Product Manipulation", UAI 2020.
.. [5] S. P. Karimireddy, L. He and M. Jaggi, "Byzantine-Robust Learning on Heterogeneous
   Datasets via Bucketing", ICLR 2022 (the heterogeneity lower bound; bucketing).
.. [6] F. R. Hampel, "The Influence Curve and its Role in Robust Estimation", JASA 69,
   1974; L. Davies and U. Gather, "The Identification of Multiple Outliers", JASA 88, 1993
   (the Hampel identifier: median +- k scaled MADs).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from .aggregation import normalised_weights
from .balancer_state import MAX_SILOS, SiloId
from .centered_clip import CenteredClip, clip_passes

__all__ = ["Agreement", "TrustState", "TrustedClip"]

HAMPEL_K = 3.0
"""Scaled MADs below the median that make a score an outlier (Hampel's customary 3)."""
MAD_SCALE = 1.4826
"""The MAD's consistency factor for a normal spread (``1 / Phi^-1(3/4)``)."""

log = logging.getLogger(__name__)


class Agreement(BaseModel):
    """One silo's history: its decayed agreement and the rounds it has been seen in.

    Parameters
    ----------
    score : float
        The decayed mean of its updates' cosines to the others' centre, in [-1, 1].
    rounds : int
        Rounds its update was aggregated or judged in.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: float = Field(ge=-1.0, le=1.0, allow_inf_nan=False)
    rounds: int = Field(ge=1, strict=True)


class TrustState(BaseModel):
    """:meth:`TrustedClip.state_dict` (a checkpoint's ``updates`` entry ``trust``).

    Parameters
    ----------
    silos : dict of str to Agreement (default: {})
        Silo id -> its history.
    """

    model_config = ConfigDict(extra="forbid")

    silos: dict[SiloId, Agreement] = Field(default_factory=dict, max_length=MAX_SILOS)


class TrustedClip(CenteredClip):
    """Weighted centred clipping over the silos whose history agrees with the others.

    See the module for the rule and its references. Updates added without a ``silo``
    have no history and are always aggregated (and never judged).

    Parameters
    ----------
    factor : float (default: 1.0)
        The clip radius, as :class:`~fl_lbbsp.core.centered_clip.CenteredClip`.
    iterations : int (default: 3)
        Clipping passes, as :class:`~fl_lbbsp.core.centered_clip.CenteredClip`.
    decay : float (default: 0.5)
        Weight of a silo's past agreement in its score, in [0, 1): its score is the mean
        of its cosines over about ``(1 + decay) / (1 - decay)`` rounds (3 by default).
    patience : int (default: 2)
        Rounds a silo is seen in before it can be dropped (one round is no history);
        >= 1.
    bound_claims : bool (default: False)
        As :class:`~fl_lbbsp.core.centered_clip.CenteredClip`.

    Examples
    --------
    >>> clip = TrustedClip(patience=1)
    >>> for _ in range(2):
    ...     clip.begin([np.zeros(2)])
    ...     for k, value in enumerate((1.0, 1.1, 0.9, 1.2)):
    ...         clip.add([np.array([value, 0.1 * k])], weight=1, silo=f"h{k}")
    ...     clip.add([np.array([-1.0, 0.0])], weight=1, silo="flip")
    ...     _ = clip.result()
    >>> clip.distrusted
    ['flip']
    """

    def __init__(
        self,
        *,
        factor: float = 1.0,
        iterations: int = 3,
        decay: float = 0.5,
        patience: int = 2,
        bound_claims: bool = False,
    ) -> None:
        super().__init__(factor=factor, iterations=iterations, bound_claims=bound_claims)
        if not math.isfinite(decay) or not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience!r}")
        self.decay = float(decay)
        self.patience = int(patience)
        self.history: dict[str, Agreement] = {}
        """Silo id -> its agreement so far."""
        self.distrusted: list[str] = []
        """The silos left out of the last :meth:`result` (sorted)."""
        self.agreement: dict[str, float] = {}
        """Silo id -> the cosine of its update to the others' centre in the last
        :meth:`result`."""

    def begin(self, reference: Sequence[npt.ArrayLike]) -> None:
        """As :meth:`CenteredClip.begin`; forgets the last round's verdicts, never the
        history."""
        super().begin(reference)
        self.distrusted = []
        self.agreement = {}

    def _trusted(self, scores: Mapping[str, Agreement]) -> npt.NDArray[np.bool_]:
        """Which of this round's updates may be aggregated by ``scores``: all but those
        whose silo has a long enough history and a score that is negative and an outlier
        of the judged scores (below their median by more than :data:`HAMPEL_K` scaled
        MADs) while the median score of the round's silos is positive, at most the
        ``(n - 1) // 2`` lowest."""
        n = len(self._silos)
        mask = np.ones(n, dtype=bool)
        known = [scores[s].score for s in self._silos if s is not None and s in scores]
        if not known or float(np.median(known)) <= 0.0:
            return mask  # no consensus: opposing it is no evidence
        judged = [
            (scores[s].score, k)
            for k, s in enumerate(self._silos)
            if s is not None and s in scores and scores[s].rounds >= self.patience
        ]
        values = np.array([score for score, _ in judged] or [0.0])
        median = float(np.median(values))
        spread = MAD_SCALE * float(np.median(np.abs(values - median)))
        bound = min(0.0, median - HAMPEL_K * spread)
        doubted = [(score, k) for score, k in judged if score < bound]
        for _, k in sorted(doubted)[: (n - 1) // 2]:
            mask[k] = False
        return mask

    def _centre(self) -> npt.NDArray[np.float64]:
        deltas = np.stack(self._deltas)
        weights = np.asarray(self._weights)
        scales = np.asarray(self._scales)
        claimed = np.asarray(self._claimed, dtype=bool)
        mask = self._trusted(self.history)
        passes = clip_passes(
            deltas[mask],
            np.asarray(normalised_weights(weights[mask].tolist())),
            scales[mask],
            factor=self.factor,
            iterations=self.iterations,
            claimed=claimed[mask],
        )
        # the others' centre for every silo: without its own term if it was in the centre
        own = np.zeros_like(deltas)
        own[mask] = passes.terms
        share = np.zeros(len(deltas))
        share[mask] = np.asarray(normalised_weights(weights[mask].tolist()))
        history = dict(self.history)
        for k, silo in enumerate(self._silos):
            if silo is None:
                continue
            others = passes.centre - own[k]
            if share[k] < 1.0:
                others = passes.before + (others - passes.before) / (1.0 - share[k])
            cosine = _cosine(deltas[k], others)
            self.agreement[silo] = cosine
            past = history.get(silo)
            score = cosine if past is None else self.decay * past.score + (1 - self.decay) * cosine
            history[silo] = Agreement(
                score=min(1.0, max(-1.0, score)),
                rounds=1 if past is None else past.rounds + 1,
            )
        self.history = history
        final = self._trusted(history)
        if not np.array_equal(final, mask):  # the verdicts changed this round: redo
            passes = clip_passes(
                deltas[final],
                np.asarray(normalised_weights(weights[final].tolist())),
                scales[final],
                factor=self.factor,
                iterations=self.iterations,
                claimed=claimed[final],
            )
        self.clipped = passes.clipped
        self.distrusted = sorted(
            s for k, s in enumerate(self._silos) if not final[k] and s is not None
        )
        known = [history[s].score for s in self._silos if s is not None and s in history]
        median = float(np.median(known)) if known else 0.0
        for silo in self.distrusted:
            log.warning(
                "silo %s left out of the aggregate: its updates oppose the others' "
                "(decayed agreement %.2f over %d rounds, the round's median %.2f; an "
                "honest silo with unusual data can be left out for a few rounds, "
                "robust_aggregation='centered-clip' never leaves one out)",
                silo, history[silo].score, history[silo].rounds, median,
            )  # fmt: skip
        return passes.centre

    def state_dict(self) -> TrustState:
        """Every silo's history."""
        return TrustState(silos=dict(self.history))

    def load_state_dict(self, state: TrustState | Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (a mapping is validated as a :class:`TrustState`).

        Raises
        ------
        pydantic.ValidationError
            On a score outside [-1, 1], a round count below 1 or a bad silo id.
        """
        self.history = dict(TrustState.model_validate(state).silos)


def _cosine(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """``a . b / (|a| |b|)``, 0 when either is zero."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0 or not math.isfinite(na * nb):
        return 0.0
    return max(-1.0, min(1.0, float(a @ b) / (na * nb)))
