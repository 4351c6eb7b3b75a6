"""Server-side screening of plaintext updates and of dataset-size weights.

A registered silo is trusted to be who it is, not to send a sane update or an honest
dataset size. Two bounds, both relative to what the rest of the federation shows:

- **Update distance.** Each update's distance to the model it should have started from
  (the global model sent; for a gradient, its norm) is compared, in log scale, with the
  median of the round's distances and of the last rounds' accepted ones. An update more
  than ``max_update_ratio`` times that median (widened by ``spread_sigmas`` robust standard
  deviations of the log-distances, when the federation's updates are naturally that
  spread) is rejected. This is the median / MAD rule of robust statistics applied to
  update norms, as in norm-bounding defences against model replacement (Sun et al., "Can
  You Really Backdoor Federated Learning?", 2019): a bound no honest silo of a round is
  near, one that a single 1e30 update cannot move. The balancer itself makes honest
  updates longer: the minibatch noise of tau steps at batch size B adds
  ``eta^2 tau tr(Sigma) / B`` to an update's squared distance, so a silo sent B_i below the
  equal split's B_eq may move up to ``sqrt(B_eq / B_i)`` times as far as it would at B_eq.
  Each distance is therefore compared as ``d_i * sqrt(B_i / B_eq)`` (B_i the size the
  server sent, never one a silo claims; no change at or above B_eq): measured in the
  study's federation, a slow silo at B = 3 of B_eq = 32 sent honest updates 10-27 times the
  median and was rejected in 15 of 50 rounds, its dataset losing its say in the model.
- **Weight cap.** An undeclared dataset size weighs at most ``max_weight_ratio`` times the
  median of the federation's sizes, and never more than all the others together: a
  bound that fewer than half the silos, colluding, cannot move (:func:`cap_weights`
  states what share of the weight ``k`` liars can hold). Only the silo registry's
  declared sizes count whole.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = ["UpdateScreen", "cap_weights", "integer_weights", "update_distance"]

_MAD_TO_SD = 1.4826  # a normal distribution's standard deviation per median absolute deviation


def update_distance(update: Sequence[np.ndarray], start: Sequence[np.ndarray] | None) -> float:
    """The L2 distance from ``start`` to ``update`` over every array (``start`` ``None``:
    the norm of ``update``, e.g. a gradient); ``inf`` when it overflows or is not finite."""
    total = 0.0
    for k, values in enumerate(update):
        if start is None:
            delta = np.asarray(values, dtype=np.float64)
        else:  # one float64 temporary (start is float64 already when the caller keeps it so)
            delta = np.subtract(values, start[k], dtype=np.float64)
        flat = delta.ravel()
        total += float(np.vdot(flat, flat).real)
    return math.sqrt(total) if math.isfinite(total) else math.inf


@dataclass
class UpdateScreen:
    """Reject updates whose distance is far outside the round's others.

    Parameters
    ----------
    max_update_ratio : float (default: 10.0)
        Largest accepted distance as a multiple of the reference (the median of the round's
        and the recent rounds' accepted distances).
    spread_sigmas : float (default: 3.0)
        The bound widens to this many robust standard deviations of the log-distances
        above the reference, where that is wider.
    history : int (default: 3)
        Rounds of accepted distances kept as reference (a round of one or two silos cannot
        tell the outlier alone).
    """

    max_update_ratio: float = 10.0
    spread_sigmas: float = 3.0
    history: int = 3

    def __post_init__(self) -> None:
        self._accepted: deque[list[float]] = deque(maxlen=self.history)

    def screen(
        self,
        distances: Mapping[str, float],
        *,
        batch_sizes: Mapping[str, int] | None = None,
        equal_batch: float | None = None,
    ) -> dict[str, str]:
        """The silos whose update is rejected, with why; the others' distances are kept
        as the next rounds' reference.

        Parameters
        ----------
        distances : Mapping[str, float]
            Each accepted reply's update distance (:func:`update_distance`).
        batch_sizes : Mapping[str, int] | None (default: None)
            The batch size the server sent each silo; with ``equal_batch``, a silo sent
            ``B_i < equal_batch`` has its distance compared as ``d_i * sqrt(B_i /
            equal_batch)`` (see the module). ``None``: distances as they are.
        equal_batch : float | None (default: None)
            The equal split's batch size (X / n).
        """
        scales = _noise_scales(distances, batch_sizes, equal_batch)
        raw, distances = distances, {s: d * scales.get(s, 1.0) for s, d in distances.items()}
        finite = [d for d in distances.values() if math.isfinite(d) and d > 0]
        reference = [d for past in self._accepted for d in past] + finite
        rejected: dict[str, str] = {
            silo: "its update is not finite"
            for silo, d in distances.items()
            if not math.isfinite(d)
        }
        if len(reference) >= 2:
            logs = np.log(reference)
            center = float(np.median(logs))
            spread = _MAD_TO_SD * float(np.median(np.abs(logs - center)))
            limit = max(math.log(self.max_update_ratio), self.spread_sigmas * spread)
            for silo, d in distances.items():
                if math.isfinite(d) and d > 0 and math.log(d) - center > limit:
                    scale = scales.get(silo, 1.0)
                    ratio = raw[silo] / math.exp(center)
                    rejected[silo] = (
                        f"its update is {ratio:.3g}x the median distance to the global model "
                        f"({raw[silo]:.3g} vs {math.exp(center):.3g}; the bound is "
                        f"{math.exp(limit) / scale:.3g}x"
                        + ("" if scale == 1.0 else " at the batch size it was sent")
                        + ")"
                    )
        kept = [d for silo, d in distances.items() if silo not in rejected and d > 0]
        if kept:
            self._accepted.append(kept)
        return rejected

    def state_dict(self) -> list[list[float]]:
        """The reference distances kept (JSON)."""
        return [list(past) for past in self._accepted]

    def load_state_dict(self, state: Sequence[Sequence[float]]) -> None:
        """Restore :meth:`state_dict`; non-finite or non-positive entries are dropped."""
        self._accepted.clear()
        for past in state:
            kept = [float(d) for d in past if isinstance(d, int | float) and math.isfinite(d)]
            self._accepted.append([d for d in kept if d > 0])


def _noise_scales(
    distances: Mapping[str, float],
    batch_sizes: Mapping[str, int] | None,
    equal_batch: float | None,
) -> dict[str, float]:
    """``sqrt(B_i / equal_batch)`` for the silos sent less than the equal split (see the
    module); the others, and every silo without both, 1."""
    if batch_sizes is None or equal_batch is None or not equal_batch > 0:
        return {}
    return {
        silo: math.sqrt(batch_sizes[silo] / equal_batch)
        for silo in distances
        if 0 < batch_sizes.get(silo, 0) < equal_batch
    }


def cap_weights(
    claimed: Mapping[str, float],
    *,
    known: Mapping[str, float],
    declared: Mapping[str, float],
    max_weight_ratio: float | None,
) -> dict[str, tuple[float, str | None]]:
    """Each silo's aggregation weight, an undeclared size capped relative to the federation.

    The cap is ``floor(max_weight_ratio * M)``, with ``M`` the median of every known
    silo's size (the claiming silo's own included), and never more than all the other
    silos together. A median is a statistic that ``k < n / 2`` liars cannot move outside
    the honest sizes (Huber and Ronchetti, "Robust Statistics", 2009, Sec. 3.2: its
    breakdown point is 1/2): liars claiming huge sizes only push ``M`` up to the
    ``(floor(n / 2) + 1)``-th smallest honest size. Hence the bound (proved for
    ``k = 1, 2`` of 5 in ``tests/test_defenses.py``): with ``r = max_weight_ratio``,
    ``k < n / 2`` liars hold at most ``k r M / (k r M + H)`` of the weight (``H`` the
    honest silos' weight), which for honest silos of equal size is
    ``k r / (k r + n - k)``: with the default ``r = 2``, one liar of 5 holds at most
    1/3 (its fair share 1/5), two of 5 at most 4/7, two of 10 at most 1/3. The cap of the
    earlier versions (``r`` times the median of the *other* silos') let each liar count
    the other liars' claims in its median: 2 liars of 5 claiming 9.9e6 held 87%.

    The weights are whole numbers wherever the claims are (dataset sizes are), so that
    the weight that is logged is the weight that is applied, in plaintext (a float) and
    in CKKS mode (an integer multiplying a ciphertext, :func:`integer_weights`).

    Parameters
    ----------
    claimed : Mapping[str, float]
        The round's silos and their dataset sizes.
    known : Mapping[str, float]
        Every silo's pinned size so far (the round's included): the federation to compare
        with, even the silos not in this round.
    declared : Mapping[str, float]
        Sizes the silo registry declares: never capped (the way to count a large silo
        whole), but part of the median.
    max_weight_ratio : float | None
        ``r``: at most this many times the federation's median size; ``None``: no cap,
        every size counts whole (the operator trusts the silos' claims).

    Returns
    -------
    dict
        Silo -> (weight, why it was capped or ``None``).
    """
    if max_weight_ratio is None:
        return {silo: (size, None) for silo, size in claimed.items()}
    federation = {**known, **claimed}
    ordered = sorted(float(n) for n in federation.values())
    total = sum((Fraction(n) for n in ordered), Fraction(0))  # exact, for fsum(others)
    median = float(np.median(ordered)) if ordered else 0.0
    ratio_cap = float(max(1, math.floor(max_weight_ratio * median)))
    out: dict[str, tuple[float, str | None]] = {}
    for silo, size in claimed.items():
        if silo in declared or len(ordered) < 2:
            out[silo] = (size, None)
            continue
        cap = min(ratio_cap, float(total - Fraction(float(size))))
        if size > cap:
            out[silo] = (
                cap,
                f"num-examples {size:g} weighs as {cap:g}: an undeclared size counts at most "
                f"{max_weight_ratio:g}x the median of the federation's sizes ({median:g}) and "
                "no more than all the other silos together (declare it in the silo registry "
                "to count it whole, or trust every silo's size with max_weight_ratio=None)",
            )
        else:
            out[silo] = (size, None)
    return out


def integer_weights(
    claimed: Mapping[str, float],
    *,
    known: Mapping[str, float],
    declared: Mapping[str, float],
    max_weight_ratio: float | None,
) -> dict[str, int]:
    """:func:`cap_weights` as the integers a server multiplies ciphertexts by (CKKS mode:
    silos encrypt unweighted updates, the server scales each by its silo's weight and
    divides the decrypted sum by the weights' sum). Each weight is the capped weight
    rounded to the nearest integer, at least 1 (whole already for whole claims, so the
    same weight as in plaintext)."""
    capped = cap_weights(claimed, known=known, declared=declared, max_weight_ratio=max_weight_ratio)
    return {silo: max(1, round(weight)) for silo, (weight, _) in capped.items()}
