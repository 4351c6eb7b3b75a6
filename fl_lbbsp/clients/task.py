"""One task of a silo, as the warm worker and the silo task exchange it (no torch, no
sockets): the request a ClientApp hands over and the result it gets back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy.typing as npt

__all__ = ["NamedArrays", "Scalar", "TaskRequest", "TaskResult"]

Scalar = str | int | float | bool
"""A config value."""

NamedArrays = Sequence[tuple[str, npt.NDArray[Any]]]
"""Arrays in record order, each with its name (a state dict's keys and values)."""


@dataclass(frozen=True, kw_only=True)
class TaskRequest:
    """One message's work for the silo.

    Parameters
    ----------
    kind : {"train", "evaluate"}
        The message type.
    arrays : sequence of (str, ndarray)
        The global model, in record order.
    config : Mapping[str, Scalar]
        The message's ``config`` record (batch size, local steps, lr, round).
    run_config : Mapping[str, Scalar]
        The run's configuration (dataset, model, seed, ...).
    node_config : Mapping[str, Scalar]
        The SuperNode's configuration (partition, silo id, slowdown, compute lock, ...).
    process_started : float
        ``time.time()`` when the ClientApp process handling the message started (its
        start-up is reported as ``startup-time``).
    """

    kind: Literal["train", "evaluate"]
    arrays: NamedArrays
    config: Mapping[str, Scalar]
    run_config: Mapping[str, Scalar]
    node_config: Mapping[str, Scalar]
    process_started: float


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What the silo sends back: its metrics and, for a train task, its arrays."""

    metrics: Mapping[str, int | float]
    arrays: NamedArrays = field(default_factory=list)
