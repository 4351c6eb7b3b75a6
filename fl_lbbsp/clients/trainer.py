"""Local training on a silo: exactly tau SGD steps at lr eta with the batch size it is told.

Reference: Chen et al., IEEE TCC 2021, Sec. 3.5: the server tunes B per silo while tau and
eta stay the same for all, so every local dataset keeps the same say in the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..instruction import RoundInstruction
from .round import machine_usage
from .sampler import ResizableBatchSampler

__all__ = ["TrainResult", "TrainerConfig", "evaluate", "machine_usage", "train_local"]


TrainerConfig = RoundInstruction
"""One round's training instructions: :class:`~fl_lbbsp.instruction.RoundInstruction`
(the name the silo side used before the server and the silo shared one codec)."""


@dataclass(frozen=True)
class TrainResult:
    """What one round of local training measured."""

    compute_time: float
    """Seconds spent in the tau steps (batch gathering, forward, backward, update)."""
    samples: int
    """Samples processed: those drawn from the sampler (batch size times local steps)."""
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
    sampler: ResizableBatchSampler | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> TrainResult:
    """Run exactly ``local_steps`` optimiser steps of ``batch_size`` samples each (plain
    SGD unless the app passes its own optimiser).

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
    sampler : ResizableBatchSampler | None (default: None)
        Where the batches come from, e.g. a round plan's
        :meth:`~fl_lbbsp.clients.round.LocalTraining.batch_sampler` (which counts what is
        drawn); ``None``: ``local_steps`` batches of ``batch_size`` seeded by
        ``generator``.
    optimizer : torch.optim.Optimizer | None (default: None)
        The app's own optimiser over ``model``'s parameters (momentum, weight decay, Adam,
        ...), stepped once per batch; the learning rate of each of its parameter groups is
        set to ``lr`` (eta is the server's, the same for every silo). ``None``: plain SGD.

    Raises
    ------
    pydantic.ValidationError
        On a bad ``batch_size``, ``local_steps`` or ``lr`` (see :class:`TrainerConfig`).
    """
    TrainerConfig(batch_size=batch_size, local_steps=local_steps, lr=lr)
    if sampler is None:
        sampler = ResizableBatchSampler(
            len(x), batch_size=batch_size, num_batches=local_steps, generator=generator
        )
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        for group in optimizer.param_groups:
            group["lr"] = lr
    model.train()
    total_loss = torch.zeros(())
    steps = samples = 0
    start = time.perf_counter()
    for indices in sampler:
        index = torch.as_tensor(indices)
        steps += 1
        samples += len(indices)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()
    compute_time = time.perf_counter() - start
    return TrainResult(
        compute_time=compute_time,
        samples=samples,
        loss=float(total_loss) / max(steps, 1),
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
