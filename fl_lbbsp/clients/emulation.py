"""Emulate a silo k times slower than the machine it runs on.

After computing for ``t`` seconds the silo waits ``(k - 1) * t`` and reports ``k * t``
(shared/DESIGN.md, "Emulated heterogeneity"). Every figure that relies on it is labelled
emulated.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

__all__ = [
    "CostModel",
    "CostModelText",
    "OutOfMemoryError",
    "SlowdownSchedule",
    "SlowdownText",
    "Speeds",
    "compute_slot",
    "emulate_slowdown",
    "emulated_time",
    "slowdowns_from_speeds",
]


class SlowdownSchedule(BaseModel):
    """Slowdown factor k per round: a constant, or ``"ROUND:K,ROUND:K"`` steps.

    ``"4"`` is k = 4 in every round; ``"1:1,10:4"`` is k = 1 from round 1 and k = 4 from
    round 10 on (a co-tenant arriving). Before the first listed round k is 1.

    Parameters
    ----------
    steps : dict of int to float
        First round (>= 1) -> slowdown factor (finite, >= 1) from that round on; at least
        one step.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: dict[Annotated[int, Field(ge=1)], Annotated[float, Field(ge=1, allow_inf_nan=False)]] = (
        Field(min_length=1)
    )

    @field_validator("steps")
    @classmethod
    def _sorted(cls, steps: dict[int, float]) -> dict[int, float]:
        return dict(sorted(steps.items()))

    @classmethod
    def parse(cls, value: str | float | int) -> SlowdownSchedule:
        """Parse ``4``, ``"4"`` or ``"1:1,10:4"``; ValueError names a bad value."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls(steps={1: float(value)})
        text = str(value).strip()
        try:
            if ":" not in text:
                return cls(steps={1: float(text)})
            steps: dict[int, float] = {}
            for item in text.split(","):
                rnd, k = item.split(":")
                steps[int(rnd)] = float(k)
            return cls(steps=steps)
        except ValueError as err:
            reason = (
                "; ".join(str(e["msg"]) for e in err.errors())
                if isinstance(err, ValidationError)
                else str(err)
            )
            raise ValueError(
                f"invalid slowdown {value!r}: expected a factor like '4' or a schedule "
                f"like '1:1,10:4' ({reason})"
            ) from None

    def factor(self, server_round: int) -> float:
        """Slowdown factor k in ``server_round``."""
        k = 1.0
        for rnd, value in self.steps.items():
            if server_round >= rnd:
                k = value
        return k

    def __str__(self) -> str:
        if list(self.steps) == [1]:
            return f"{self.steps[1]:g}"
        return ",".join(f"{r}:{k:g}" for r, k in self.steps.items())


def emulate_slowdown(
    compute_time: float,
    factor: float,
    *,
    wait: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """The emulated time ``factor * t``, after waiting ``(factor - 1) * t`` unless
    ``wait`` is off: the measured case of :func:`emulated_time`."""
    return emulated_time(compute_time, factor, cost=None, batch_size=1, wait=wait, sleep=sleep)


def emulated_time(
    compute_time: float,
    factor: float,
    *,
    cost: CostModel | None,
    batch_size: int,
    local_steps: int = 1,
    wait: bool = True,
    started: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """The time a silo reports for ``local_steps`` steps at ``batch_size``, after waiting
    for it to pass if asked: ``factor * compute_time``, or with a cost model
    ``local_steps * cost.scaled(factor).time(batch_size)``, the same on a quiet or a busy
    machine (tests, benchmarks that need exact capacities).

    The wait ends when the reported time has passed since ``started`` (the instruction's
    arrival), so queueing for a compute slot (:func:`compute_slot`) is part of the
    emulated round, as on a machine of its own; without ``started`` it is the reported
    time minus the compute time.

    Parameters
    ----------
    compute_time : float
        Real seconds of compute t.
    factor : float
        Slowdown factor k >= 1.
    cost : CostModel | None
        The fastest machine's batch time; ``None``: measured times.
    batch_size : int
        Batch size of each step.
    local_steps : int (default: 1)
        Steps of the round.
    wait : bool (default: True)
        Wait until the reported time has passed.
    started : float | None (default: None)
        ``clock()`` when the silo got its instruction.
    clock : Callable[[], float] (default: time.perf_counter)
        The clock of ``started``.
    sleep : Callable[[float], None] (default: time.sleep)
        How to wait.
    """
    if cost is None:
        reported = factor * compute_time
    else:
        reported = local_steps * cost.scaled(factor).time(batch_size)
    if wait:
        left = reported - compute_time if started is None else started + reported - clock()
        if left > 0:
            sleep(left)
    return reported


@contextlib.contextmanager
def compute_slot(folder: str | os.PathLike[str] | None, *, slots: int = 1) -> Iterator[None]:
    """Hold one of ``slots`` compute slots shared by every process on this machine.

    Silos emulated on one machine would slow each other down, and the emulation would
    multiply that contention by their slowdowns k. Inside a slot a silo computes alone
    (``slots`` at a time); its emulated wait happens outside, so the waits of all silos
    overlap as on separate machines. The slots are ``flock`` locks on files
    ``slot-0 .. slot-{slots-1}`` in ``folder`` (POSIX; released by the OS if the process
    dies). ``folder`` ``None``: no slot, compute at once.

    Parameters
    ----------
    folder : str | PathLike | None
        Folder of the slot files, shared by the silos of one federation.
    slots : int (default: 1)
        Silos computing at the same time.
    """
    if folder is None:
        yield
        return
    import fcntl  # POSIX only; the slots are for several silos on one test machine

    os.makedirs(folder, exist_ok=True)
    files = [open(os.path.join(folder, f"slot-{k}"), "a+b") for k in range(slots)]  # noqa: SIM115
    try:
        held = None
        pause = 0.001
        while held is None:
            for handle in files:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = handle
                break
            else:
                if slots == 1:  # one slot: block in the kernel, no polling
                    fcntl.flock(files[0], fcntl.LOCK_EX)
                    held = files[0]
                else:
                    time.sleep(pause)
                    pause = min(2 * pause, 0.01)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    finally:
        for handle in files:
            handle.close()


class OutOfMemoryError(MemoryError):
    """A cost-model worker was asked for a batch above its memory cap x_max."""


class CostModel(BaseModel):
    """Emulated batch time of a GPU-like worker: ``t(x) = max(C, m * max(x, k) + b)``.

    The shape of the paper's Fig. 4: flat while the device is not saturated (up to the
    knee k, or below the floor C), a linear cost beyond, and an out-of-memory error above
    ``x_max``. Alg. 2 and the linear allocator can be tested and demonstrated with it on a
    CPU-only machine. The knee and the floor are two ways of saying the same (a floor C is
    the knee ``(C - b) / m``).

    Parameters
    ----------
    per_sample : float
        m, seconds per sample once saturated.
    fixed : float (default: 0.0)
        b, seconds per batch (launch overhead).
    floor : float (default: 0.0)
        C, the smallest batch time (saturation).
    max_batch_size : int | None (default: None)
        x_max; a larger batch raises :class:`OutOfMemoryError`.
    knee : int (default: 0)
        k, the batch size up to which the time is flat (a GPU that does a batch of k in the
        time of a batch of 1); 0: none.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.3.1 and Fig. 4.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_sample: float = Field(gt=0, allow_inf_nan=False)
    fixed: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    floor: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    max_batch_size: int | None = Field(default=None, gt=0)
    knee: int = Field(default=0, ge=0)

    @classmethod
    def parse(cls, text: str) -> CostModel:
        """Parse ``"m"``, ``"m,b"``, ``"m,b,C"`` or ``"m,b,C,x_max"`` (seconds, samples),
        each optionally followed by named parts ``name=value`` (``m``, ``b``, ``C``,
        ``x_max``, ``knee``), e.g. ``"0.001,0.002,knee=64"`` or
        ``"0.001,0.002,knee=64,x_max=512"``."""
        parts = [p.strip() for p in str(text).split(",")]
        names = ["per_sample", "fixed", "floor", "max_batch_size"]
        aliases = dict(zip(("m", "b", "c", "x_max"), names, strict=True))
        aliases.update({name: name for name in [*names, "knee"]})
        usage = "'m[,b[,C[,x_max]]][,knee=k]'"
        positional = [p for p in parts if "=" not in p]
        named = [p for p in parts if "=" in p]
        if (
            not 1 <= len(positional) <= 4
            or not all(parts)
            or parts[: len(positional)] != positional
        ):
            raise ValueError(f"invalid cost model {text!r}: expected {usage}")
        pairs = list(zip(names, positional, strict=False))
        for part in named:
            key, _, value = part.partition("=")
            name = aliases.get(key.strip().lower())
            if name is None:
                raise ValueError(f"invalid cost model {text!r}: unknown part {key!r} ({usage})")
            pairs.append((name, value.strip()))
        if len({name for name, _ in pairs}) != len(pairs):
            raise ValueError(f"invalid cost model {text!r}: a part is given twice ({usage})")
        try:
            values: dict[str, float | int] = {
                name: (int(p) if name in ("max_batch_size", "knee") else float(p))
                for name, p in pairs
            }
        except ValueError:
            raise ValueError(f"invalid cost model {text!r}: expected numbers {usage}") from None
        return cls(**values)  # type: ignore[arg-type]

    def scaled(self, factor: float) -> CostModel:
        """The same device ``factor`` times slower (memory cap and knee unchanged)."""
        return self.model_copy(
            update={
                "per_sample": self.per_sample * factor,
                "fixed": self.fixed * factor,
                "floor": self.floor * factor,
            }
        )

    def time(self, batch_size: int) -> float:
        """Batch time of ``batch_size`` samples; OutOfMemoryError above x_max."""
        if self.max_batch_size is not None and batch_size > self.max_batch_size:
            raise OutOfMemoryError(
                f"batch size {batch_size} exceeds this worker's memory cap {self.max_batch_size}"
            )
        return max(self.floor, self.per_sample * max(batch_size, self.knee) + self.fixed)


