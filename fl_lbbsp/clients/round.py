"""One silo round, whichever entry point runs it.

Every silo entry point (the bundled ClientApp, the quickstart task, the adapter
:func:`~fl_lbbsp.clients.adapter.lbbsp_train` and the cluster worker) reads its
:class:`~fl_lbbsp.instruction.RoundInstruction` with the same codec and calls
:func:`run_round` with its own *work* (tau SGD steps, the user's own loop, one gradient).
The round does the rest alike: the :class:`LocalTraining` plan, seeded by
:func:`~fl_lbbsp.instruction.round_seed` (a silo shuffles the same way in simulation and
in deployment), whose sampler counts what is drawn; psutil's CPU window; the compute time
and interval; the contract's metrics and a ``misuse`` note (:func:`misuse_of`). It is
plain: emulating a slower machine is a wrapper the simulation runners add
(:func:`~fl_lbbsp.clients.emulated.run_emulated_round`). None of it imports torch but
:meth:`LocalTraining.loader`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psutil

from ..contract import (
    COMPUTE_END,
    COMPUTE_START,
    COMPUTE_TIME,
    TRAIN_LOSS,
    BatchSizeOutOfMemoryError,
    RecordKeys,
    is_out_of_memory,
)
from ..instruction import RoundInstruction, round_seed
from .sampler import ResizableBatchSampler

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = [
    "LocalTraining",
    "RoundReport",
    "WorkDone",
    "machine_usage",
    "misuse_of",
    "run_round",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

FIX = (
    "train on plan.loader(trainloader), or on a DataLoader with "
    "batch_sampler=plan.batch_sampler(len(trainset)), for plan.local_steps steps, once"
)
"""The fix a ``misuse`` note names."""


@dataclass
class LocalTraining:
    """One round's instructions for the silo's training loop, its sampler and stopwatch.

    Parameters
    ----------
    batch_size : int
        B_i, this silo's batch size for the round.
    local_steps : int
        tau: run exactly this many steps (the same for every silo).
    lr : float
        eta (the same for every silo).
    server_round : int
        The round number.
    seed : int
        The silo's round seed (:func:`~fl_lbbsp.instruction.round_seed`), for
        reproducible reshuffling.
    """

    batch_size: int
    local_steps: int
    lr: float
    server_round: int
    seed: int
    _compute_time: float | None = field(default=None, repr=False)
    _timed_from: float | None = field(default=None, repr=False)
    _samplers: list[ResizableBatchSampler] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, instruction: RoundInstruction, *, seed: int) -> LocalTraining:
        """The plan of ``instruction`` with the silo's round ``seed``."""
        return cls(
            batch_size=instruction.batch_size,
            local_steps=instruction.local_steps,
            lr=instruction.lr,
            server_round=instruction.server_round,
            seed=seed,
        )

    def batch_sampler(self, num_samples: int) -> ResizableBatchSampler:
        """Exactly ``local_steps`` batches of ``batch_size`` indices (lists of ints) over
        reshuffled ``range(num_samples)`` (seeded): iterate it, or pass it to a torch
        ``DataLoader`` as ``batch_sampler=``. What is drawn through it is counted and
        reported (``samples-drawn``). It needs no torch.

        A batch size over ``num_samples`` is drawn as told (each batch repeats samples),
        with a warning; the round then reports ``num_samples`` as this silo's
        ``max-batch-size``, so that the server gives it no more from the next round on."""
        if self.batch_size > num_samples > 0:
            log.warning(
                "round %d: batch size %d is over this silo's %d samples, so each batch "
                "repeats samples; the silo reports max-batch-size %d to the server",
                self.server_round, self.batch_size, num_samples, num_samples,
            )  # fmt: skip
        sampler = ResizableBatchSampler(
            num_samples,
            batch_size=self.batch_size,
            num_batches=self.local_steps,
            seed=self.seed,
        )
        self._samplers.append(sampler)
        return sampler

    def loader(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        """``dataloader`` re-cut to this round: the same dataset, collate function and
        workers, batches from :meth:`batch_sampler` (exactly ``local_steps`` batches of
        ``batch_size``, reshuffled); one pass over it is the round's training.

        Parameters
        ----------
        dataloader : torch.utils.data.DataLoader
            The app's own training loader (its batch size and shuffling are replaced).

        Raises
        ------
        TypeError
            Its dataset has no length (an ``IterableDataset``): draw from
            :meth:`batch_sampler` over your own indices instead.
        """
        from torch.utils.data import DataLoader  # only a torch silo calls this

        dataset = dataloader.dataset
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                "plan.loader needs a map-style dataset with a length; for an iterable "
                "dataset draw plan.local_steps batches of plan.batch_size yourself"
            )
        workers = dataloader.num_workers
        return DataLoader(
            dataset,
            batch_sampler=self.batch_sampler(len(dataset)),
            collate_fn=dataloader.collate_fn,
            num_workers=workers,
            pin_memory=dataloader.pin_memory,
            worker_init_fn=dataloader.worker_init_fn,
            persistent_workers=dataloader.persistent_workers if workers else False,
        )

    def drawn_time(self, end: float) -> float | None:
        """Seconds of compute from the batches drawn, up to ``end``
        (``time.perf_counter()``): from the second batch on, scaled to ``local_steps``
        steps, so that neither the loading before the first batch (a cold process, the
        dataset built) nor the first step's warm-up counts; with one batch, from the
        first. ``None``: nothing was drawn through this plan."""
        draws = sorted(t for sampler in self._samplers for t in sampler.drawn_at)
        if not draws:
            return None
        if len(draws) < 2 or self.local_steps < 2:
            return max(end - draws[0], 0.0)
        return max(end - draws[1], 0.0) * self.local_steps / (self.local_steps - 1)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Time the block as the round's compute (several blocks add up): from the first
        batch drawn in it through the plan's samplers (else from its start) to its end,
        so that what comes before the steps (building the optimiser, whose first
        construction in a process imports torch's compiler, about 1.6 s; moving the
        model) is not counted as compute. Without it the compute is timed from the
        batches drawn (:meth:`drawn_time`), or the whole work when nothing is drawn
        through the plan."""
        start = time.perf_counter()
        if self._timed_from is None:
            self._timed_from = start
        try:
            yield
        finally:
            end = time.perf_counter()
            firsts = (s.drawn_at[0] for s in self._samplers if s.drawn_at)
            steps_from = min((t for t in firsts if t >= start), default=start)
            if self._compute_time is None:
                self._timed_from = steps_from  # the interval opens at the steps too
            self._compute_time = (self._compute_time or 0.0) + end - steps_from

    def compute_began(self, default: float) -> float:
        """``time.perf_counter()`` when the compute began: the first :meth:`timed` block
        (its first batch drawn, if any), else the first batch drawn, else ``default`` (the
        work's start). Loading the data and building the model before it are not compute."""
        if self._timed_from is not None:
            return self._timed_from
        draws = [t for sampler in self._samplers for t in sampler.drawn_at]
        return min(draws, default=default)

    @property
    def compute_time(self) -> float | None:
        """Seconds measured by :meth:`timed` so far (``None``: not used)."""
        return self._compute_time

    @property
    def num_samples(self) -> int | None:
        """The local dataset size the batches were drawn over (the largest, if the work
        made several samplers); ``None``: no sampler made."""
        return max((s.num_samples for s in self._samplers), default=None)

    @property
    def batches_drawn(self) -> int:
        """Batches drawn so far through this plan's samplers."""
        return sum(s.batches_drawn for s in self._samplers)

    @property
    def samples_drawn(self) -> int:
        """Samples drawn so far through this plan's samplers."""
        return sum(s.samples_drawn for s in self._samplers)


def machine_usage() -> tuple[float, float]:
    """CPU utilisation since the previous call and memory utilisation, in percent."""
    return float(psutil.cpu_percent(interval=None)), float(psutil.virtual_memory().percent)


def misuse_of(plan: LocalTraining) -> str | None:
    """One line saying what was drawn through the plan's samplers against what was
    instructed, and the fix; ``None`` when exactly ``local_steps`` batches of
    ``batch_size`` were drawn."""
    batches, samples = plan.batches_drawn, plan.samples_drawn
    expected = plan.batch_size * plan.local_steps
    if batches == plan.local_steps and samples == expected:
        return None
    if batches == 0:
        drawn = "drew no batch through plan.batch_sampler (its own loader?)"
    else:
        drawn = f"drew {batches} batches, {samples} samples through plan.batch_sampler"
    return (
        f"the train function {drawn}; instructed {plan.local_steps} batches of "
        f"{plan.batch_size} ({expected} samples): {FIX}"
    )


@dataclass(frozen=True, kw_only=True)
class WorkDone(Generic[T]):
    """What a silo's work returns to :func:`run_round`.

    Parameters
    ----------
    output : T
        Whatever the entry point needs back (the user's reply, the gradient, ...).
    num_examples : int | None (default: None)
        The local dataset size (the aggregation weight) to report; ``None``: the work's
        own reply carries it.
    loss : float | None (default: None)
        The round's mean training loss (``train-loss``), if known.
    """

    output: T
    num_examples: int | None = None
    loss: float | None = None


@dataclass(frozen=True, kw_only=True)
class RoundReport(Generic[T]):
    """What one silo round did: the work's output and the reply's metrics and notes.

    Attributes
    ----------
    output : T
        The work's output.
    metrics : dict of str to int | float
        The contract's metrics (``train-time``, ``batch-size``, ``samples-processed``,
        ``samples-drawn``, ``cpu-percent``, ``memory-percent``, and ``num-examples`` and
        ``max-batch-size`` when known) and ``compute-time``, ``compute-start``,
        ``compute-end`` and ``train-loss`` (when known).
    notes : dict of str to str
        Entries of the reply's ``silo`` ConfigRecord: ``misuse`` when the work drew other
        batches than instructed.
    plan : LocalTraining
        The plan the work was given.
    compute_time : float
        Real, unemulated seconds of compute.
    reported_time : float
        The ``train-time`` reported: ``compute_time`` in a plain round, the emulated
        time in an emulated one.
    """

    output: T
    metrics: dict[str, int | float]
    notes: dict[str, str]
    plan: LocalTraining
    compute_time: float
    reported_time: float


def run_round(
    instruction: RoundInstruction,
    work: Callable[[LocalTraining], WorkDone[T]],
    *,
    silo_id: str,
    run_seed: object = 0,
    keys: RecordKeys | None = None,
    max_batch_size: int | None = None,
    check_draws: bool = True,
) -> RoundReport[T]:
    """Run one silo round: the work on the instruction's plan, timed.

    Parameters
    ----------
    instruction : RoundInstruction
        The round's instruction (:meth:`RoundInstruction.from_config`).
    work : Callable[[LocalTraining], WorkDone]
        The silo's training (or gradient) for the round; it may time its compute with
        ``plan.timed()`` (else the whole call is timed) and should draw its batches with
        ``plan.batch_sampler(n)``.
    silo_id : str
        The silo's id (:func:`~fl_lbbsp.instruction.silo_id_of`).
    run_seed : object (default: 0)
        The run's seed; with ``silo_id`` and the round it seeds the plan.
    keys : RecordKeys | None (default: None)
        Record key names; ``None``: the defaults.
    max_batch_size : int | None (default: None)
        The silo's memory cap to report; ``None``: not reported.
    check_draws : bool (default: True)
        The work draws its batches through the plan: report ``samples-drawn``, count
        ``samples-processed`` from what was drawn, add a ``misuse`` note when that is not
        ``local_steps`` batches of ``batch_size``, and report the local dataset size the
        batches were drawn over as a ``max-batch-size`` (the lower of it and
        ``max_batch_size``): a batch over it only repeats samples. ``False`` (cluster
        mode, which slices a global batch): ``samples-processed`` is
        ``batch_size * local_steps``.

    Returns
    -------
    RoundReport
        The work's output, the metrics and the notes of the reply: ``train-time`` is the
        measured compute, ``compute-start`` and ``compute-end`` the compute's interval on
        this silo's clock (``time.time()``): from the first ``plan.timed()`` block, else
        the first batch drawn, else the work's start, to the work's end.

    Raises
    ------
    BatchSizeOutOfMemoryError
        When the work runs out of memory (``MemoryError``, torch's ``OutOfMemoryError``):
        the server reads the batch size from the error reply and caps the silo below it.
    Exception
        Whatever else the work raises.
    """
    names = keys or RecordKeys()
    plan = LocalTraining.of(
        instruction, seed=round_seed(run_seed, silo_id, instruction.server_round)
    )
    machine_usage()  # start psutil's CPU window
    start_at = time.time()
    begun = time.perf_counter()
    try:
        done = work(plan)
    except Exception as err:
        if is_out_of_memory(err) and not isinstance(err, BatchSizeOutOfMemoryError):
            # a reply the server reads: it caps this silo instead of resending the size
            raise BatchSizeOutOfMemoryError(batch_size=instruction.batch_size, cause=err) from err
        raise
    ended = time.perf_counter()
    end_at = time.time()
    cpu, memory = machine_usage()
    measured = plan.compute_time
    if measured is None:
        drawn = plan.drawn_time(ended)
        measured = ended - begun if drawn is None else min(drawn, ended - begun)
    metrics: dict[str, int | float] = {}
    if done.num_examples is not None:
        metrics[names.num_examples] = done.num_examples
    samples = instruction.samples
    notes: dict[str, str] = {}
    cap = max_batch_size
    if check_draws:
        if plan.num_samples is not None:
            # a cap of 0 is none (the node config's default)
            cap = plan.num_samples if not cap else min(cap, plan.num_samples)
        if plan.batches_drawn:
            samples = plan.samples_drawn
        metrics[names.samples_drawn] = plan.samples_drawn
        misuse = misuse_of(plan)
        if misuse is not None:
            notes[names.misuse] = misuse
    metrics.update(
        {
            names.train_time: measured,
            names.batch_size: instruction.batch_size,
            names.samples_processed: samples,
            names.cpu_percent: cpu,
            names.memory_percent: memory,
            COMPUTE_TIME: measured,
            COMPUTE_START: start_at + max(plan.compute_began(begun) - begun, 0.0),
            COMPUTE_END: max(end_at, start_at),
        }
    )
    if cap is not None:
        metrics[names.max_batch_size] = cap
    if done.loss is not None:
        metrics[TRAIN_LOSS] = done.loss
    return RoundReport(
        output=done.output,
        metrics=metrics,
        notes=notes,
        plan=plan,
        compute_time=measured,
        reported_time=measured,
    )
