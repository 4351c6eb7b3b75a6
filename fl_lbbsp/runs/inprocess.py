"""A Flower Grid that runs a ClientApp in this process: strategies without Ray or a network.

Every message and every reply is serialised to Flower's protobuf and read back, as it would
be on the wire, so what a silo receives shares no object with the server and the bytes each
way can be counted. Nodes run one after the other. Meant for tests, benchmarks and
debugging; simulations and deployments use Flower's own runtimes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import GRPC_MAX_MESSAGE_LENGTH
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from ..security.reply_screen import default_reply_cap
from ..strategies.validation import reply_nbytes

__all__ = ["InProcessGrid", "Transfer", "run_in_process"]

_SERVER_NODE_ID = 1


@dataclass
class Transfer:
    """Bytes and seconds of one message and its reply."""

    node_id: int
    message_type: str
    sent_bytes: int
    reply_bytes: int
    seconds: float
    error: str | None = None


class InProcessGrid(Grid):
    """Run a ClientApp for ``num_nodes`` nodes inside this process.

    Parameters
    ----------
    client_app : ClientApp
        The silos' app.
    num_nodes : int
        Number of nodes; node ``i`` gets ``node_config["partition-id"] = i``.
    node_configs : sequence of mapping | None (default: None)
        Extra node_config entries per node (``silo-id``, ``slowdown``, ...).
    run_config : mapping | None (default: None)
        The run config every node sees.
    first_node_id : int (default: 100)
        Node ids are ``first_node_id + i``.
    max_reply_bytes : int | None (default: None)
        Largest reply passed on; a larger one becomes an error reply before it is
        serialised, as a SuperLink refuses it on the wire. ``None``: the strategies'
        default cap (four times the arrays the message carried plus 1 MiB), or gRPC's
        message limit for a message without arrays.

    Faults: :meth:`crash` makes a node die in the middle of its next message (no reply,
    then offline), :meth:`disconnect` takes it offline at once, :meth:`reconnect` brings it
    back. An exception in the ClientApp becomes an error reply, as in Flower.

    Notes
    -----
    Flower needs a task identity to build messages outside a run; it is set to this
    grid's run when none is set yet.
    """

    def __init__(
        self,
        client_app: ClientApp,
        *,
        num_nodes: int,
        node_configs: Sequence[Mapping[str, bool | float | int | str]] | None = None,
        run_config: Mapping[str, bool | float | int | str] | None = None,
        first_node_id: int = 100,
        max_reply_bytes: int | None = None,
    ) -> None:
        if num_nodes <= 0:
            raise ValueError(f"num_nodes must be positive, got {num_nodes!r}")
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(f"{len(node_configs)} node_configs for {num_nodes} nodes")
        if max_reply_bytes is not None and max_reply_bytes <= 0:
            raise ValueError(f"max_reply_bytes must be positive, got {max_reply_bytes!r}")
        self.client_app = client_app
        self.max_reply_bytes = max_reply_bytes
        self._run = Run.create_empty(run_id=1)
        self._contexts = {
            first_node_id + i: Context(
                run_id=1,
                node_id=first_node_id + i,
                node_config={
                    "partition-id": i,
                    "num-partitions": num_nodes,
                    **(dict(node_configs[i]) if node_configs else {}),
                },
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        self._replies: dict[str, Message] = {}
        self._offline: set[int] = set()
        self._crashing: set[int] = set()
        self.transfers: list[Transfer] = []
        """One entry per message handled, in order."""
        if TaskIdentity._run_id is None:
            TaskIdentity.run_id, TaskIdentity.task_id = 1, 1
            TaskIdentity.node_id = _SERVER_NODE_ID

    def set_run(self, run: Run) -> None:
        """Set the run this grid operates in."""
        self._run = run

    @property
    def run(self) -> Run:
        """Run information."""
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """A new instruction message."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Ids of the in-process nodes that are online."""
        return [node for node in self._contexts if node not in self._offline]

    # Faults --------------------------------------------------------------------
    def disconnect(self, node_id: int) -> None:
        """Take a node offline now: it is no longer listed, and messages to it are lost."""
        self._check_node(node_id)
        self._offline.add(node_id)

    def crash(self, node_id: int) -> None:
        """Make a node die in the middle of its next message: it receives the message,
        its ClientApp runs, and then it goes offline without replying."""
        self._check_node(node_id)
        self._crashing.add(node_id)

    def reconnect(self, node_id: int) -> None:
        """Bring a node back online under the same node id, its context (state) intact."""
        self._check_node(node_id)
        self._offline.discard(node_id)
        self._crashing.discard(node_id)

    def _check_node(self, node_id: int) -> None:
        if node_id not in self._contexts:
            raise ValueError(f"no node {node_id} in this grid")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp right away and keep the reply
        (none from a node that is offline or crashes)."""
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` (each returned once)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Deliver every message and return the replies (``timeout`` is not needed)."""
        return list(self.pull_messages(self.push_messages(messages)))

    def _deliver(self, msg: Message) -> Message | None:
        node_id = msg.metadata.dst_node_id
        self._check_node(node_id)
        msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        if node_id in self._offline:
            self.transfers.append(
                Transfer(node_id, msg.metadata.message_type, 0, 0, 0.0, "lost: node offline")
            )
            return None
        content, sent = _over_the_wire(msg.content)
        # Flower's own way of rebuilding a received message with its metadata; the
        # public overloads only create new messages.
        inbound = Message(content=content, metadata=msg.metadata)  # type: ignore[call-overload]
        start = time.perf_counter()
        error = None
        try:
            reply = self.client_app(inbound, self._contexts[node_id])
        except Exception as err:  # noqa: BLE001 - a silo's crash becomes an error reply
            error = f"{type(err).__name__}: {err}"
            reply = Message(Error(code=0, reason=error), reply_to=inbound)
        seconds = time.perf_counter() - start
        if node_id in self._crashing:
            self._crashing.discard(node_id)
            self._offline.add(node_id)
            self.transfers.append(
                Transfer(node_id, msg.metadata.message_type, sent, 0, seconds, "lost: crashed")
            )
            return None
        received = 0
        cap = self._reply_cap(msg.content)
        if reply.has_content() and (size := reply_nbytes(reply.content)) > cap:
            error = f"reply of about {size} bytes is over the {cap}-byte limit of the grid"
            reply = Message(Error(code=0, reason=error), reply_to=inbound)
        elif reply.has_content():
            reply.content, received = _over_the_wire(reply.content)
        elif reply.has_error():
            error = reply.error.reason
        reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        self.transfers.append(
            Transfer(node_id, msg.metadata.message_type, sent, received, seconds, error)
        )
        return reply

    def _reply_cap(self, content: RecordDict) -> int:
        if self.max_reply_bytes is not None:
            return self.max_reply_bytes
        if any(isinstance(record, ArrayRecord) for record in content.values()):
            return default_reply_cap(reply_nbytes(content))
        return GRPC_MAX_MESSAGE_LENGTH


def _over_the_wire(content: RecordDict) -> tuple[RecordDict, int]:
    data = recorddict_to_proto(content).SerializeToString()
    return recorddict_from_proto(ProtoRecordDict.FromString(data)), len(data)


def run_in_process(server_app: ServerApp, client_app: ClientApp, *, num_nodes: int) -> None:
    """Run a ServerApp and ClientApp in this process, on an :class:`InProcessGrid` of
    ``num_nodes`` nodes: what Flower's Simulation Engine does, with the nodes one after the
    other and no engine start-up."""
    grid = InProcessGrid(client_app, num_nodes=num_nodes)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    server_app(grid, context)
