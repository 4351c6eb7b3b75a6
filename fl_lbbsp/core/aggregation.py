"""Weighted sums of model updates: one path for every mode.

FL mode weighs each silo by its local dataset size ``n_i`` (never by the samples it
processed, so a faster silo gains no say; Chen et al., IEEE TCC 2021, Sec. 3.5; FedAvg,
McMahan et al., AISTATS 2017). Cluster mode weighs each worker's gradient by its batch
size ``x_i`` (weighted gradient aggregation, Sec. 3.4). Both are
``sum_i w_i * u_i / sum_i w_i``; the sum only needs ``*`` by a float and ``+``, so the
same code adds numpy arrays and CKKS ciphertexts.

The server aggregates through an :class:`Aggregator`: ``begin`` with the round's global
model, ``add`` each accepted reply as soon as it has been screened (accumulated in place,
so the server never holds more than one decoded reply and one running sum), ``result``
once the round is over. :class:`WeightedMean` is FedAvg's mean by dataset size,
:class:`GradientStep` the parameter server's SGD step on the batch-size-weighted gradient.

References
----------
.. [1] C. Chen, Q. Weng, W. Wang, B. Li and B. Li, "Accelerating Distributed Learning in
   Non-Dedicated Environments", IEEE Transactions on Cloud Computing, 2021, Sec. 3.4-3.5
   and Alg. 3.
.. [2] B. McMahan, E. Moore, D. Ramage, S. Hampson and B. Agüera y Arcas,
   "Communication-Efficient Learning of Deep Networks from Decentralized Data",
   AISTATS 2017 (FedAvg: the mean of the silos' models weighted by ``n_i``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from .optim import SGD

__all__ = [
    "Aggregator",
    "CenteredClip",
    "ClipPasses",
    "GradientStep",
    "WeightedMean",
    "clip_passes",
    "normalised_weights",
    "weighted_average",
    "weighted_sum",
]

Arrays = list[npt.NDArray[Any]]
"""A model, an update or a gradient: one numpy array per layer."""

# What an aggregator adds (contravariant: it only goes in) and what it returns.
U = TypeVar("U", contravariant=True)
R = TypeVar("R")


# Anything that can be scaled by a float and added: numpy arrays, CKKS vectors.
V = TypeVar("V")


def normalised_weights(weights: Sequence[float]) -> list[float]:
    """Return ``w_i / sum_j w_j``; every weight must be finite and positive.

    Raises
    ------
    ValueError
        On an empty list, a weight that is not finite and positive, or weights whose sum
        is not finite and positive (so aggregation never divides by zero or by infinity).
    """
    values = [float(w) for w in weights]
    if not values:
        raise ValueError("cannot aggregate zero updates")
    for w in values:
        if not math.isfinite(w) or w <= 0:
            raise ValueError(f"aggregation weights must be finite and positive, got {w!r}")
    try:
        total = math.fsum(values)
    except OverflowError:
        total = math.inf
    if not math.isfinite(total) or total <= 0:
        raise ValueError(
            f"the sum of the aggregation weights must be finite and positive, got {total!r}"
        )
    return [w / total for w in values]


def weighted_sum(values: Sequence[V], weights: Sequence[float]) -> V:
    """Return ``sum_i weights[i] * values[i]`` (weights used as given).

    A weight of exactly 1 adds the value as it is, without multiplying: CKKS ciphertexts
    summed on the server (each already weighted by its silo) are only ever added, which
    keeps their scale and needs no spare level in the modulus chain. A single value with
    weight 1 is returned itself, not a copy.

    Parameters
    ----------
    values : sequence
        Updates supporting ``value * float`` and ``value + value`` (numpy arrays, CKKS
        vectors).
    weights : sequence of float
        One weight per value.
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    if not values:
        raise ValueError("cannot sum zero values")
    acc: Any = _scaled(values[0], float(weights[0]))
    for value, weight in zip(values[1:], weights[1:], strict=True):
        acc = acc + _scaled(value, float(weight))
    result: V = acc
    return result


def _scaled(value: Any, weight: float) -> Any:
    return value if weight == 1.0 else value * weight


def _check_weight(weight: float) -> float:
    value = float(weight)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"aggregation weights must be finite and positive, got {weight!r}")
    return value


