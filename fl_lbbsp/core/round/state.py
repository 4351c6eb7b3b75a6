"""One LB-BSP round as data: what each silo is told, what came back, what was decided.

The round engine (:mod:`fl_lbbsp.core.round.engine`) fills a :class:`RoundState` from
``plan`` to ``close``; the Flower adapters read it (instructions to send, reports to log).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ...contract import RecordKeys
from ..balancer import SiloReport

__all__ = [
    "Instruction",
    "Node",
    "Reply",
    "RoundState",
    "Verdict",
    "natural_key",
    "silo_round_time",
]

U = TypeVar("U")

Node = int | str
"""A node id (Message API) or a client's cid (legacy API)."""


def natural_key(silo: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key for silo ids in natural order: ``2`` before ``10``, ``silo-2`` before
    ``silo-10`` (digit runs compare as numbers, the rest as text)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", silo)
        if part
    )


def silo_round_time(record: Mapping[str, Any], keys: RecordKeys) -> float:
    """A silo's reported round: ``train-time`` plus ``he-time`` (encrypted mode) if any."""
    return float(record[keys.train_time]) + float(record.get(keys.he_time, 0.0))


@dataclass(frozen=True)
class Instruction:
    """What one silo is told to do in one round.

    Parameters
    ----------
    silo : str
        The silo's stable id.
    batch_size : int
        The batch size it trains with (and must report back).
    local_steps : int
        Its local steps tau.
    lr : float
        Its learning rate eta.
    share : int
        Its share of the round's total X in batch-size units (the balancer's units); the
        batch size itself unless a rewriter moved the share into tau or eta.
    batch_offset : int | None (default: None)
        Cluster mode: where its samples start in the round's global batch.
    """

    silo: str
    batch_size: int
    local_steps: int
    lr: float
    share: int
    batch_offset: int | None = None


@dataclass(frozen=True)
class Reply:
    """What the engine needs to know of one train reply, as the adapter read it.

    Parameters
    ----------
    node : int
        The node it came from.
    silo : object (default: None)
        The silo id it claims, as sent; ``None``: it claims none (its node's known id).
    error : str | None (default: None)
        An error reply's reason.
    metrics : Mapping[str, Any] | None (default: None)
        Its metrics (the contract's MetricRecord).
    nbytes : int (default: 0)
        Its size in bytes.
    stale : bool (default: False)
        It answers no train message of this round.
    seconds_late : float | None (default: None)
        How long after the deadline it came in; ``None``: in time.
    problem : str | None (default: None)
        What the adapter found wrong with its records (e.g. two ArrayRecords).
    payload : object (default: None)
        The update as received, for the adapter's parser.
    signature : object (default: None)
        The silo's signature it carries (``None``: unsigned).
    signed_arrays : callable | None (default: None)
        Gives its update's arrays in order as (name, bytes), for the signature check.
    """

    node: Node
    silo: object = None
    error: str | None = None
    metrics: Mapping[str, Any] | None = None
    nbytes: int = 0
    stale: bool = False
    seconds_late: float | None = None
    problem: str | None = None
    payload: Any = None
    signature: object = None
    signed_arrays: Callable[[], Iterable[tuple[str, bytes]]] | None = None


@dataclass(frozen=True)
class Verdict(Generic[U]):
    """The outcome of screening one reply: accepted with its update, or rejected."""

    node: Node
    silo: str
    update: U | None = None
    reason: str | None = None

    @property
    def accepted(self) -> bool:
        """Whether the reply passed every check."""
        return self.reason is None


@dataclass
class RoundState:
    """Everything about the round in flight, in one place.

    Parameters
    ----------
    server_round : int
        The round.
    instructions : dict[int, Instruction]
        Node -> what it was told.
    total : int
        X, the round's total batch size.
    deadline : float | None
        Seconds the round may take (``None``: no limit).
    started : float (default: now)
        ``time.perf_counter()`` (or the adapter's clock) when the round was planned.
    sent_at : float (default: now)
        ``time.time()`` when the round was planned.
    expected_bytes : int (default: 0)
        The size of the update a reply is expected to carry (for the size cap).
    waited : float | None (default: None)
        The timeout the grid actually waited, when the adapter knows it.
    sent : list (default: [])
        The adapter's own outgoing messages (a reply must answer one of them).
    model : object (default: None)
        The global model as sent (kept when the round ends without a new one).
    run_id : int (default: 0)
        The Flower run, as the silos' signatures must name it.

    ``nodes``, ``silos``, ``reports`` and ``rejected`` fill up as replies are screened;
    ``held`` keeps the timings the engine judges only when the round closes (the first
    observed round's, see :meth:`RoundEngine.report`); ``feed`` the usable reports, fed
    to the balancer together when the round closes.
    """

    server_round: int
    instructions: dict[Node, Instruction]
    total: int
    deadline: float | None
    started: float = field(default_factory=time.perf_counter)
    sent_at: float = field(default_factory=time.time)
    expected_bytes: int = 0
    waited: float | None = None
    sent: list[Any] = field(default_factory=list)
    model: Any = None
    run_id: int = 0
    nodes: set[Node] = field(default_factory=set)
    silos: set[str] = field(default_factory=set)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    held: dict[str, tuple[Mapping[str, Any], dict[str, Any], int | None, float]] = field(
        default_factory=dict
    )
    feed: dict[str, tuple[SiloReport, dict[str, Any]]] = field(default_factory=dict)
    predicted: float | None = None
    """Predicted compute seconds of the planned split (the slowest silo's)."""
    ideal: float | None = None
    """Compute seconds of a perfect split of X by the predicted speeds (tau * X / sum v)."""
    slow: set[str] = field(default_factory=set)
    """Silos the split could not bring to the others' pace (:meth:`RoundEngine.plan`):
    the round's deadline does not wait for them."""
    cold: set[str] = field(default_factory=set)
    """Silos whose report this round is their first (or first since they rejoined on
    another node): it holds start-up, so it neither teaches the overhead nor stays in the
    silo's history once a warm report follows."""
    queued: bool = False
    """Whether the round's silos queued for compute (a pool of fewer workers than silos):
    the server's waits then hold the queue, so the round teaches no transfer time."""

    @property
    def shares(self) -> dict[str, int]:
        """Silo -> its share of X this round."""
        return {ins.silo: ins.share for ins in self.instructions.values()}
