"""The parameter server's step: SGD with optional momentum on numpy arrays, and
:class:`GradientStep`, one such step on the batch-size-weighted mean gradient (or on a
robust :class:`Clipping` of the gradients).

Same update as ``torch.optim.SGD`` (dampening 0, no Nesterov): ``buf <- mu * buf + g``,
``w <- w - eta * buf``; with ``mu = 0`` it is plain ``w <- w - eta * g``.

Reference: Chen et al., IEEE TCC 2021, Alg. 3 (PS: ``w^{k+1} <- w^k - eta * g^k``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .aggregation import Arrays, WeightedMean

__all__ = ["SGD", "Clipping", "GradientStep"]  # noqa: RUF022 - the optimizer first

Array = npt.NDArray[Any]


class SGD:
    """Stateful SGD step over a list of parameter arrays.

    Parameters
    ----------
    lr : float
        Learning rate eta, finite and positive.
    momentum : float (default: 0.0)
        Momentum mu in [0, 1).
    """

    def __init__(self, *, lr: float, momentum: float = 0.0) -> None:
        if not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"lr must be a finite positive number, got {lr!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.buffers: list[Array] | None = None

    def step(self, params: Sequence[Array], grads: Sequence[Array]) -> list[Array]:
        """Return the updated parameters (the inputs are not modified)."""
        if len(params) != len(grads):
            raise ValueError(f"{len(params)} parameter arrays but {len(grads)} gradients")
        for p, g in zip(params, grads, strict=True):
            if np.shape(p) != np.shape(g):
                raise ValueError(f"gradient shape {np.shape(g)} != parameter {np.shape(p)}")
        if self.momentum == 0.0:
            updates = [np.asarray(g) for g in grads]
        else:
            if self.buffers is None:
                self.buffers = [np.array(g, dtype=np.result_type(g), copy=True) for g in grads]
            else:
                self.buffers = [
                    self.momentum * b + g for b, g in zip(self.buffers, grads, strict=True)
                ]
            updates = self.buffers
        return [
            (np.asarray(p) - self.lr * u).astype(np.asarray(p).dtype, copy=False)
            for p, u in zip(params, updates, strict=True)
        ]


class Clipping(Protocol):
    """A robust aggregation :class:`GradientStep` can use instead of the weighted mean
    (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`): an :class:`Aggregator` whose
    ``add`` also takes the silo's noise scale and id."""

    def begin(self, reference: Sequence[npt.ArrayLike]) -> None: ...
    def add(
        self,
        update: Sequence[npt.ArrayLike],
        *,
        weight: float,
        scale: float = 1.0,
        silo: str | None = None,
    ) -> None: ...
    @property
    def count(self) -> int: ...
    def result(self) -> Arrays: ...


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
    robust : Clipping | None (default: None)
        Combine the gradients by a robust aggregation
        (:class:`~fl_lbbsp.core.centered_clip.CenteredClip`: around a robust centre, from
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
        robust: Clipping | None = None,
    ) -> None:
        if (lr is None) == (optimizer is None):
            raise ValueError("give GradientStep either lr or optimizer, not both or neither")
        if optimizer is None:
            assert lr is not None
            optimizer = SGD(lr=lr)
        self.optimizer = optimizer
        self._robust = robust
        self._mean = WeightedMean()
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
        if self._robust is not None:  # gradients are measured from zero
            self._robust.begin([np.zeros_like(p) for p in self._params])
        else:
            self._mean.begin(self._params)
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
            The robust clip's radius widening
            (:meth:`~fl_lbbsp.core.centered_clip.CenteredClip.add`); ignored by the
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
        if self._robust is not None:
            self._robust.add(update, weight=weight, scale=scale, silo=silo)
        else:
            self._mean.add(update, weight=weight)

    @property
    def count(self) -> int:
        """Gradients added since :meth:`begin`."""
        return (self._mean if self._robust is None else self._robust).count

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
        gradient = (self._mean if self._robust is None else self._robust).result()
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
