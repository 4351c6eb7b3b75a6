"""Round deadlines and reply collection at a chosen polling interval.

A round's deadline is the predicted round time times a margin, clipped to
``[floor, ceiling]``. The predicted round time is the slowest silo's predicted compute
time (``B_i * tau / v_i`` from the balancer's speed predictions) plus the messaging
overhead seen in recent complete rounds (wall time minus the slowest reported compute).
Replies that miss the deadline are left out of the round; their silos keep their estimates.

Flower's gRPC/HTTP Grid polls the SuperLink for replies every 3 s inside
``send_and_receive``, which rounds every deployed round up to the next multiple of 3 s.
:class:`DeadlineGrid` wraps any Grid and collects replies with ``push_messages`` /
``pull_messages`` at ``poll_interval`` instead, under the round's deadline.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from flwr.app import Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from ..core import BatchSizeBalancer

__all__ = ["DeadlineGrid", "DeadlinePolicy", "predicted_compute_time"]


@dataclass(frozen=True)
class DeadlinePolicy:
    """How long a round may take: ``clip(margin * predicted, floor, ceiling)``.

    The strategies build it from their validated
    :class:`~fl_lbbsp.strategies.config.ServerConfig` (``deadline_margin``,
    ``deadline_floor``, ``deadline_ceiling``).

    Parameters
    ----------
    margin : float | None (default: 3.0)
        Multiple of the predicted round time granted; ``None`` switches deadlines off
        (every round waits up to the ``timeout`` given to ``start``).
    floor : float (default: 30.0)
        Shortest deadline in seconds.
    ceiling : float (default: 3600.0)
        Longest deadline in seconds; also the deadline while nothing can be predicted
        (round 1). The ``timeout`` given to ``start`` caps it too.
    overhead_rounds : int (default: 3)
        The messaging overhead is the largest seen in this many recent complete rounds.
    """

    margin: float | None = 3.0
    floor: float = 30.0
    ceiling: float = 3600.0
    overhead_rounds: int = 3

    def timeout(self, predicted: float | None, *, cap: float | None = None) -> float | None:
        """Deadline for a round predicted to take ``predicted`` seconds.

        Parameters
        ----------
        predicted : float | None
            Predicted round time; ``None`` when unknown (the ceiling applies).
        cap : float | None (default: None)
            Upper bound from the caller (``start``'s ``timeout``).

        Returns
        -------
        float | None
            Seconds to wait for replies; ``cap`` when deadlines are off.
        """
        if self.margin is None:
            return cap
        ceiling = self.ceiling if cap is None else min(self.ceiling, cap)
        if predicted is None:
            return ceiling
        return min(max(self.margin * predicted, self.floor), ceiling)


class OverheadTracker:
    """Messaging overhead of recent complete rounds (wall time minus slowest compute).

    Parameters
    ----------
    rounds : int
        How many recent observations are kept; the prediction is their maximum.
    seen : Iterable[float] (default: ())
        Observations to start from (:attr:`seen` of a checkpointed tracker).
    """

    def __init__(self, rounds: int, seen: Iterable[float] = ()) -> None:
        self._seen: deque[float] = deque((float(s) for s in seen), maxlen=rounds)

    @property
    def seen(self) -> list[float]:
        """The kept observations, oldest first."""
        return list(self._seen)

    def observe(self, wall: float, slowest_compute: float) -> None:
        """Record one complete round."""
        self._seen.append(max(0.0, wall - slowest_compute))

    def predict(self) -> float:
        """Overhead to add to the predicted compute time (0 before any observation)."""
        return max(self._seen, default=0.0)


def predicted_compute_time(
    balancer: BatchSizeBalancer, sizes: Mapping[str, int], local_steps: int
) -> float | None:
    """Slowest predicted silo time of a round: ``max_i B_i * tau / v_i + f_i``.

    ``f_i`` is the silo's smoothed fixed per-round time (``he-time`` in encrypted mode, 0
    otherwise). A silo without a speed prediction counts at the mean predicted speed of
    the others; ``None`` when no silo has one.
    """
    speeds = {silo: balancer.predicted_speed(silo) for silo in sizes}
    known = [v for v in speeds.values() if v is not None and v > 0]
    if not known:
        return None
    mean = sum(known) / len(known)
    return max(
        sizes[silo] * local_steps / (v if v is not None and v > 0 else mean)
        + (balancer.fixed_time(silo) or 0.0)
        for silo, v in speeds.items()
    )


_FIRST_PAUSE = 0.002
"""Seconds between pulls right after a push or a reply; doubled while none comes."""


class DeadlineGrid(Grid):
    """A Grid that waits for replies until the strategy's deadline, polling finely.

    Every call is passed to the wrapped grid except ``send_and_receive``: it pushes the
    messages, then pulls replies until all arrived or the deadline given by
    ``timeout_fn`` passed. It pulls 2 ms after the push and after each reply, and then at
    pauses that double up to ``poll_interval`` while none comes, so a reply is collected
    within milliseconds of arriving without a busy loop. With ``poll_interval=None`` it
    calls the wrapped grid's own ``send_and_receive`` with that deadline.

    Parameters
    ----------
    grid : Grid
        The grid Flower handed to the ServerApp.
    timeout_fn : Callable[[float | None], float | None]
        Gets the ``timeout`` the caller passed, returns the one to use.
    poll_interval : float | None (default: 0.1)
        Longest pause between two pulls; ``None`` uses the wrapped grid's own loop.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        timeout_fn: Callable[[float | None], float | None],
        poll_interval: float | None = 0.1,
    ) -> None:
        if poll_interval is not None and not poll_interval > 0:
            raise ValueError(f"poll_interval must be positive or None, got {poll_interval!r}")
        self.grid = grid
        self.timeout_fn = timeout_fn
        self.poll_interval = poll_interval
        self.last_timeout: float | None = None
        self._late: dict[int, float] = {}

    # Plain delegation ---------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Set the run on the wrapped grid."""
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        """The wrapped grid's run."""
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create a message through the wrapped grid."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Node ids of the wrapped grid."""
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        """Nodes of the wrapped grid."""
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push through the wrapped grid."""
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Pull through the wrapped grid."""
        return self.grid.pull_messages(message_ids)

    # Deadline and polling -----------------------------------------------------
    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages``; return the replies collected until the deadline.

        A reply that a pull started before the deadline brings back after it is returned
        too, and :meth:`seconds_late` says by how much it missed.
        """
        timeout = self.timeout_fn(timeout)
        self.last_timeout = timeout
        self._late = {}
        if self.poll_interval is None:
            return self.grid.send_and_receive(messages, timeout=timeout)
        return self._collect(list(messages), timeout, self.poll_interval)

    def seconds_late(self, reply: Message) -> float | None:
        """Seconds after the deadline at which ``reply``, from the last
        ``send_and_receive``, came in; ``None`` if it was on time (or not collected here)."""
        return self._late.get(id(reply))

    def _collect(
        self, messages: list[Message], timeout: float | None, interval: float
    ) -> list[Message]:
        if not messages:
            return []
        pending = {mid for mid in self.grid.push_messages(messages) if mid}
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        pause = min(_FIRST_PAUSE, interval) / 2
        while pending:
            got = list(self.grid.pull_messages(list(pending)))
            if end is not None and (late := time.monotonic() - end) > 0:
                self._late.update((id(reply), late) for reply in got)
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending:
                break
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            # Short pauses right after a push or a reply (replies come in bursts), growing
            # to the interval while nothing comes: a reply waits little, an idle round
            # costs few pulls.
            pause = min(_FIRST_PAUSE, interval) if got else min(2 * pause, interval)
            time.sleep(pause if left is None else min(pause, left))
        return replies
