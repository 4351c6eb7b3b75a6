"""A rate-limited link between one silo and the SuperLink: a TCP proxy on 127.0.0.1.

``fl-lbbsp deploy-local --link-mbps 100,100,5`` starts one proxy per limited silo
(``python -m fl_lbbsp.runs.deploy.link --listen 127.0.0.1:P --target 127.0.0.1:S
--mbps R``, a process of the federation, supervised and stopped with it) and points that
silo's SuperNode at the proxy's port instead of the SuperLink's. The proxy forwards the
bytes of every connection unchanged (TLS passes through end to end: the SuperLink's
certificate names 127.0.0.1, whatever the port), and paces each direction like a link of
``R`` Mbit/s (:class:`LinkPacer`): a chunk of n bytes occupies the link for ``8 n / R``
microseconds, chunks queue behind each other, and all the silo's connections share the
link, one pacer per direction, as the two directions of a full-duplex link.

A user-space proxy rather than a network namespace with a ``tbf`` qdisc: it needs no
root, leaves nothing in the kernel to clean up (stopping the process by its pid is all),
and only ever listens on and connects to loopback addresses. What it does not emulate:
latency beyond the serialisation delay, and loss.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CHUNK_BYTES", "LinkPacer", "link_args", "main", "serve_link"]

CHUNK_BYTES = 16 * 1024
"""Largest chunk forwarded at once: the pacing's granularity (16 KiB is 131 ms at 1 Mbit/s)."""

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class LinkPacer:
    """When each chunk sent over a link of a given rate has left it (a FIFO link: a chunk
    starts when the link is free, and takes ``bytes / rate`` to pass).

    Reference: the token bucket with a bucket of one chunk (Turner, "New directions in
    communications", IEEE Commun. Mag. 1986; Linux's ``tbf``), as a virtual finish time.

    Parameters
    ----------
    mbps : float
        The link's rate in Mbit/s (10**6 bits per second).
    clock : callable (default: time.monotonic)
        Seconds, monotone (a parameter for tests).
    """

    def __init__(self, *, mbps: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not (0 < mbps < math.inf):
            raise ValueError(f"link rate must be finite and positive Mbit/s, got {mbps!r}")
        self.bytes_per_second = mbps * 1e6 / 8
        self._clock = clock
        self._free_at = -math.inf

    def delay(self, size: int) -> float:
        """Seconds to wait from now until a chunk of ``size`` bytes, queued now, has passed
        the link; the link is busy with it until then."""
        now = self._clock()
        start = max(now, self._free_at)
        self._free_at = start + size / self.bytes_per_second
        return self._free_at - now


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pacer: LinkPacer
) -> None:
    """Forward ``reader`` to ``writer`` through ``pacer`` until end of stream."""
    try:
        while chunk := await reader.read(CHUNK_BYTES):
            wait = pacer.delay(len(chunk))
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def serve_link(
    listen: tuple[str, int],
    target: tuple[str, int],
    *,
    mbps: float,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Forward every connection to ``listen`` to ``target``, each direction paced at
    ``mbps`` Mbit/s shared by all connections, until cancelled.

    Parameters
    ----------
    listen, target : tuple of (str, int)
        Loopback host and port to listen on (port 0: any free one) and to connect to.
    mbps : float
        The link's rate in Mbit/s.
    ready : callable | None (default: None)
        Called with the listening port once the proxy accepts connections.

    Raises
    ------
    ValueError
        A host that is not a loopback address.
    """
    for host, _ in (listen, target):
        if host not in _LOOPBACK:
            raise ValueError(f"the link proxy only uses loopback addresses, got {host!r}")
    up, down = LinkPacer(mbps=mbps), LinkPacer(mbps=mbps)
    open_connections: set[asyncio.Task[Any]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection callback runs in a task
        open_connections.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            open_connections.discard(task)
            return
        try:
            await asyncio.gather(_pump(reader, up_writer, up), _pump(up_reader, writer, down))
        finally:
            for side in (writer, up_writer):
                side.close()
                with contextlib.suppress(Exception):
                    await side.wait_closed()
            open_connections.discard(task)

    server = await asyncio.start_server(connection, *listen)
    if ready is not None:
        ready(int(server.sockets[0].getsockname()[1]))
    try:
        async with server:
            await server.serve_forever()
    finally:  # cancelled: the connections end with the proxy
        for task in list(open_connections):
            task.cancel()
        await asyncio.gather(*open_connections, return_exceptions=True)


def link_args(listen: tuple[str, int], target: tuple[str, int], *, mbps: float) -> list[str]:
    """Command line of a link proxy (this interpreter)."""
    return [
        sys.executable, "-m", "fl_lbbsp.runs.deploy.link",
        "--listen", f"{listen[0]}:{listen[1]}", "--target", f"{target[0]}:{target[1]}",
        "--mbps", f"{mbps:g}",
    ]  # fmt: skip


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lbbsp.runs.deploy.link --listen H:P --target H:P --mbps R``."""
    parser = argparse.ArgumentParser(prog="python -m fl_lbbsp.runs.deploy.link")
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--target", type=_address, required=True)
    parser.add_argument("--mbps", type=float, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_link(args.listen, args.target, mbps=args.mbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