@runtime_checkable
class Aggregator(Protocol[U, R]):
    """How the server turns a round's accepted replies into the next global model.

    One round: :meth:`begin` with the round's global model (or its layout), :meth:`add`
    each accepted reply as soon as it has been screened, :meth:`result` once the round is
    over. Replies are accumulated in place: the aggregator holds a running sum, never the
    replies, so the server's memory does not grow with the number of silos and the work is
    spread over the round as the replies arrive instead of all done after the last one.

    Implementations: :class:`WeightedMean` (FL: FedAvg's mean by dataset size) and
    :class:`GradientStep` (cluster: one SGD step on the batch-size-weighted gradient).
    """

    def begin(self, reference: R) -> None:
        """Start a round on ``reference`` (the global model or layout); forget the last."""
        ...

    def add(self, update: U, *, weight: float) -> None:
        """Accumulate one accepted reply with aggregation weight ``weight`` (> 0)."""
        ...

    @property
    def count(self) -> int:
        """Replies added since :meth:`begin`."""
        ...

    def result(self) -> R:
        """The round's aggregate; ``ValueError`` if nothing was added or it is not finite."""
        ...


class WeightedMean:
    """Mean of per-layer updates weighted by dataset size, accumulated in place.

    ``sum_i n_i * u_i / sum_i n_i`` for every layer: FedAvg's aggregation (McMahan et al.,
    2017), which LB-BSP keeps in FL mode, weighting each silo by its local dataset size
    ``n_i`` and not by the samples it processed with its tuned batch size (Chen et al.,
    IEEE TCC 2021, Sec. 3.5). Each :meth:`add` multiplies the update by its weight into a
    float64 scratch buffer and adds that to a float64 running sum, layer by layer, with no
    allocation; :meth:`result` divides by the sum of the weights and casts each layer back
    to the reference's dtype.

    Why float64: replies are added in the order they arrive, which changes from run to
    run. A float32 running sum (Flower's ``aggregate_arrayrecords``) rounds at every add,
    so the global model depends on that order and drifts from the exact mean (up to
    about 1,400 float32 ulps, 2e-6 relative, for 1,000 LeNet-5 updates); a float64 sum
    rounded once at the end is within half an ulp of the exact mean, whatever the order.
    It costs about 2.3 times a float32 add of the same loop: 0.2 s against 0.1 s for
    1,000 LeNet-5-sized updates (61,706 float32) on a loaded 2-core machine, a quarter of
    what decoding those replies with Flower's ``Array.numpy()`` takes (0.76 s). Weights
    are taken relative to the first one added, so neither huge nor subnormal dataset
    sizes overflow or lose the update.

    The constructor takes no arguments; call :meth:`begin` before the first :meth:`add`.

    Examples
    --------
    >>> mean = WeightedMean()
    >>> mean.begin([np.zeros(2, dtype=np.float32)])
    >>> mean.add([np.array([1.0, 0.0], dtype=np.float32)], weight=100)
    >>> mean.add([np.array([3.0, 4.0], dtype=np.float32)], weight=300)
    >>> mean.result()
    [array([2.5, 3. ], dtype=float32)]
    """

    def __init__(self) -> None:
        self._layout: list[tuple[tuple[int, ...], np.dtype[Any]]] | None = None
        self._sums: list[npt.NDArray[np.float64]] = []
        self._scratch: list[npt.NDArray[np.float64]] = []
        self._scale = 0.0
        self._total = 0.0
        self._count = 0

    def begin(self, reference: Sequence[npt.ArrayLike]) -> None:
        """Start a round: zero sums of ``reference``'s layer shapes, nothing added.

        Parameters
        ----------
        reference : sequence of array_like
            The round's global model, one array per layer; only its shapes and dtypes
            are read (the result has them), never its values.
        """
        layout = []
        for layer in reference:
            array = np.asarray(layer)
            layout.append((array.shape, array.dtype))
        if layout != self._layout:
            self._sums = [np.zeros(shape, dtype=np.float64) for shape, _ in layout]
            self._scratch = [np.empty(shape, dtype=np.float64) for shape, _ in layout]
            self._layout = layout
        else:
            for total in self._sums:
                total.fill(0.0)
        self._scale = 0.0
        self._total = 0.0
        self._count = 0

    def add(self, update: Sequence[npt.ArrayLike], *, weight: float) -> None:
        """Add ``weight * update`` to the running sum, in place.

        Parameters
        ----------
        update : sequence of array_like
            One silo's layers, in the reference's order and shapes (any real dtype).
        weight : float
            The silo's aggregation weight (its local dataset size), finite and positive.

        Raises
        ------
        ValueError
            On a weight that is not finite and positive, weights whose sum leaves the
            float range, or an update with other layers or shapes than the reference; the
            sum is left as it was.
        RuntimeError
            Before :meth:`begin`.
        """
        if self._layout is None:
            raise RuntimeError("WeightedMean.add before begin()")
        value = _check_weight(weight)
        if len(update) != len(self._layout):
            raise ValueError(f"update has {len(update)} layers, expected {len(self._layout)}")
        arrays = [np.asarray(layer) for layer in update]
        for k, (array, (shape, _)) in enumerate(zip(arrays, self._layout, strict=True)):
            if array.shape != shape:
                raise ValueError(f"layer {k} has shape {array.shape}, the reference has {shape}")
            if array.dtype.kind not in "biuf":
                raise ValueError(f"layer {k} has dtype {array.dtype}, expected a real number")
        scale = self._scale if self._count else value
        factor = value / scale
        total = self._total + factor
        if not (math.isfinite(total) and factor > 0):
            raise ValueError(
                "the sum of the aggregation weights must be finite and positive: weight "
                f"{value!r} against the first one's {scale!r}"
            )
        with np.errstate(over="ignore", invalid="ignore"):  # result() checks the sums
            for array, total_k, scratch in zip(arrays, self._sums, self._scratch, strict=True):
                if factor == 1.0:
                    np.add(total_k, array, out=total_k)
                else:
                    np.multiply(array, factor, out=scratch, dtype=np.float64)
                    np.add(total_k, scratch, out=total_k)
        self._scale = scale
        self._total = total
        self._count += 1

    @property
    def count(self) -> int:
        """Updates added since :meth:`begin`."""
        return self._count

    def result(self) -> Arrays:
        """The weighted mean, each layer in the reference's dtype (new arrays).

        Raises
        ------
        ValueError
            If nothing was added since :meth:`begin`, or a layer of the mean holds NaN or
            inf (in float64, or once cast back to the reference's dtype).
        """
        if self._layout is None or self._count == 0:
            raise ValueError("cannot aggregate zero updates")
        averaged: Arrays = []
        for k, (total, (_, dtype)) in enumerate(zip(self._sums, self._layout, strict=True)):
            mean = total / self._total
            if not np.isfinite(mean).all():
                raise ValueError(f"the aggregate of layer {k} holds NaN or inf")
            with np.errstate(over="ignore", invalid="ignore"):
                cast = mean.astype(dtype, copy=False)
            if cast.dtype.kind == "f" and not np.isfinite(cast).all():
                raise ValueError(f"the aggregate of layer {k} holds NaN or inf as {dtype}")
            averaged.append(cast)
        return averaged


