"""Validation of a checkpoint's contents before a strategy obeys them.

The SHA-256 digest of a checkpoint file detects damage, not intent: whoever can write the
file can recompute it (a checkpoint key, ``--checkpoint-key``, detects edits; see
:mod:`fl_lbbsp.strategies.checkpoint`). So every field of the manifest and of the
strategy's state is validated here before anything is restored, in three layers:

- **Types and ranges** (pydantic models; the balancer's in
  :mod:`fl_lbbsp.strategies.checkpoint_balancer`): speeds, times, batch sizes and counts
  finite and in range; history entries ``[batch size, time]``; the cost fits (positive slope,
  non-negative intercept, a weight in [0, 1], an ordered spread); the pooled shape; the
  pending reports; the iterative allocator (phase, sizes, times); a silo's ``boost``
  within the balancer's ``max_change_ratio ** 2`` (what the balancer can set); silo ids
  of :data:`~fl_lbbsp.security.identity.SILO_ID_PATTERN`; the balancer's settings against
  the same :class:`~fl_lbbsp.core.settings.BalancingConfig` the strategies validate
  their keywords with, and no setting the balancer does not know.
- **The strategy's bounds** (:class:`CheckpointLimits`, given by the resuming strategy):
  the federation size, pinned dataset sizes under ``max_dataset_size``, the messaging
  overhead under the longest round the server waits (``deadline_ceiling``: no overhead
  above it can have been observed), times under what a claim can be
  (``max_claimed_time``).
- **A trial**: the balancer is rebuilt from the state and asked for one allocation of its
  silos, so that a state the types admit but the balancer cannot use is refused here,
  before round 1, not in the middle of a run.

A checkpoint that fails is refused with a :class:`CheckpointInvalidError`, one line naming
the first field that failed. Unknown extra fields are kept (later versions may add state).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..core.balancer import BatchSizeBalancer
from ..core.settings import BalancingConfig
from .checkpoint_balancer import (
    MAX_BATCH_SIZE,
    MAX_ENTRIES,
    MAX_SILOS,
    BalancerState,
    Batch,
    Count,
    NodeId,
    OpenRecord,
    Positive,
    Seconds,
    SiloId,
)

__all__ = [
    "CheckpointError",
    "CheckpointInvalidError",
    "CheckpointLimits",
    "EngineState",
    "Manifest",
    "validate_checkpoint",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or resumed by this strategy."""


