"""The parameter server's optimizer: SGD with optional momentum on numpy arrays.

Same update as ``torch.optim.SGD`` (dampening 0, no Nesterov): ``buf <- mu * buf + g``,
``w <- w - eta * buf``; with ``mu = 0`` it is plain ``w <- w - eta * g``.

Reference: Chen et al., IEEE TCC 2021, Alg. 3 (PS: ``w^{k+1} <- w^k - eta * g^k``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SGD"]

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