class GradientStep:
    """One SGD step of the parameter server on the batch-size-weighted mean gradient.

    ``w <- w - eta * g`` with ``g = sum_i x_i * g_i / sum_i x_i``: every sample counts the
    same whatever batch it was in, so an iteration of LB-BSP equals one of BSP with the
    global batch ``X`` (weighted gradient aggregation, Chen et al., IEEE TCC 2021,
    Sec. 3.4 and Alg. 3). The gradient is a :class:`WeightedMean` (float64 running sum,
    cast to the model's dtype), then ``optimizer.step`` (momentum if the optimizer has
    it): exactly what :class:`~fl_lbbsp.strategies.LBBSPCluster` computes. Adding every
    gradient with weight 1 gives the biased naive mean (Eq. 6) for comparison.

    Parameters
    ----------
    lr : float | None (default: None)
        Learning rate eta of a plain SGD step (no momentum).
    optimizer : SGD | None (default: None)
        The server's optimizer, whose momentum buffers carry over between rounds (and
        are checkpointed by its owner). Give ``lr`` or ``optimizer``, not both.
    robust : CenteredClip | None (default: None)
        Combine the gradients by :class:`CenteredClip` (around a robust centre, from
        zero) instead of their weighted mean.

    Raises
    ------
    ValueError
        With both or neither of ``lr`` and ``optimizer``, or a bad ``lr``.
    """

    def __init__(
        self,
        *,
        lr: float | None = None,
        optimizer: SGD | None = None,
        robust: CenteredClip | None = None,
    ) -> None:
        if (lr is None) == (optimizer is None):
            raise ValueError("give GradientStep either lr or optimizer, not both or neither")
        if optimizer is None:
            assert lr is not None
            optimizer = SGD(lr=lr)
        self.optimizer = optimizer
        self._gradient: WeightedMean | CenteredClip = WeightedMean() if robust is None else robust
        self._params: Arrays | None = None
        self._stepped: Arrays | None = None

    def begin(self, reference: Sequence[npt.ArrayLike]) -> None:
        """Start an iteration at the model ``reference``.

        Parameters
        ----------
        reference : sequence of array_like
            The current global weights, one array per layer; held (not copied) until
            :meth:`result` and never modified.
        """
        self._params = [np.asarray(p) for p in reference]
        if isinstance(self._gradient, CenteredClip):  # gradients are measured from zero
            self._gradient.begin([np.zeros_like(p) for p in self._params])
        else:
            self._gradient.begin(self._params)
        self._stepped = None

    def add(
        self,
        update: Sequence[npt.ArrayLike],
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
    ) -> None:
        """Add one worker's gradient weighted by its batch size ``x_i``.

        Parameters
        ----------
        update : sequence of array_like
            The worker's gradient, one array per layer of the model.
        weight : float
            Its batch size (1 for every worker: the naive mean), finite and positive.
        scale : float (default: 1.0)
            The robust clip's radius widening (:meth:`CenteredClip.add`); ignored by the
            weighted mean.
        silo : str | None (default: None)
            The worker's stable id (the robust clip's history); ignored by the mean.

        Raises
        ------
        ValueError
            As :meth:`WeightedMean.add`.
        RuntimeError
            Before :meth:`begin`, or after :meth:`result` in the same iteration (the step
            has been taken).
        """
        if self._stepped is not None:
            raise RuntimeError("GradientStep.add after result(): begin() the next iteration")
        if isinstance(self._gradient, CenteredClip):
            self._gradient.add(update, weight=weight, scale=scale, silo=silo)
        else:
            self._gradient.add(update, weight=weight)

    @property
    def count(self) -> int:
        """Gradients added since :meth:`begin`."""
        return self._gradient.count

    def result(self) -> Arrays:
        """The weights after the step, each in its reference dtype.

        The step is taken once per iteration: a second call returns the same weights and
        leaves the momentum alone.

        Raises
        ------
        ValueError
            If no gradient was added, the mean gradient holds NaN or inf, or the step
            would put NaN or inf into the weights; the optimizer's momentum is then left
            as it was before the call.
        """
        if self._stepped is not None:
            return list(self._stepped)
        if self._params is None:
            raise ValueError("cannot aggregate zero updates")
        gradient = self._gradient.result()
        buffers = self.optimizer.buffers
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                stepped = self.optimizer.step(self._params, gradient)
            for k, layer in enumerate(stepped):
                if not np.isfinite(layer).all():
                    raise ValueError(f"the step puts NaN or inf into layer {k}")
        except ValueError:
            self.optimizer.buffers = buffers  # a skipped step leaves the momentum as it was
            raise
        self._stepped = stepped
        return list(stepped)


