"""A batch sampler whose batch size can change between rounds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

__all__ = ["ResizableBatchSampler", "check_batch_size"]


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` as an int, or raise ValueError naming the bad value."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size should be a positive integer value, but got {batch_size!r}")
    return batch_size


class ResizableBatchSampler(Sampler[list[int]]):
    """Yield batches of indices over reshuffled local data, cycling without end.

    Indices come from a stream of random permutations of ``range(num_samples)``: every
    sample is seen once per pass before any is seen again, and a batch may span two
    passes. The batch size is read at every batch, so setting :attr:`batch_size`
    between rounds (or even between steps) takes effect at the next batch. A batch
    larger than the local dataset holds repeated samples.

    Parameters
    ----------
    num_samples : int
        Size of the local dataset.
    batch_size : int
        Initial batch size, a positive integer.
    num_batches : int | None (default: None)
        Stop after this many batches (the local steps tau); ``None`` never stops.
    generator : torch.Generator | None (default: None)
        Seeded generator for the permutations; ``None`` uses a fresh unseeded one.

    Attributes
    ----------
    batches_drawn, samples_drawn : int
        Batches and samples yielded so far, over every iteration (a second pass over a
        ``DataLoader`` built on it counts again): what the silo really drew.
    drawn_at : list of float
        ``time.perf_counter()`` when the first and the second batch were drawn (at most
        two entries): where the silo's compute starts, and where its warm-up step ends.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        num_batches: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer, but got {num_samples!r}")
        if num_batches is not None:
            check_batch_size(num_batches)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.generator = generator if generator is not None else torch.Generator()
        self._pending = torch.empty(0, dtype=torch.long)
        self.batches_drawn = 0
        self.samples_drawn = 0
        self.drawn_at: list[float] = []

    @property
    def batch_size(self) -> int:
        """Size of the next batch."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._batch_size = check_batch_size(value)

    def _take(self, count: int) -> torch.Tensor:
        parts = []
        while count > 0:
            if self._pending.numel() == 0:
                self._pending = torch.randperm(self.num_samples, generator=self.generator)
            part, self._pending = self._pending[:count], self._pending[count:]
            parts.append(part)
            count -= part.numel()
        return torch.cat(parts)

    def __iter__(self) -> Iterator[list[int]]:
        produced = 0
        while self.num_batches is None or produced < self.num_batches:
            batch = self._take(self.batch_size).tolist()
            if len(self.drawn_at) < 2:
                self.drawn_at.append(time.perf_counter())
            self.batches_drawn += 1
            self.samples_drawn += len(batch)
            yield batch
            produced += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless ResizableBatchSampler has no length")
        return self.num_batches
