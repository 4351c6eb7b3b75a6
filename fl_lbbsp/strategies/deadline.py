"""Reply collection under the round's deadline, at a chosen polling interval.

The deadline itself is decided in the core (:mod:`fl_lbbsp.core.round.deadline`). Flower's
gRPC/HTTP Grid polls the SuperLink for replies every 3 s inside ``send_and_receive``,
which rounds every deployed round up to the next multiple of 3 s.
:class:`DeadlineGrid` wraps any Grid and collects replies with ``push_messages`` /
``pull_messages`` at ``poll_interval`` instead, under the round's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

if TYPE_CHECKING:
    # Flower's Grid interface is typed with these two and re-exports neither; this module,
    # the one that implements that interface, names them for the type checker only.
    from flwr.proto.node_pb2 import NodeInfo
    from flwr.supercore.run import Run

__all__ = ["DeadlineGrid"]


_FIRST_PAUSE = 0.002
"""Seconds between pulls right after a push or a reply; doubled while none comes."""


class DeadlineGrid(Grid):
    """A Grid that waits for replies until the strategy's deadline, polling finely.

    Every call is passed to the wrapped grid except ``send_and_receive``: it pushes the
    messages, then pulls replies until all arrived or the deadline given by
    ``timeout_fn`` passed, at pauses from 2 ms up to ``poll_interval`` (``None``: the
    wrapped grid's own ``send_and_receive``, with that deadline).

    Parameters
    ----------
    grid : Grid
        The grid Flower handed to the ServerApp.
    timeout_fn : Callable[[float | None], float | None]
        Gets the ``timeout`` the caller passed, returns the one to use.
    poll_interval : float | None (default: 0.1)
        Longest pause between two pulls; ``None`` uses the wrapped grid's own loop.
    clock : Callable[[], float] (default: time.monotonic)
        Seconds on the clock that times each reply from the push (:meth:`observed`);
        injected by tests.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        timeout_fn: Callable[[float | None], float | None],
        poll_interval: float | None = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if poll_interval is not None and not poll_interval > 0:
            raise ValueError(f"poll_interval must be positive or None, got {poll_interval!r}")
        self.grid = grid
        self.timeout_fn = timeout_fn
        self.poll_interval = poll_interval
        self.last_timeout: float | None = None
        self._late: dict[int, float] = {}
        self.clock = clock
        self._observed: dict[int, float] = {}

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
        self._observed = {}
        if self.poll_interval is None:
            return self.grid.send_and_receive(messages, timeout=timeout)
        return self._collect(list(messages), timeout, self.poll_interval)

    def seconds_late(self, reply: Message) -> float | None:
        """Seconds after the deadline at which ``reply``, from the last
        ``send_and_receive``, came in; ``None`` if it was on time (or not collected here)."""
        return self._late.get(id(reply))

    def observed(self, reply: Message) -> float | None:
        """Seconds from pushing the last ``send_and_receive``'s messages to pulling
        ``reply`` (the wall time its silo took, as the server saw it); ``None`` if it was
        not collected here (``poll_interval=None``)."""
        return self._observed.get(id(reply))

    def _collect(
        self, messages: list[Message], timeout: float | None, interval: float
    ) -> list[Message]:
        if not messages:
            return []
        # In the order sent (a dict, not a set): the replies a pull brings back together
        # come in that order, so a simulation adds them to the aggregate alike every run.
        pending = dict.fromkeys(mid for mid in self.grid.push_messages(messages) if mid)
        pushed = self.clock()
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        pause = min(_FIRST_PAUSE, interval) / 2
        while pending:
            got = list(self.grid.pull_messages(list(pending)))
            if end is not None and (late := time.monotonic() - end) > 0:
                self._late.update((id(reply), late) for reply in got)
            received = self.clock()
            self._observed.update((id(reply), received - pushed) for reply in got)
            replies.extend(got)
            for reply in got:
                pending.pop(reply.metadata.reply_to_message_id, None)
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
