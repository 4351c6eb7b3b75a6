"""The settings FL runs (:class:`~fl_lbbsp.runs.fl.SimulationConfig`) and cluster runs
(:class:`~fl_lbbsp.runs.cluster.ClusterConfig`) share, validated once, and the bounds a
run's inputs are checked against before anything starts (speed ratios, ordered slowdown
schedules, the batch size against the data and this machine's memory)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..clients.emulation import CostModelText, Speeds, slowdowns_from_speeds
from ..core.settings import BalancingKnobs, Tuning
from ..datasets import SourceSpec
from ..models import ModelName

__all__ = [
    "MAX_SPEED_RATIO",
    "RunSettings",
    "activation_bytes",
    "batch_size_problem",
    "check_schedule_order",
    "check_speed_ratio",
    "memory_available",
    "writable_dir_problem",
]

MAX_SPEED_RATIO = 1e6
"""Largest ratio between the fastest and the slowest emulated capacity (``--speeds``): a
silo a million times slower than another waits out a million times its compute."""


def check_speed_ratio(speeds: Sequence[float] | None) -> None:
    """ValueError unless every speed is finite and positive and the fastest is at most
    :data:`MAX_SPEED_RATIO` times the slowest."""
    if not speeds:
        return
    if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in speeds):
        raise ValueError(f"speeds must be finite and positive, got {list(speeds)}"[:200])
    ratio = max(speeds) / min(speeds)
    if not ratio <= MAX_SPEED_RATIO:
        raise ValueError(
            f"speeds {max(speeds):g} and {min(speeds):g} are {ratio:.3g} times apart, over "
            f"the {MAX_SPEED_RATIO:g} the emulation allows"
        )


def check_schedule_order(text: str) -> None:
    """ValueError unless a slowdown schedule ``"ROUND:K,ROUND:K"`` lists its rounds in
    increasing order (``"5:2,3:1"`` would apply 2 from round 5 and then 1 again)."""
    if ":" not in str(text):
        return
    rounds = []
    for item in str(text).split(","):
        head = item.split(":")[0].strip()
        if head.lstrip("-").isdigit():
            rounds.append(int(head))
    if any(b <= a for a, b in zip(rounds, rounds[1:], strict=False)):
        raise ValueError(
            f"slowdown schedule {text!r:.60} lists its rounds out of order {rounds[:8]}: "
            "give them in increasing order, e.g. '1:1,10:2,20:1'"
        )


def activation_bytes(model: Any, input_shape: Sequence[int]) -> int:
    """Estimated bytes one training sample takes through ``model`` (a torch module):
    its input and every module's output in float32, three times (activations kept for
    the backward pass, their gradients, and the framework's working copies)."""
    import torch

    numel = [math.prod(input_shape)]

    def count(module: Any, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            numel.append(output.numel())

    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    finally:
        for hook in hooks:
            hook.remove()
    return 3 * 4 * sum(numel)


def memory_available() -> int:
    """Bytes of memory this machine has available now (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available)


def batch_size_problem(
    batch_size: int,
    *,
    machines: int,
    largest_dataset: int | None,
    sample_bytes: int | None,
    available: int | None,
    unit: str = "silos",
) -> str | None:
    """Why ``batch_size`` (B_init) cannot be run, or ``None``.

    Parameters
    ----------
    batch_size : int
        B_init.
    machines : int
        Silos or workers: the federation's total batch is ``machines * batch_size``, and
        the balancer may hand most of it to one of them.
    largest_dataset : int | None
        The largest machine's dataset size: a batch above it repeats every machine's
        samples within every step. ``None``: not checked.
    sample_bytes : int | None
        Estimated bytes one training sample takes (:func:`activation_bytes`).
    available : int | None
        Bytes of memory available (:func:`memory_available`); the federation's total
        batch must fit, since the machines computing at once never hold more than it.
    unit : str (default: "silos")
        What the machines are called.
    """
    if largest_dataset is not None and batch_size > largest_dataset:
        return (
            f"--batch-size {batch_size} is over every {unit[:-1]}'s dataset (the largest "
            f"holds {largest_dataset} examples): use at most {largest_dataset}"
        )
    if sample_bytes is not None and available is not None:
        need = machines * batch_size * sample_bytes
        if need > available:
            top = max(1, available // (machines * sample_bytes))
            return (
                f"--batch-size {batch_size}: the total batch of {machines} {unit} "
                f"({machines * batch_size} samples) needs about {need / 2**30:.3g} GiB for "
                f"the model's activations, over the {available / 2**30:.3g} GiB available: "
                f"use at most {top}"
            )
    return None


def writable_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (created as) a writable folder, or ``None``: it is a file,
    or its first existing ancestor is not a writable folder."""
    import os

    target = Path(path)
    if target.exists():
        if not target.is_dir():
            return f"{target} is not a directory"
        return None if os.access(target, os.W_OK | os.X_OK) else f"{target} is not writable"
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{target} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{target} cannot be created: {parent} is not writable"
    return None


_BOUND_FLAGS = {
    "initial_batch_size": "--batch-size",
    "min_batch_size": "--min-batch-size",
    "max_batch_size": "--max-batch-size",
}
"""The batch-size settings by the flags that set them."""


class RunSettings(BaseModel):
    """What every simulated run is set by: its machines, data, model, training and
    balancer settings, and where its output goes. A run's config subclasses it and adds
    its machines (``silos`` or ``workers``), its length and its own settings.

    Parameters
    ----------
    scheme : str
        The run's scheme (each config narrows it to its schemes).
    speeds : tuple of float | None (default: None)
        Emulated relative capacity of each silo or worker (e.g. 16,8,8,4,4); machine i
        runs ``max(speeds) / speeds[i]`` times slower than this one. ``None``: no
        emulation.
    dataset : str (default: "embedded")
        ``embedded``, ``mnist:PATH``, ``cifar10:PATH`` or ``hf:PATH`` (your data: a
        ``save_to_disk`` folder, a .parquet, .csv, .jsonl/.json or .arrow file, or a folder
        of such files; see docs/datasets.md).
    batch_size : int (default: 32)
        B_init, every machine's batch size before the first reports.
    lr : float (default: 0.05)
        Learning rate eta.
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model.
    seed : int (default: 0)
        Seed of the data split, model init and sampling (>= 0).
    balancing : BalancingKnobs (default: every knob's default)
        The balancer's knobs (:class:`~fl_lbbsp.core.settings.BalancingKnobs`: estimator,
        allocator, noise budget, ...), handed to the strategy as they are. They may also
        be given one by one as keywords (``estimator="last"``), which win over
        ``balancing``; ``balance`` and ``check_times`` are the run's to set.
    cost_model : str | None (default: None)
        Emulated compute cost of the fastest machine (see each config); ``None``:
        measured times.
    parallel : int (default: 1)
        Machines computing at the same time.
    out : Path
        Folder for telemetry and reports.
    encrypt : Path | None (default: None)
        Key folder from ``fl-lbbsp keys generate``: CKKS-encrypted updates, which the
        server only adds; the machines evaluate the model. ``None``: plaintext.
    checkpoint_dir : Path | None (default: None)
        Checkpoint folder: the run checkpoints every round in ``checkpoint_dir/<scheme>``
        and a rerun resumes from there. ``None``: no checkpoints.
    checkpoint_key : Path | None (default: None)
        Checkpoint key file (``fl-lbbsp keys checkpoint``): checkpoints carry an
        HMAC-SHA256 under it, so an edited one is refused. ``None``: a SHA-256 digest
        (damage is detected, edits are not).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    unit: ClassVar[str] = "machines"
    """What the run's machines are called in messages (``silos``, ``workers``)."""

    scheme: str
    speeds: Speeds = None
    dataset: SourceSpec = "embedded"
    batch_size: int = Field(default=32, gt=0, strict=True)
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    model: ModelName = "lenet5"
    seed: int = Field(default=0, ge=0)
    balancing: BalancingKnobs = Field(default_factory=BalancingKnobs)
    cost_model: CostModelText | None = None
    parallel: int = Field(default=1, gt=0, strict=True)
    out: Path = Path("runs")
    encrypt: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_key: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _knobs_as_keywords(cls, data: Any) -> Any:
        """Knobs given one by one (``alpha=0.5``) join ``balancing``, winning over it."""
        names = {*BalancingKnobs.model_fields, *Tuning.model_fields} - {"tuning"}
        if not isinstance(data, dict) or not set(data) & names:
            return data
        given = data.get("balancing")
        knobs = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
        rest = {k: v for k, v in data.items() if k not in names}
        flat = {k: v for k, v in data.items() if k in names}
        return {**rest, "balancing": {**knobs, **flat}}

    @model_validator(mode="after")
    def _shared_checks(self) -> RunSettings:
        if self.speeds is not None and len(self.speeds) != self.size:
            raise ValueError(
                f"--speeds lists {len(self.speeds)} values but there are {self.size} {self.unit}"
            )
        check_speed_ratio(self.speeds)
        if (problem := self.balancing.bounds_problem(self.batch_size)) is not None:
            for name, flag in _BOUND_FLAGS.items():  # said in the command line's words
                problem = problem.replace(name, flag)
            raise ValueError(problem)
        return self

    @property
    def size(self) -> int:
        """Number of silos or workers."""
        raise NotImplementedError

    @property
    def slowdowns(self) -> tuple[float, ...]:
        """Emulated slowdown factor of each machine (1 for the fastest), from ``speeds``."""
        return slowdowns_from_speeds(self.speeds, self.size)

    def strategy_settings(self) -> dict[str, Any]:
        """The strategy keywords every run sets alike: B_init, eta, the balancer's knobs,
        the telemetry and checkpoint paths (and key, when given), and every machine in
        every round."""
        key = {} if self.checkpoint_key is None else {"checkpoint_key": self.checkpoint_key}
        return {
            **key,
            "initial_batch_size": self.batch_size,
            "lr": self.lr,
            "balancing": self.balancing,
            "telemetry_path": self.telemetry_path(),
            "min_train_nodes": self.size,
            "min_available_nodes": self.size,
            "checkpoint_dir": self.checkpoint_path(),
        }

    def telemetry_path(self) -> Path:
        """JSON-lines telemetry file of this run."""
        return self.out / f"{self.scheme}.jsonl"

    def checkpoint_path(self) -> Path | None:
        """Checkpoint folder of this run (``None``: no checkpoints)."""
        return None if self.checkpoint_dir is None else self.checkpoint_dir / self.scheme
