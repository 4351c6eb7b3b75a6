"""A batch sampler whose batch size can change between rounds (no torch needed).

The sampler is a plain iterable of index lists: a numpy (scikit-learn, JAX, ...) silo
iterates it as it is, and a torch ``DataLoader`` takes it as ``batch_sampler=``. Its
permutations are torch's: those of ``torch.randperm`` on a CPU ``torch.Generator``
seeded with the same seed, reproduced with numpy's MT19937 when torch is not loaded, so
that a silo shuffles the same way whether or not its process imported torch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "TORCH_DEFAULT_SEED",
    "PermutationStream",
    "ResizableBatchSampler",
    "check_batch_size",
    "permutations",
    "torch_randperm",
]

TORCH_DEFAULT_SEED = 67280421310721
"""The seed of a fresh ``torch.Generator()`` (torch's ``default_rng_seed_val``)."""

Permutations = Callable[[int], list[int]]
"""A stream of permutations: each call returns a new permutation of ``range(n)``."""


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` as an int, or raise ValueError naming the bad value."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size should be a positive integer value, but got {batch_size!r}")
    return batch_size


def torch_randperm(seed: int) -> Permutations:
    """The permutations ``torch.randperm(n, generator=g)`` gives for
    ``g = torch.Generator().manual_seed(seed)``, one per call, without torch.

    torch's CPU generator is an MT19937 seeded with the low 32 bits of ``seed`` (as
    numpy's legacy seeding), and ``randperm`` swaps position ``i`` with ``i + r % (n - i)``
    for one 32-bit output ``r`` per position (for ``n`` below 2**32 / 20).

    Parameters
    ----------
    seed : int
        A non-negative seed (a valid ``torch.Generator`` seed).

    Returns
    -------
    Callable[[int], list of int]
        Called with ``n``, the stream's next permutation of ``range(n)``.
    """
    legacy = np.random.RandomState(seed & 0xFFFF_FFFF).get_state(legacy=False)
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937", "state": legacy["state"]}

    def permutation(n: int) -> list[int]:
        order = list(range(n))
        if n > 1:
            raw = bits.random_raw(n - 1)
            offsets = (raw % np.arange(n, 1, -1, dtype=np.uint64)).tolist()
            for i, offset in enumerate(offsets):
                j = i + offset
                order[i], order[j] = order[j], order[i]
        return order

    return permutation


def _torch_generator_randperm(generator: torch.Generator) -> Permutations:
    import torch  # the caller holds a torch.Generator: torch is loaded

    def permutation(n: int) -> list[int]:
        return list(torch.randperm(n, generator=generator).tolist())

    return permutation


def permutations(seed: int) -> Permutations:
    """The permutations of ``torch.randperm`` on a CPU generator seeded with ``seed``: torch's
    own when the process has loaded it, else :func:`torch_randperm`."""
    if "torch" in sys.modules:  # the same permutations, at torch's speed
        import torch

        return _torch_generator_randperm(torch.Generator().manual_seed(seed))
    return torch_randperm(seed)


class PermutationStream:
    """Indices from a stream of permutations of ``range(n)``: every index once per pass
    before any is seen again; a draw may span two passes. Each pass is one permutation
    turned into a list (as ``DistributedSampler`` does per epoch), a draw a slice of it.

    Parameters
    ----------
    n : int
        The indices are ``range(n)``.
    permutation : Permutations
        The stream of permutations (:func:`permutations`).
    """

    def __init__(self, n: int, permutation: Permutations) -> None:
        self.n = n
        self._permutation = permutation
        self._pending: list[int] = []
        self._next = 0  # position in _pending of the next index

    def take(self, count: int) -> list[int]:
        """The stream's next ``count`` indices."""
        if self._next + count <= len(self._pending):  # the usual case: one slice
            start, self._next = self._next, self._next + count
            return self._pending[start : self._next]
        batch: list[int] = []
        while count > 0:
            if self._next == len(self._pending):
                self._pending, self._next = self._permutation(self.n), 0
            part = self._pending[self._next : self._next + count]
            self._next += len(part)
            batch.extend(part)
            count -= len(part)
        return batch


class ResizableBatchSampler:
    """Yield batches of indices over reshuffled local data, cycling without end.

    Indices come from a :class:`PermutationStream` of ``range(num_samples)``. The batch
    size is read at every batch, so setting :attr:`batch_size` between rounds (or even
    between steps) takes effect at the next batch. A batch larger than the local dataset
    holds repeated samples.

    A plain iterable of lists of ints: iterate it directly (numpy, JAX, scikit-learn), or
    pass it to a torch ``DataLoader`` as ``batch_sampler=``. Without torch loaded it
    never imports torch.

    Parameters
    ----------
    num_samples : int
        Size of the local dataset.
    batch_size : int
        Initial batch size, a positive integer.
    num_batches : int | None (default: None)
        Stop after this many batches (the local steps tau); ``None`` never stops.
    generator : torch.Generator | None (default: None)
        Seeded torch generator for the permutations (``torch.randperm``).
    seed : int | None (default: None)
        Seed for the permutations, the same as ``generator=torch.Generator().manual_seed(
        seed)`` gives, with or without torch (:func:`torch_randperm`). Neither
        ``generator`` nor ``seed``: a fresh ``torch.Generator()``'s
        (:data:`TORCH_DEFAULT_SEED`).

    Attributes
    ----------
    batches_drawn, samples_drawn : int
        Batches and samples yielded so far, over every iteration (a second pass over a
        ``DataLoader`` built on it counts again): what the silo really drew.
    drawn_at : list of float
        ``time.perf_counter()`` when the first and the second batch were drawn (at most
        two entries): where the silo's compute starts, and where its warm-up step ends.

    Raises
    ------
    ValueError
        A ``num_samples``, ``batch_size`` or ``num_batches`` that is not a positive
        integer, or both ``generator`` and ``seed``.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        num_batches: int | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer, but got {num_samples!r}")
        if num_batches is not None:
            check_batch_size(num_batches)
        if generator is not None and seed is not None:
            raise ValueError("give a generator or a seed, not both")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.generator = generator
        self._stream = PermutationStream(
            num_samples,
            _torch_generator_randperm(generator)
            if generator is not None
            else permutations(TORCH_DEFAULT_SEED if seed is None else seed),
        )
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

    def __iter__(self) -> Iterator[list[int]]:
        produced = 0
        while self.num_batches is None or produced < self.num_batches:
            batch = self._stream.take(self.batch_size)
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
