"""Local training on a silo: exactly tau SGD steps at lr eta with the batch size it is told.

Reference: Chen et al., IEEE TCC 2021, Sec. 3.5: the server tunes B per silo while tau and
eta stay the same for all, so every local dataset keeps the same say in the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from .sampler import ResizableBatchSampler

__all__ = ["TrainResult", "TrainerConfig", "evaluate", "machine_usage", "train_local"]


class TrainerConfig(BaseModel):
    """One round's training instructions, as read from the server's ConfigRecord.

    Parameters
    ----------
    batch_size : int
        Batch size B_i, positive.
    local_steps : int
        Local SGD steps tau, positive.
    lr : float
        Learning rate eta, positive.
    server_round : int (default: 1)
        Round number, used to seed the reshuffling and pick the emulated slowdown.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(gt=0, strict=True)
    local_steps: int = Field(gt=0, strict=True)
    lr: float = Field(gt=0, allow_inf_nan=False)
    server_round: int = Field(default=1, ge=0)


@dataclass(frozen=True)
class TrainResult:
    """What one round of local training measured."""

    compute_time: float
    """Seconds spent in the tau steps (batch gathering, forward, backward, update)."""
    samples: int
    """Samples processed: batch size times local steps."""
    loss: float
    """Mean training loss over the steps."""


def train_local(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    local_steps: int,
    lr: float,
    generator: torch.Generator | None = None,
) -> TrainResult:
    """Run exactly ``local_steps`` plain SGD steps of ``batch_size`` samples each.

    Parameters
    ----------
    model : torch.nn.Module
        The model, updated in place.
    x, y : torch.Tensor
        The silo's local inputs and integer labels.
    batch_size : int
        Batch size B_i.
    local_steps : int
        Number of SGD steps tau.
    lr : float
        Learning rate eta.
    generator : torch.Generator | None (default: None)
        Seeded generator for the reshuffling.

    Raises
    ------
    pydantic.ValidationError
        On a bad ``batch_size``, ``local_steps`` or ``lr`` (see :class:`TrainerConfig`).
    """
    TrainerConfig(batch_size=batch_size, local_steps=local_steps, lr=lr)
    sampler = ResizableBatchSampler(
        len(x), batch_size=batch_size, num_batches=local_steps, generator=generator
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    total_loss = torch.zeros(())
    start = time.perf_counter()
    for indices in sampler:
        index = torch.as_tensor(indices)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()
    compute_time = time.perf_counter() - start
    return TrainResult(
        compute_time=compute_time,
        samples=batch_size * local_steps,
        loss=float(total_loss) / local_steps,
    )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    n = max(len(x), 1)
    return loss_sum / n, correct / n


def machine_usage() -> tuple[float, float]:
    """CPU utilisation since the previous call and memory utilisation, in percent."""
    return float(psutil.cpu_percent(interval=None)), float(psutil.virtual_memory().percent)