Speeds = tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] | None
"""A config field of relative machine capacities: finite and positive, or ``None``."""


def _checked_slowdown(text: str) -> str:
    SlowdownSchedule.parse(text)
    return text


def _checked_cost_model(text: str) -> str:
    CostModel.parse(text)
    return text


SlowdownText = Annotated[str, AfterValidator(_checked_slowdown)]
"""A config field holding a slowdown (``"4"``, ``"1:1,10:4"``), checked by
:meth:`SlowdownSchedule.parse`."""
CostModelText = Annotated[str, AfterValidator(_checked_cost_model)]
"""A config field holding a cost model ``"m,b,C,x_max"`` (``,knee=k`` optional), checked
by :meth:`CostModel.parse`."""


def slowdowns_from_speeds(
    speeds: Sequence[float] | None, count: int | None = None
) -> tuple[float, ...]:
    """Emulated slowdown factor ``max(speeds) / speed`` of each machine (1 for the
    fastest); ``speeds`` ``None``: ``count`` machines of this one's speed.

    Raises
    ------
    ValueError
        A speed that is not a finite positive number, or ``None`` without ``count``.
    """
    if speeds is None:
        if count is None:
            raise ValueError("count is needed when no speeds are given")
        return (1.0,) * count
    if not speeds or any(not (0 < s < float("inf")) for s in speeds):
        raise ValueError(f"speeds must be finite positive numbers, got {list(speeds)}")
    fastest = max(speeds)
    return tuple(fastest / s for s in speeds)
