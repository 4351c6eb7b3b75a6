"""The emulation wrapper the simulation runners add around the plain silo round.

The production round (:func:`~fl_lbbsp.clients.round.run_round`) reports what it
measured. To show LB-BSP on one machine, the simulation runners (the bundled ClientApp, the
quickstart task, the cluster worker, and the adapter when the run or node config asks for
a slowdown or a cost model) wrap it with :func:`run_emulated_round`: the silo computes in
a compute slot shared by the silos of this machine, on one torch thread
(:func:`single_threaded`), then reports ``k * t`` (or a cost model's time) and waits,
outside the slot, until that time has passed since it got its instruction; its
``compute-start`` and ``compute-end`` span the emulated round, so that the server's check
of the claim sees the emulated time (shared/DESIGN.md, "Emulated heterogeneity"). Every
figure that relies on it is labelled emulated.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..contract import COMPUTE_END, COMPUTE_START, SLOWDOWN, RecordKeys
from ..instruction import PARTITION_ID, RoundInstruction
from .emulation import CostModel, SlowdownSchedule, emulated_time
from .round import LocalTraining, RoundReport, WorkDone, run_round

__all__ = [
    "SLOWDOWNS_KEY",
    "SLOWDOWN_KEY",
    "Emulation",
    "run_emulated_round",
    "single_threaded",
    "slowdown_schedule",
]

T = TypeVar("T")

SLOWDOWN_KEY = "slowdown"
"""node_config entry: this silo's emulated slowdown k (``"4"`` or ``"1:1,10:4"``)."""
SLOWDOWNS_KEY = "slowdowns"
"""run_config entry: emulated slowdowns per partition, ``"1;2;4"``."""


@dataclass(frozen=True, kw_only=True)
class Emulation:
    """How a silo emulates a slower machine.

    Parameters
    ----------
    factor : float (default: 1.0)
        Slowdown k of the round (>= 1).
    cost : CostModel | None (default: None)
        Emulated step time of the fastest machine; ``None``: measured times.
    wait : bool (default: True)
        Wait until the reported time has passed.
    threads : int | None (default: 1)
        Intra-op threads of torch (if the silo's process has imported it) while the
        work computes, restored after (:func:`single_threaded`); ``None``: as the process
        set them.
    """

    factor: float = 1.0
    cost: CostModel | None = None
    wait: bool = True
    threads: int | None = 1


def run_emulated_round(
    instruction: RoundInstruction,
    work: Callable[[LocalTraining], WorkDone[T]],
    *,
    emulation: Emulation,
    silo_id: str,
    slot: AbstractContextManager[Any] | None = None,
    started: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    **options: Any,
) -> RoundReport[T]:
    """The plain round (:func:`~fl_lbbsp.clients.round.run_round`) of a silo emulating a
    slower machine.

    Parameters
    ----------
    instruction, work, silo_id
        As in :func:`~fl_lbbsp.clients.round.run_round`.
    emulation : Emulation
        The slowdown, cost model and whether to wait.
    slot : context manager | None (default: None)
        Held while the round computes (a compute slot shared with the silos of this
        machine); the emulated wait happens outside it.
    started : float | None (default: None)
        ``clock()`` when the silo got its instruction: the emulated wait ends
        ``train-time`` after it, so queueing for the slot and loading count as part of
        the emulated round; ``None``: the wait is ``train-time`` minus the compute time.
    clock, sleep : Callable (default: time.perf_counter, time.sleep)
        The clock of ``started`` and how to wait.
    **options
        ``run_seed``, ``keys``, ``max_batch_size``, ``check_draws`` of
        :func:`~fl_lbbsp.clients.round.run_round`.

    Returns
    -------
    RoundReport
        The plain round's report, its ``train-time`` the emulated one, ``slowdown`` the
        factor k, and its interval spanning the emulated round.

    Raises
    ------
    fl_lbbsp.clients.emulation.OutOfMemoryError
        A cost model's memory cap is below the batch size.
    Exception
        Whatever the plain round raises, before any emulated wait.
    """
    names: RecordKeys = options.get("keys") or RecordKeys()
    with slot or contextlib.nullcontext(), single_threaded(emulation.threads):
        report = run_round(instruction, work, silo_id=silo_id, **options)
    reported = emulated_time(
        report.compute_time,
        emulation.factor,
        cost=emulation.cost,
        batch_size=instruction.batch_size,
        local_steps=instruction.local_steps,
        wait=emulation.wait,
        started=started,
        clock=clock,
        sleep=sleep,
    )
    metrics = {**report.metrics, names.train_time: reported, SLOWDOWN: emulation.factor}
    end = max(time.time(), metrics[COMPUTE_END])
    # the emulated round spans at least its reported time: a wait cut short (the silo
    # queued for its compute slot) began when the instruction came
    metrics[COMPUTE_START] = min(metrics[COMPUTE_START], end - reported)
    metrics[COMPUTE_END] = end
    return replace(report, metrics=metrics, reported_time=reported)


@contextlib.contextmanager
def single_threaded(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads of torch, restored after; nothing
    when ``threads`` is ``None`` or the process has not imported torch (a numpy silo
    does not load it).

    An emulated silo stands for a machine of its own, and its measured compute is
    multiplied by its slowdown k: it must measure the work, not the host's co-tenants. A
    thread pool spanning every core waits at each operation for its slowest thread, so a
    co-tenant that deschedules one thread stalls them all (steps of 2 ms took 10 to 450 ms
    on a 2-core machine under load with 2 threads, 1.3 to 20 ms with one); one thread is
    slowed by at most the co-tenants' share of its core (Chen et al., IEEE TCC 2021, Sec.
    3.2: the speed to predict is the worker's capacity; the emulation follows shared/
    DESIGN.md, "Emulated heterogeneity").

    Parameters
    ----------
    threads : int | None
        Threads for the block (>= 1); ``None``: leave them.
    """
    torch = sys.modules.get("torch")
    if threads is None or torch is None:
        yield
        return
    before = int(torch.get_num_threads())
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def slowdown_schedule(
    node_config: Mapping[str, Any],
    *,
    listed: Sequence[str] = (),
    run_config: Mapping[str, Any] | None = None,
) -> SlowdownSchedule:
    """This silo's emulated slowdown: node_config ``slowdown``, else its partition's
    entry of ``listed`` (a setup's), else of run_config ``slowdowns`` (``"1;2;4"``) when
    ``listed`` is empty, else 1 (none).

    Raises
    ------
    ValueError
        A slowdown that does not parse (:meth:`SlowdownSchedule.parse`); run_config
        ``slowdowns`` with fewer entries than node_config ``num-partitions``, or with an
        entry that does not parse (every silo of the run refuses it alike).
    """
    value = node_config.get(SLOWDOWN_KEY)
    if value is None:
        entries = list(listed)
        if not entries and run_config is not None:
            text = str(run_config.get(SLOWDOWNS_KEY, "") or "")
            entries = [s for s in text.split(";") if s]
            count = node_config.get("num-partitions")
            if entries and count is not None and len(entries) < int(count):
                raise ValueError(
                    f"run config slowdowns {text!r} lists {len(entries)} entries for "
                    f"{count} partitions: give one per partition, separated by ';' "
                    "(such as '1;4;1')"
                )
            for entry in entries:
                SlowdownSchedule.parse(entry)
        partition = int(node_config.get(PARTITION_ID, 0))
        value = entries[partition] if partition < len(entries) else 1.0
    return SlowdownSchedule.parse(value)
