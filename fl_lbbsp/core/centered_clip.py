"""Weighted centred clipping: a model no minority of silos can steer (:class:`CenteredClip`,
Karimireddy, He and Jaggi, ICML 2021), the robust aggregation of the plaintext strategies.

It sits on the plain weighted mean (:mod:`fl_lbbsp.core.aggregation`): with no update
clipped its result is FedAvg's mean by dataset size. :class:`~fl_lbbsp.core.trusted_clip.
TrustedClip` adds a per-silo history to it (:func:`clip_passes` is the rule both share).

References
----------
.. [1] S. P. Karimireddy, L. He and M. Jaggi, "Learning from History for Byzantine Robust
   Optimization", ICML 2021 (centred clipping, Alg. 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .aggregation import Arrays, as_layer, check_weight, normalised_weights

__all__ = ["CenteredClip", "ClipPasses", "clip_passes"]


class CenteredClip:
    """Weighted centred clipping around a robust centre: a model no minority can steer.

    Each silo's update ``d_i = u_i - w`` (its model minus the global model ``w`` sent) is
    clipped around a centre ``c``, and the centre moved by the weighted mean of the
    clipped differences (Karimireddy, He and Jaggi, "Learning from History for Byzantine
    Robust Optimization", ICML 2021, Alg. 2 without momentum)::

        c <- c + sum_i w_i clip(d_i - c, r_i) / sum_i w_i,   clip(v, r) = v min(1, r / |v|)

    ``iterations`` times, the result ``w + c``. Two things LB-BSP needs that the paper's
    rule and Flower's FedMedian, FedTrimmedAvg, Krum and Bulyan do not know:

    - **Dataset-size weights are kept.** The weights ``w_i`` are the capped dataset sizes
      FedAvg's mean uses: with no update clipped the result *is* that mean, so an honest
      federation pays only for the updates clipped (Flower's FedMedian and Krum weigh
      every silo the same, or pick one silo's update, dropping FedAvg's ``n_i``).
    - **Slow silos' longer updates are allowed.** A silo sent a batch ``B_i`` below the
      equal split's ``B_eq`` moves up to ``sqrt(B_eq / B_i)`` times as far from minibatch
      noise alone (:mod:`fl_lbbsp.security.update_screen`); its radius is
      ``r_i = factor * s_i * rho`` with ``s_i = sqrt(B_eq / B_i)`` (``scale`` of
      :meth:`add`) and ``rho`` the median over the silos of ``|d_i - m| / s_i``.
    - **Optionally, a claimed weight buys a say in the mean, not pull**
      (``bound_claims``). A silo's term is ``w_i clip(d_i - c, r_i)``: a weight twice the
      median pulls the centre twice as far as a median silo can, in any direction. With
      ``bound_claims``, where the weight is the silo's own claim (``claimed`` of
      :meth:`add`: an undeclared dataset size, which nothing checks), its radius is
      scaled by ``min(1, w_med / w_i)``, ``w_med`` the median of the round's weights, so
      that its term is at most ``w_med r_i``: whatever it claims, a silo pulls the centre
      no further than a median silo. Its weight near the centre is kept; declared sizes
      and server-set weights (batch sizes) are not claims. The price: an honest silo
      with more data than the median, undeclared, loses the pull its data would have
      where they differ from the others' (off by default; ``docs/security.md``
      measures both sides).

    The first centre ``m`` is the coordinate-wise median of the updates (unweighted: a
    silo's claimed size cannot move it) and ``rho`` a median: neither can ``k < n / 2``
    silos carry outside the honest updates' range, so each hostile silo moves the model by
    at most its weight share times its radius per iteration, however far its update is
    (with ``bound_claims``, a silo whose weight is a claim by at most a median silo's).
    With one or two updates the centre is their weighted mean (nothing to compare).

    Parameters
    ----------
    factor : float (default: 1.0)
        The clipping radius in medians of the (noise-scaled) distances to the first
        centre; > 0.
    iterations : int (default: 3)
        Clipping passes (the paper uses 1 with momentum, more without); >= 1.
    bound_claims : bool (default: False)
        Bound the pull of a ``claimed`` weight above the round's median as the median
        weight's (see above); ``False``: ``claimed`` is ignored.

    Examples
    --------
    >>> clip = CenteredClip(factor=1.0, iterations=1)
    >>> clip.begin([np.zeros(1)])
    >>> for value in (1.0, 1.1, 0.9, -30.0):
    ...     clip.add([np.array([value])], weight=1)
    >>> bool(abs(clip.result()[0][0] - 0.95) < 0.1)
    True
    """

    def __init__(
        self, *, factor: float = 1.0, iterations: int = 3, bound_claims: bool = False
    ) -> None:
        if not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"factor must be finite and > 0, got {factor!r}")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations!r}")
        self.factor = float(factor)
        self.iterations = int(iterations)
        self.bound_claims = bool(bound_claims)
        self._start: list[npt.NDArray[np.float64]] | None = None
        self._shapes: list[tuple[int, ...]] = []
        self._dtypes: list[np.dtype[Any]] = []
        self._deltas: list[npt.NDArray[np.float64]] = []
        self._weights: list[float] = []
        self._scales: list[float] = []
        self._silos: list[str | None] = []
        self._claimed: list[bool] = []
        self.clipped = 0
        """Updates clipped in the last :meth:`result`'s final pass."""
        self.clipped_total = 0
        """Updates clipped in the final pass of every :meth:`result` so far."""

    def begin(self, reference: Sequence[npt.ArrayLike]) -> None:
        """Start a round from the global model ``reference`` (its values are read: every
        update is measured from it); forget the last round's updates."""
        arrays = [np.asarray(layer) for layer in reference]
        self._dtypes = [a.dtype for a in arrays]
        self._start = [a.astype(np.float64).ravel() for a in arrays]
        self._shapes = [a.shape for a in arrays]
        self._deltas, self._weights, self._scales, self._silos = [], [], [], []
        self._claimed = []
        self.clipped = 0

    def add(
        self,
        update: Sequence[npt.ArrayLike],
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Keep one silo's model with its weight and its noise scale.

        Parameters
        ----------
        update : sequence of array_like
            The silo's layers, in the reference's order and shapes.
        weight : float
            Its aggregation weight (capped dataset size), finite and positive.
        scale : float (default: 1.0)
            ``sqrt(B_eq / B_i)`` for a silo sent less than the equal split, else 1: how
            much longer minibatch noise alone makes its update; finite and >= 1.
        silo : str | None (default: None)
            The silo's stable id: ignored here, the history of
            :class:`~fl_lbbsp.core.trusted_clip.TrustedClip` is kept by it.
        claimed : bool (default: False)
            Whether ``weight`` is the silo's own unchecked claim (an undeclared dataset
            size): with ``bound_claims``, above the round's median weight its radius
            shrinks by as much (see the class).

        Raises
        ------
        ValueError
            On a bad weight or scale, or other layers or shapes than the reference.
        RuntimeError
            Before :meth:`begin`.
        """
        if self._start is None:
            raise RuntimeError("CenteredClip.add before begin()")
        value = check_weight(weight)
        if not math.isfinite(scale) or scale < 1:
            raise ValueError(f"scale must be finite and >= 1, got {scale!r}")
        if len(update) != len(self._start):
            raise ValueError(f"update has {len(update)} layers, expected {len(self._start)}")
        parts = []
        for k, (layer, shape) in enumerate(zip(update, self._shapes, strict=True)):
            array = np.asarray(layer)
            if array.shape != shape:
                raise ValueError(f"layer {k} has shape {array.shape}, the reference has {shape}")
            if array.dtype.kind not in "biuf":
                raise ValueError(f"layer {k} has dtype {array.dtype}, expected a real number")
            parts.append(np.subtract(array.ravel(), self._start[k], dtype=np.float64))
        self._deltas.append(np.concatenate(parts) if parts else np.zeros(0))
        self._weights.append(value)
        self._scales.append(float(scale))
        self._silos.append(silo)
        self._claimed.append(bool(claimed) and self.bound_claims)

    @property
    def count(self) -> int:
        """Updates added since :meth:`begin`."""
        return len(self._deltas)

    def result(self) -> Arrays:
        """The global model moved by the clipped centre, each layer in its dtype.

        Raises
        ------
        ValueError
            If nothing was added, or the result holds NaN or inf.
        """
        if self._start is None or not self._deltas:
            raise ValueError("cannot aggregate zero updates")
        with np.errstate(over="ignore", invalid="ignore"):
            centre = self._centre()
        self.clipped_total += self.clipped
        if not np.isfinite(centre).all():
            raise ValueError("the robust aggregate holds NaN or inf")
        out: Arrays = []
        offset = 0
        for k, (start, shape, dtype) in enumerate(
            zip(self._start, self._shapes, self._dtypes, strict=True)
        ):
            size = start.size
            out.append(as_layer((start + centre[offset : offset + size]).reshape(shape), dtype, k))
            offset += size
        return out

    def _centre(self) -> npt.NDArray[np.float64]:
        passes = clip_passes(
            np.stack(self._deltas),
            np.asarray(normalised_weights(self._weights)),
            np.asarray(self._scales),
            factor=self.factor,
            iterations=self.iterations,
            claimed=np.asarray(self._claimed, dtype=bool),
        )
        self.clipped = passes.clipped
        return passes.centre


class ClipPasses(NamedTuple):
    """What :func:`clip_passes` found: the centre, and the last pass's terms."""

    centre: npt.NDArray[np.float64]
    """The robust centre of the updates (a difference from the global model)."""
    before: npt.NDArray[np.float64]
    """The centre the last pass started from."""
    terms: npt.NDArray[np.float64]
    """Row ``i``: silo ``i``'s weighted, clipped term of the last pass
    (``centre = before + terms.sum(axis=0)``)."""
    clipped: int
    """Updates clipped in the last pass."""


def clip_passes(
    deltas: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    scales: npt.NDArray[np.float64],
    *,
    factor: float,
    iterations: int,
    claimed: npt.NDArray[np.bool_] | None = None,
) -> ClipPasses:
    """Weighted centred clipping of the rows of ``deltas`` (:class:`CenteredClip`'s rule).

    Parameters
    ----------
    deltas : numpy.ndarray
        One update (a difference from the global model) per row.
    weights : numpy.ndarray
        Their normalised weights (summing to 1).
    scales : numpy.ndarray
        Their noise scales ``sqrt(B_eq / B_i)`` (>= 1).
    factor, iterations
        As :class:`CenteredClip`.
    claimed : numpy.ndarray | None (default: None)
        Rows whose weight is a claim: a radius shrunk by ``min(1, w_med / w_i)``
        (``None``: none).

    Returns
    -------
    ClipPasses
        With fewer than 3 rows, the weighted mean (nothing is clipped).
    """
    if len(deltas) < 3:
        terms = weights[:, None] * deltas
        zero = np.zeros(deltas.shape[1], dtype=np.float64)
        return ClipPasses(np.asarray(terms.sum(axis=0), dtype=np.float64), zero, terms, 0)
    centre = np.median(deltas, axis=0)
    rho = float(np.median(np.linalg.norm(deltas - centre, axis=1) / scales))
    radii = factor * scales * rho
    if claimed is not None and claimed.any():  # a claim buys no more pull than the median's
        median = float(np.median(weights))
        radii = np.where(claimed & (weights > median), radii * median / weights, radii)
    before, terms, clipped = centre, np.zeros_like(deltas), 0
    for _ in range(iterations):
        gaps = deltas - centre
        norms = np.linalg.norm(gaps, axis=1)
        factors = np.where(norms > radii, radii / np.where(norms > 0, norms, 1.0), 1.0)
        clipped = int((norms > radii).sum())
        before, terms = centre, (weights * factors)[:, None] * gaps
        centre = centre + (weights * factors) @ gaps
    return ClipPasses(np.asarray(centre, dtype=np.float64), before, terms, clipped)
