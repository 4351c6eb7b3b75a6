"""Rewriters of a balanced round: the baselines LB-BSP is compared against.

They are not subclasses of the engine: :class:`TauRewriter` and :class:`EtaRewriter`
rewrite each balanced instruction (local steps tau_i or learning rate eta_i from the
silo's share, batch size B_init), and :class:`FastestReplies` picks the replies a
backup-worker round keeps (PSP-SGD's partial aggregation).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.5 and Fig. 13 (the tau and eta variants).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ...contract import STEP_BATCH_SIZE, RecordKeys
from ..settings import BalancingConfig
from .state import Instruction, natural_key

__all__ = ["EtaRewriter", "FastestReplies", "InstructionRewriter", "TauRewriter"]


class InstructionRewriter(Protocol):
    """Changes what a silo is told after balancing (the tau and eta baselines)."""

    @property
    def name(self) -> str:
        """Suffix of the scheme's name (``"tau"``, ``"eta"``)."""

    def rewrite(self, instruction: Instruction, config: BalancingConfig) -> Instruction:
        """The instruction actually sent, given the balanced one."""

    def to_balancer_units(
        self, metrics: Mapping[str, Any], keys: RecordKeys, config: BalancingConfig
    ) -> dict[str, Any]:
        """A reply's metrics in the balancer's units (a batch-size share of X)."""


@dataclass(frozen=True)
class TauRewriter:
    """LB-BSP that tunes the local steps instead of the batch size (rejected in Sec. 3.5).

    Silo i is sent ``tau_i = max(1, round(tau * x_i / B_init))`` steps at ``B_init``, so it
    processes about ``x_i * tau`` samples, as under LB-BSP; eta stays the same for all.
    Its reply's ``batch-size`` becomes the equivalent share ``round(samples / tau)``; the
    batch size it really used goes to ``step-batch-size``, its steps to ``local-steps``.
    """

    name: str = "tau"

    def rewrite(self, instruction: Instruction, config: BalancingConfig) -> Instruction:
        """``B_init`` with the steps that process the balanced share."""
        steps = max(1, round(config.local_steps * instruction.share / config.initial_batch_size))
        return replace(instruction, batch_size=config.initial_batch_size, local_steps=steps)

    def to_balancer_units(
        self, metrics: Mapping[str, Any], keys: RecordKeys, config: BalancingConfig
    ) -> dict[str, Any]:
        """The equivalent share; metrics without a usable count are left as reported."""
        converted = dict(metrics)
        used, samples = (
            _positive(metrics.get(keys.batch_size)),
            _positive(metrics.get(keys.samples_processed)),
        )
        if used is not None and samples is not None:
            converted[STEP_BATCH_SIZE] = metrics[keys.batch_size]
            converted[keys.local_steps] = round(samples / used)
            converted[keys.batch_size] = max(1, round(samples / config.local_steps))
        return converted


@dataclass(frozen=True)
class EtaRewriter:
    """LB-BSP that also scales the learning rate with the batch size (rejected in Sec. 3.5):
    ``eta_i = eta * B_i / B_init``, the linear scaling rule of large-batch SGD."""

    name: str = "eta"

    def rewrite(self, instruction: Instruction, config: BalancingConfig) -> Instruction:
        """The balanced batch size with its scaled learning rate."""
        return replace(
            instruction, lr=config.lr * instruction.batch_size / config.initial_batch_size
        )

    def to_balancer_units(
        self, metrics: Mapping[str, Any], keys: RecordKeys, config: BalancingConfig
    ) -> dict[str, Any]:
        """Unchanged: the batch size is the share."""
        return dict(metrics)


@dataclass(frozen=True)
class FastestReplies:
    """Backup workers: keep only the k replies with the shortest reported round time.

    The reported times decide, not the arrival order, so that silos emulated one after
    the other rank as if they had run side by side.

    Parameters
    ----------
    replies : int | None (default: None)
        k; ``None``: one fewer than the silos sent the round (at least one).
    """

    replies: int | None = None

    def __post_init__(self) -> None:
        if self.replies is not None and (
            isinstance(self.replies, bool) or not int(self.replies) >= 1
        ):
            raise ValueError(f"replies must be a positive integer or None, got {self.replies!r}")

    def kept(self, sent: int) -> int:
        """Replies kept in a round sent to ``sent`` silos."""
        return max(1, sent - 1) if self.replies is None else self.replies

    def select(self, times: Mapping[str, float], *, sent: int) -> set[str]:
        """The silos kept, given each accepted silo's reported round time."""
        order = sorted(times, key=lambda silo: (times[silo], natural_key(silo)))
        return set(order[: self.kept(sent)])


def _positive(value: object) -> float | None:
    """``value`` as a float if it is a finite positive number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None