class CheckpointInvalidError(CheckpointError):
    """A readable checkpoint whose contents fail validation (an edited file whose digest
    was recomputed, or a bug): one line naming the field, e.g.
    ``<path>: invalid field state.balancer.silos.w1.estimator.value: ...``.

    Parameters
    ----------
    message : str
        The one-line message.
    field : str
        Dotted name of the field that failed (``state.federation_size``, ...).
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field

    @classmethod
    def caught(cls, err: Exception, *, where: str, field: str, what: str) -> CheckpointInvalidError:
        """The refusal of ``field`` for the exception ``err`` its use raised:
        ``<where>: invalid field <field>: <what> (<type>: <message>)``, the message on
        one line and at most 300 characters."""
        message = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        return cls(f"{where}: invalid field {field}: {what} ({message})", field=field)


@dataclass(frozen=True)
class CheckpointLimits:
    """The resuming strategy's bounds on a checkpoint (``None``: not bounded).

    Parameters
    ----------
    max_silos : int | None (default: None)
        The configured federation size (a registry, the silos of a run): a checkpoint
        that knows more silos, or a larger federation, is refused.
    max_dataset_size : int | None (default: None)
        Largest pinned dataset size (the strategy's ``max_dataset_size``).
    max_overhead : float | None (default: None)
        Largest messaging overhead in seconds (the strategy's ``deadline_ceiling``).
    max_seconds : float | None (default: None)
        Largest time in the balancer's state (twice the strategy's ``max_claimed_time``:
        a train time and an encryption time, each clipped to it).
    """

    max_silos: int | None = None
    max_dataset_size: int | None = None
    max_overhead: float | None = None
    max_seconds: float | None = None


class Manifest(OpenRecord):
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
    strategy: str = Field(max_length=200)
    scheme: str = Field(max_length=200)
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("settings")
    @classmethod
    def _balancing(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "balancing" in value:
            BalancingConfig.model_validate(value["balancing"])
        return value


class ClaimsState(OpenRecord):
    """The claim checker's state (:mod:`fl_lbbsp.security.claims`) in a checkpoint.

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

    sizes: dict[SiloId, Annotated[int, Field(gt=0, le=2**53, strict=True)]] = Field(
        default_factory=dict, max_length=MAX_SILOS
    )
    distrusted: list[SiloId] = Field(default_factory=list, max_length=MAX_SILOS)
    contradicted: dict[SiloId, Count] = Field(default_factory=dict, max_length=MAX_SILOS)
    overhead: list[Seconds] = Field(default_factory=list, max_length=MAX_ENTRIES)


class MemoryState(OpenRecord):
    """The caps learned from silos that ran out of memory
    (:class:`~fl_lbbsp.core.round.memory_caps.MemoryCaps`) in a checkpoint.

    Parameters
    ----------
    caps : dict of str to int (default: {})
        Silo id -> its learned cap (a batch size).
    completed : dict of str to int (default: {})
        Silo id -> the largest batch size it completed a round with.
    """

    caps: dict[SiloId, Batch] = Field(default_factory=dict, max_length=MAX_SILOS)
    completed: dict[SiloId, Batch] = Field(default_factory=dict, max_length=MAX_SILOS)


class EngineState(OpenRecord):
    """The strategy's state in a checkpoint: the round engine's and its updates'.

    Parameters
    ----------
    balancer : BalancerState
        Required: a checkpoint without it cannot be resumed.
    silo_of_node : dict of str to str
        Flower node id (decimal) -> silo id.
    overhead : list of float
        Measured messaging overhead, seconds (finite, >= 0).
    federation_size : int (default: 0)
        The most silos seen in a round; at most the silos the checkpoint knows.
    claims : ClaimsState (default: empty)
        The bounds on the silos' claims (pinned dataset sizes, distrusted silos).
    memory : MemoryState (default: empty)
        The caps learned from silos that ran out of memory.
    num_examples : dict of str to float | None (default: None)
        Encrypted strategies: each silo's last dataset size (positive, finite).
    version : int | None (default: None)
        Encrypted parameter server: the model version.
    node_version : dict of str to int | None (default: None)
        Encrypted parameter server: node -> the model version it holds, at most
        ``version``.
    """

    balancer: BalancerState
    silo_of_node: dict[NodeId, SiloId] = Field(max_length=MAX_SILOS)
    overhead: list[Seconds] = Field(max_length=MAX_ENTRIES)
    federation_size: int = Field(default=0, ge=0, le=MAX_SILOS, strict=True)
    claims: ClaimsState = Field(default_factory=ClaimsState)
    memory: MemoryState = Field(default_factory=MemoryState)
    num_examples: dict[SiloId, Positive] | None = Field(default=None, max_length=MAX_SILOS)
    version: Count | None = None
    node_version: dict[NodeId, Count] | None = Field(default=None, max_length=MAX_SILOS)

    @model_validator(mode="after")
    def _consistent(self) -> EngineState:
        seen = len(set(self.balancer.silos) | set(self.silo_of_node.values()))
        if self.federation_size > seen:
            raise ValueError(
                f"federation_size={self.federation_size} exceeds the {seen} silos this "
                "checkpoint has seen"
            )
        if self.node_version is not None:
            ahead = [n for n, v in self.node_version.items() if v > (self.version or 0)]
            if ahead:
                raise ValueError(f"node_version of node {ahead[0]} is ahead of the version")
        return self


def _field(error: Mapping[str, Any], prefix: str) -> str:
    loc = [str(part)[:40] for part in error.get("loc", ())]
    msg = str(error.get("msg", ""))
    # a model-level check names its field in the message
    if not loc:
        for name in ("federation_size", "node_version"):
            if name in msg:
                loc = [name]
    if loc == ["balancer"] and "boost" in msg:
        loc.append("silos")
    return ".".join([prefix, *loc])


def _refuse(where: str, err: ValidationError, prefix: str) -> CheckpointInvalidError:
    first = err.errors()[0]
    name = _field(first, prefix)
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")[:300]
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    text = " ".join(f"{where}: invalid field {name}: {msg}{more}".split())
    return CheckpointInvalidError(text, field=name)


def _over(where: str, name: str, value: float, limit: float, what: str) -> None:
    if value > limit:
        raise CheckpointInvalidError(
            f"{where}: invalid field state.{name}: {value:.6g} is over {limit:.6g} ({what})",
            field=f"state.{name}",
        )


def _check_limits(engine: EngineState, limits: CheckpointLimits, where: str) -> None:
    """The strategy's bounds (see :class:`CheckpointLimits`)."""
    if limits.max_silos is not None:
        silos = len(set(engine.balancer.silos) | set(engine.silo_of_node.values()))
        for name, value in (("federation_size", engine.federation_size), ("silos", silos)):
            if value > limits.max_silos:
                raise CheckpointInvalidError(
                    f"{where}: invalid field state.{name}: {value} silos, but the "
                    f"federation has {limits.max_silos}",
                    field=f"state.{name}",
                )
    if limits.max_dataset_size is not None:
        cap, what = limits.max_dataset_size, "this strategy's max_dataset_size"
        for silo, size in engine.claims.sizes.items():
            _over(where, f"claims.sizes.{silo}", size, cap, what)
        for silo, number in (engine.num_examples or {}).items():
            _over(where, f"num_examples.{silo}", number, cap, what)
    if limits.max_overhead is not None:
        what = "this strategy's deadline_ceiling: no longer overhead can be observed"
        for name, seen in (
            ("overhead", engine.overhead),
            ("claims.overhead", engine.claims.overhead),
        ):
            for seconds in seen:
                _over(where, name, seconds, limits.max_overhead, what)
    if limits.max_seconds is not None:
        what = "twice this strategy's max_claimed_time"
        for silo, state in engine.balancer.silos.items():
            times = [t for _, t in state.history] + [p[1] for p in state.pending]
            times += [state.fixed_time or 0.0, state.last.train_time if state.last else 0.0]
            for seconds in times:
                _over(where, f"balancer.silos.{silo}", seconds, limits.max_seconds, what)


def _trial(balancer: Mapping[str, Any], where: str) -> None:
    """Rebuild the balancer and ask it for one allocation; any failure refuses the
    checkpoint (a state the types admit that the balancer cannot use)."""
    try:
        trial = BatchSizeBalancer.from_state_dict(dict(balancer))
        silos = trial.silo_ids
        sizes = trial.allocate(silos)
        bad = {s: x for s, x in sizes.items() if not 1 <= x <= MAX_BATCH_SIZE}
        if bad:
            raise ValueError(f"it allocates batch sizes out of range: {bad}"[:200])
    except Exception as err:  # noqa: BLE001 - whatever the balancer cannot use is refused
        raise CheckpointInvalidError.caught(
            err, where=where, field="state.balancer", what="the balancer cannot use it"
        ) from None


def validate_checkpoint(
    manifest: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    where: str = "checkpoint",
    max_silos: int | None = None,
    limits: CheckpointLimits | None = None,
) -> None:
    """Validate a checkpoint's manifest and state; raise on the first bad field.

    Parameters
    ----------
    manifest : Mapping
        The checkpoint's manifest (format, round, strategy, scheme, settings).
    state : Mapping
        The strategy's JSON state (engine and updates).
    where : str (default: "checkpoint")
        How the checkpoint is named in the message (its path).
    max_silos : int | None (default: None)
        The configured federation size; overrides ``limits.max_silos`` when given.
    limits : CheckpointLimits | None (default: None)
        The resuming strategy's bounds; ``None``: only the silos the checkpoint has seen
        bound its federation size.

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
    limits = limits or CheckpointLimits()
    if max_silos is not None:
        limits = replace(limits, max_silos=max_silos)
    _check_limits(engine, limits, where)
    _trial(state["balancer"], where)
