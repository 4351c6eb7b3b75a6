"""Validation of a checkpoint's contents before a strategy obeys them.

The SHA-256 digest of a checkpoint file detects damage, not intent: whoever can write the
file can recompute it. So the manifest and the engine's state are validated here with
pydantic models before anything is restored: ranges (speeds, times, batch sizes and
counts positive and finite), shapes (history entries are ``[batch size, time]`` pairs,
the overhead is a list of seconds), the balancer's settings against the same
:class:`~fl_lbbsp.core.settings.BalancingConfig` the strategies validate their keywords
with, and the federation size against the silos the checkpoint has seen (and, when
given, the configured federation). A checkpoint that fails is refused with a
:class:`CheckpointInvalidError`, one line naming the first field that failed.

Unknown extra fields are kept (later versions may add state); the fields named here are
the ones that decide batch sizes, deadlines and allocations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..core.settings import BalancingConfig
from .checkpoint import CheckpointInvalidError

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_SILOS",
    "CheckpointInvalidError",
    "EngineState",
    "Manifest",
    "validate_checkpoint",
]

MAX_SILOS = 100_000
"""Most silos a checkpoint may describe when no federation size is configured."""
MAX_BATCH_SIZE = 10_000_000
"""Largest batch size a checkpoint may hold (a sanity bound, far above any real one)."""


class _Open(BaseModel):
    """Known fields validated, unknown ones kept."""

    model_config = ConfigDict(extra="allow")


class Manifest(_Open):
    """A checkpoint's manifest.

    Parameters
    ----------
    format : int
        Layout version (checked against the reader's by ``check_compatible``).
    round : int
        The last finished round, >= 1.
    strategy : str
        Class name of the strategy that wrote it.
    scheme : str
        The strategy's scheme.
    settings : dict (default: {})
        Settings groups; ``balancing`` is validated as a :class:`BalancingConfig`.
    """

    format: int = Field(ge=1, strict=True)
    round: int = Field(ge=1, le=10_000_000, strict=True)
    strategy: str
    scheme: str
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("settings")
    @classmethod
    def _balancing(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "balancing" in value:
            BalancingConfig.model_validate(value["balancing"])
        return value


class EstimatorState(_Open):
    """A silo's speed estimator: its name and the current speed (samples per second)."""

    name: str
    value: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class LastReport(_Open):
    """The last report the balancer took from a silo."""

    batch_size: int = Field(ge=0, le=MAX_BATCH_SIZE)
    train_time: float = Field(ge=0, allow_inf_nan=False)
    samples: float = Field(default=0, ge=0, allow_inf_nan=False)


class SiloState(_Open):
    """One silo's balancer state."""

    estimator: EstimatorState
    history: list[tuple[int, float]] = Field(default_factory=list, max_length=100_000)
    max_batch_size: int | None = Field(default=None, gt=0, le=MAX_BATCH_SIZE)
    steps: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    fixed_time: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    last: LastReport | None = None
    reports: int = Field(default=0, ge=0)
    boost: float = Field(default=1.0, gt=0, allow_inf_nan=False)

    @field_validator("history")
    @classmethod
    def _pairs(cls, value: list[tuple[int, float]]) -> list[tuple[int, float]]:
        for i, (batch, seconds) in enumerate(value):
            if not 0 < batch <= MAX_BATCH_SIZE:
                raise ValueError(f"entry {i}: batch size {batch} out of (0, {MAX_BATCH_SIZE}]")
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"entry {i}: time {seconds} is not a finite number >= 0")
        return value


class BalancerState(_Open):
    """The balancer's state: its settings and every silo's."""

    config: dict[str, Any]
    silos: dict[str, SiloState] = Field(default_factory=dict, max_length=MAX_SILOS)

    @field_validator("config")
    @classmethod
    def _config(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The settings the strategies validate their keywords with; the balancer's own
        # keys that are not settings (history, min_fit_spread) are checked here.
        known = {k: v for k, v in value.items() if k in BalancingConfig.model_fields}
        BalancingConfig.model_validate({"local_steps": 1, "lr": 1.0, **known})
        _Bounds.model_validate(value)
        return value


class _Bounds(_Open):
    history: int = Field(default=20, ge=1, le=100_000)
    min_fit_spread: float = Field(default=0.1, ge=0, allow_inf_nan=False)


def _finite_seconds(value: list[float]) -> list[float]:
    for i, seconds in enumerate(value):
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"entry {i}: {seconds} is not a finite number of seconds >= 0")
    return value