def weighted_average(
    updates: Sequence[Sequence[npt.NDArray[np.floating]]],
    weights: Sequence[float],
) -> list[npt.NDArray[np.floating]]:
    """Layer-wise weighted average of per-silo lists of arrays (a :class:`WeightedMean`).

    Parameters
    ----------
    updates : sequence of sequence of numpy.ndarray
        ``updates[i][k]`` is layer ``k`` of silo ``i``; all silos have the same layers.
    weights : sequence of float
        The weight of each silo: local dataset size (FL) or batch size (cluster).

    Returns
    -------
    list of numpy.ndarray
        ``sum_i w_i * updates[i][k] / sum_i w_i`` for every layer ``k``, in the dtype of
        the first silo's layer.

    Raises
    ------
    ValueError
        On no updates, as many weights as updates, a weight that is not finite and
        positive, silos with other layers or shapes than the first, or a mean holding NaN
        or inf.
    """
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    if not updates:
        raise ValueError("cannot aggregate zero updates")
    mean = WeightedMean()
    mean.begin(updates[0])
    for update, weight in zip(updates, weights, strict=True):
        mean.add(update, weight=weight)
    return mean.result()


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
        value = _check_weight(weight)
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
        for start, shape, dtype in zip(self._start, self._shapes, self._dtypes, strict=True):
            size = start.size
            layer = (start + centre[offset : offset + size]).reshape(shape)
            offset += size
            with np.errstate(over="ignore", invalid="ignore"):
                cast = layer.astype(dtype, copy=False)
            if cast.dtype.kind == "f" and not np.isfinite(cast).all():
                raise ValueError(f"the robust aggregate holds NaN or inf as {dtype}")
            out.append(cast)
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
