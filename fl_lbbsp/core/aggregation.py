"""Weighted sums of model updates: one path for every mode.

FL mode weighs each silo by its local dataset size ``n_i`` (never by the samples it
processed, so a faster silo gains no say; Chen et al., IEEE TCC 2021, Sec. 3.5). Cluster
mode weighs each worker's gradient by its batch size ``x_i`` (weighted gradient
aggregation, Sec. 3.4). Both are ``sum_i w_i * u_i / sum_i w_i``; the sum only needs
``*`` by a float and ``+``, so the same code adds numpy arrays and CKKS ciphertexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["normalised_weights", "weighted_average", "weighted_sum"]


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


def weighted_average(
    updates: Sequence[Sequence[npt.NDArray[np.floating]]],
    weights: Sequence[float],
) -> list[npt.NDArray[np.floating]]:
    """Layer-wise weighted average of per-silo lists of arrays.

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
    """
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    factors = normalised_weights(weights)
    num_layers = len(updates[0])
    for i, layers in enumerate(updates):
        if len(layers) != num_layers:
            raise ValueError(f"update {i} has {len(layers)} layers, expected {num_layers}")
    averaged: list[npt.NDArray[np.floating]] = []
    for k in range(num_layers):
        layer = [np.asarray(u[k], dtype=np.float64) for u in updates]
        shapes = {arr.shape for arr in layer}
        if len(shapes) != 1:
            raise ValueError(f"layer {k} has different shapes across updates: {sorted(shapes)}")
        total = weighted_sum(layer, factors)
        averaged.append(np.asarray(total).astype(np.asarray(updates[0][k]).dtype))
    return averaged