class ClaimsState(_Open):
    """The claim checker's state (:mod:`fl_lbbsp.core.claims`) in a checkpoint.

    Parameters
    ----------
    sizes : dict of str to int (default: {})
        Silo id -> its pinned dataset size (a positive integer).
    distrusted : list of str (default: [])
        Silos timed by the server since they were caught lying.
    contradicted : dict of str to int (default: {})
        Silo -> consecutive rounds its claimed time was contradicted (not yet distrusted).
    overhead : list of float (default: [])
        The learned messaging overhead of recent rounds, seconds (finite, >= 0).
    """

    sizes: dict[str, Annotated[int, Field(gt=0, strict=True)]] = Field(
        default_factory=dict, max_length=MAX_SILOS
    )
    distrusted: list[str] = Field(default_factory=list, max_length=MAX_SILOS)
    contradicted: dict[str, Annotated[int, Field(ge=0, strict=True)]] = Field(
        default_factory=dict, max_length=MAX_SILOS
    )
    overhead: list[float] = Field(default_factory=list, max_length=100_000)

    @field_validator("overhead")
    @classmethod
    def _seconds(cls, value: list[float]) -> list[float]:
        return _finite_seconds(value)


class EngineState(_Open):
    """The round engine's state in a checkpoint.

    Parameters
    ----------
    balancer : BalancerState
        Required: a checkpoint without it cannot be resumed.
    silo_of_node : dict of str to str (default: {})
        Flower node id (decimal) -> silo id.
    overhead : list of float (default: [])
        Measured messaging overhead, seconds (finite, >= 0).
    federation_size : int (default: 0)
        The most silos seen in a round; at most the silos the checkpoint knows.
    claims : ClaimsState (default: empty)
        The bounds on the silos' claims (pinned dataset sizes, distrusted silos).
    """

    balancer: BalancerState
    silo_of_node: dict[str, str] = Field(default_factory=dict, max_length=MAX_SILOS)
    overhead: list[float] = Field(default_factory=list, max_length=100_000)
    federation_size: int = Field(default=0, ge=0, le=MAX_SILOS, strict=True)
    claims: ClaimsState = Field(default_factory=ClaimsState)

    @field_validator("silo_of_node")
    @classmethod
    def _node_ids(cls, value: dict[str, str]) -> dict[str, str]:
        for node in value:
            if not node.isdigit():
                raise ValueError(f"node id {node!r} is not a non-negative integer")
        return value

    @field_validator("overhead")
    @classmethod
    def _seconds(cls, value: list[float]) -> list[float]:
        return _finite_seconds(value)

    @model_validator(mode="after")
    def _size(self) -> EngineState:
        seen = len(set(self.balancer.silos) | set(self.silo_of_node.values()))
        if self.federation_size > seen:
            raise ValueError(
                f"federation_size={self.federation_size} exceeds the {seen} silos this "
                "checkpoint has seen"
            )
        return self


def _field(error: Mapping[str, Any], prefix: str) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    # a model-level check (federation size) names its field in the message
    if not loc and "federation_size" in str(error.get("msg", "")):
        loc = ["federation_size"]
    return ".".join([prefix, *loc])


def _refuse(where: str, err: ValidationError, prefix: str) -> CheckpointInvalidError:
    first = err.errors()[0]
    name = _field(first, prefix)
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    text = " ".join(f"{where}: invalid field {name}: {msg}{more}".split())
    return CheckpointInvalidError(text, field=name)


def validate_checkpoint(
    manifest: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    where: str = "checkpoint",
    max_silos: int | None = None,
) -> None:
    """Validate a checkpoint's manifest and state; raise on the first bad field.

    Parameters
    ----------
    manifest : Mapping
        The checkpoint's manifest (format, round, strategy, scheme, settings).
    state : Mapping
        The strategy's JSON state; its engine part (``balancer``, ``silo_of_node``,
        ``overhead``, ``federation_size``) is validated.
    where : str (default: "checkpoint")
        How the checkpoint is named in the message (its path).
    max_silos : int | None (default: None)
        The configured federation size (a registry, the silos of a deployment): a
        checkpoint that knows more silos, or a larger federation, is refused.
        ``None``: only the silos the checkpoint has seen bound its federation size.

    Raises
    ------
    CheckpointInvalidError
        One line: ``<where>: invalid field <dotted.name>: <reason>``.
    """
    try:
        Manifest.model_validate(dict(manifest))
    except ValidationError as err:
        raise _refuse(where, err, "manifest") from None
    try:
        engine = EngineState.model_validate(dict(state))
    except ValidationError as err:
        raise _refuse(where, err, "state") from None
    if max_silos is not None:
        silos = len(set(engine.balancer.silos) | set(engine.silo_of_node.values()))
        for name, value in (("federation_size", engine.federation_size), ("silos", silos)):
            if value > max_silos:
                raise CheckpointInvalidError(
                    f"{where}: invalid field state.{name}: {value} silos, but the "
                    f"federation has {max_silos}",
                    field=f"state.{name}",
                )
