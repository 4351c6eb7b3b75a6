"""The settings FL runs (:class:`~fl_lbbsp.runs.fl.SimulationConfig`) and cluster runs
(:class:`~fl_lbbsp.runs.cluster.ClusterConfig`) share, validated once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..clients.emulation import CostModelText, Speeds, check_speeds, slowdowns_from_speeds
from ..core.estimators import ESTIMATORS, make_estimator
from ..datasets import SourceSpec
from ..models import ModelName

__all__ = ["RunSettings", "check_estimator_name", "check_estimator_options"]


def check_estimator_name(name: str) -> str:
    """A config's speed estimator: one of :data:`~fl_lbbsp.core.estimators.ESTIMATORS`."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; expected one of {list(ESTIMATORS)}")
    return name


def check_estimator_options(name: str, alpha: float, options: dict[str, Any]) -> None:
    """Refuse, before any round, estimator options the estimator would refuse."""
    try:
        make_estimator(name, alpha=alpha, options=options)
    except TypeError as err:  # an option the estimator does not have
        raise ValueError(f"estimator_options {options}: {err}") from None
    except ValueError as err:
        raise ValueError(f"estimator_options {options}: {err}") from None


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
        ``embedded``, ``mnist:PATH``, ``cifar10:PATH`` or ``hf:PATH``.
    batch_size : int (default: 32)
        B_init, every machine's batch size before the first reports.
    lr : float (default: 0.05)
        Learning rate eta.
    model : {"lenet5", "mlp"} (default: "lenet5")
        The model.
    seed : int (default: 0)
        Seed of the data split, model init and sampling (>= 0).
    estimator, alpha, allocator :
        Balancer settings: ``estimator`` is any name in
        :data:`fl_lbbsp.core.estimators.ESTIMATORS`, ``alpha`` its smoothing.
    estimator_options : dict (default: {})
        Extra arguments of the estimator (NARX ``warmup``, ``train_every``, ...).
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
    estimator: str = "ema"
    alpha: float = Field(default=0.2, gt=0, le=1)
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    allocator: Literal["linear", "proportional", "iterative"] = "linear"
    cost_model: CostModelText | None = None
    parallel: int = Field(default=1, gt=0, strict=True)
    out: Path = Path("runs")
    encrypt: Path | None = None
    checkpoint_dir: Path | None = None

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, value: str) -> str:
        return check_estimator_name(value)

    @model_validator(mode="after")
    def _shared_checks(self) -> RunSettings:
        check_estimator_options(self.estimator, self.alpha, self.estimator_options)
        check_speeds(self.speeds, self.size, self.unit)
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
        """The strategy keywords every run sets alike: B_init, eta, the balancer, the
        telemetry and checkpoint paths, and every machine in every round."""
        return {
            "initial_batch_size": self.batch_size,
            "lr": self.lr,
            "estimator": self.estimator,
            "alpha": self.alpha,
            "estimator_options": dict(self.estimator_options),
            "allocator": self.allocator,
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
