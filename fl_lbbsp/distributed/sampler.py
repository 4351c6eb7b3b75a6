"""Per-rank batch sizes for a torch.distributed job: a batch sampler and a DataLoader.

Each rank draws, every iteration, the batch size its plan (an :class:`LBBSPCoordinator`)
holds for it at that moment. Either the ranks split one global batch of X samples by
offsets, so that together they draw exactly BSP's global batch (and the weighted gradient
is BSP's exact gradient), or each rank draws from its own shard.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.4 (the global batch X = sum_i B_i is kept, every
sample weighs the same).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

from torch.utils.data import DataLoader, Dataset, Sampler

from ..clients.sampler import PermutationStream, permutations
from ..core.silo.reports import check_positive_int

__all__ = ["BatchPlan", "LBBSPBatchSampler", "Split", "lbbsp_data_loader"]

Split = Literal["global", "shard"]
SPLITS: tuple[str, ...] = ("global", "shard")


class BatchPlan(Protocol):
    """What a sampler reads every batch: the ranks' batch sizes and its own rank."""

    @property
    def sizes(self) -> tuple[int, ...]:
        """Batch size of every rank in this iteration (rank order)."""
        ...

    @property
    def rank(self) -> int:
        """This process's rank."""
        ...


class LBBSPBatchSampler(Sampler[list[int]]):
    """Yield this rank's batch of each iteration, at the size the plan gives it then.

    Like :class:`torch.utils.data.BatchSampler`, the batch size is read inside
    ``__iter__``, batch by batch: a change of the plan (``coordinator.step()``) takes
    effect at the next batch drawn. Use it with a loader that does not draw ahead
    (``num_workers=0``, as :func:`lbbsp_data_loader` makes), or batches drawn early keep
    the old sizes.

    Parameters
    ----------
    num_samples : int
        Size of the dataset (every rank passes the same).
    plan : BatchPlan
        Where the sizes come from, usually the job's
        :class:`~fl_lbbsp.distributed.LBBSPCoordinator`.
    split : {"global", "shard"} (default: "global")
        ``"global"``: every rank runs the same seeded stream of permutations of the whole
        dataset, takes the iteration's X = sum(sizes) next indices (BSP's global batch,
        as ``DistributedSampler`` would split it) and keeps its slice
        ``[offset_r, offset_r + B_r)``. ``"shard"``: rank r draws B_r samples from its own
        i.i.d. shard ``r, r + world, ...`` (reshuffled every pass), the per-rank data of
        a job whose ranks hold different data.
    seed : int (default: 0)
        Seed of the permutations (the same on every rank).
    num_batches : int | None (default: None)
        Stop after this many batches (iterations); ``None`` never stops.
    start : int (default: 0)
        Batches already trained (a resumed job): their indices are drawn and discarded
        first, at the current sizes, so a resumed ``"global"`` run (whose total X does not
        change) continues the same stream of global batches.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        plan: BatchPlan,
        split: Split = "global",
        seed: int = 0,
        num_batches: int | None = None,
        start: int = 0,
    ) -> None:
        check_positive_int("num_samples", num_samples)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start must be a non-negative integer, got {start!r}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if num_batches is not None:
            check_positive_int("num_batches", num_batches)
        world = len(plan.sizes)
        if split == "shard" and num_samples < world:
            raise ValueError(f"{num_samples} samples cannot make {world} shards")
        self.num_samples = num_samples
        self.plan = plan
        self.split: Split = split
        self.seed = seed
        self.num_batches = num_batches
        self.start = start

    def __iter__(self) -> Iterator[list[int]]:
        if self.split == "global":
            return self._global()
        return self._shard()

    def _global(self) -> Iterator[list[int]]:
        stream = PermutationStream(self.num_samples, permutations(self.seed))
        for _ in range(self.start):
            stream.take(sum(self.plan.sizes))
        produced = 0
        while self.num_batches is None or produced < self.num_batches:
            sizes, rank = self.plan.sizes, self.plan.rank
            batch = stream.take(sum(sizes))
            offset = sum(sizes[:rank])
            yield batch[offset : offset + sizes[rank]]
            produced += 1

    def _shard(self) -> Iterator[list[int]]:
        rank = self.plan.rank
        shard = range(rank, self.num_samples, len(self.plan.sizes))
        stream = PermutationStream(len(shard), permutations(self.seed * 1_000_003 + rank))
        for _ in range(self.start):
            stream.take(self.plan.sizes[rank])
        produced = 0
        while self.num_batches is None or produced < self.num_batches:
            yield [shard[i] for i in stream.take(self.plan.sizes[rank])]
            produced += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless LBBSPBatchSampler has no length")
        return self.num_batches


def lbbsp_data_loader(
    dataset: Dataset[Any] | Sequence[Any],
    *,
    plan: BatchPlan,
    split: Split = "global",
    seed: int = 0,
    num_batches: int | None = None,
    start: int = 0,
    **loader_options: Any,
) -> DataLoader[Any]:
    """A DataLoader whose batches follow the plan: :class:`LBBSPBatchSampler` over
    ``dataset``, drawn one batch at a time.

    Parameters
    ----------
    dataset : Dataset or sequence
        The map-style dataset (``len()`` and integer indexing).
    plan, split, seed, num_batches, start :
        As :class:`LBBSPBatchSampler`.
    **loader_options :
        Any other DataLoader argument (``collate_fn``, ``pin_memory``, ...).
        ``num_workers`` must stay 0: worker processes draw batches ahead, at stale sizes.
    """
    if loader_options.get("num_workers", 0) != 0:
        raise ValueError(
            "num_workers must be 0: worker processes draw batches ahead of the plan, at "
            f"stale batch sizes (got num_workers={loader_options['num_workers']!r})"
        )
    for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
        if key in loader_options:
            raise ValueError(f"{key} is set by the plan; do not pass it")
    sampler = LBBSPBatchSampler(
        len(dataset),  # type: ignore[arg-type]
        plan=plan,
        split=split,
        seed=seed,
        num_batches=num_batches,
    )
    return DataLoader(dataset, batch_sampler=sampler, **loader_options)  # type: ignore[arg-type]
