"""A warm silo worker: a long-lived local process per silo that holds torch, the data and
the model, to which Flower's per-message ClientApp process hands the round's arrays.

Flower 1.41 starts a new ClientApp process for every message; importing torch, loading
the data and building the model in it took about 4 s per round on a shared 2-core
machine. With a worker the ClientApp process imports only Flower, numpy and this module
(stdlib and numpy: nothing heavy), sends the arrays and the configuration over a local
Unix socket, and gets the trained arrays and the metrics back; it then builds, and signs,
the reply itself (the signing key never reaches the worker).

``fl-lbbsp deploy-local`` (:class:`~fl_lbbsp.runs.deploy.LocalFederation`) starts one
worker per silo beside its SuperNode (``python -m fl_lbbsp.clients.warm --folder DIR``),
supervises it and stops it with the federation, and gives the SuperNode the node config
``warm-worker=DIR``. Without that entry, or when no worker answers there (not started,
died, or lost mid-task), the ClientApp runs the same task in its own process
(:func:`run_task`), so ``flwr run`` in simulation works unchanged.

Who may connect: the folder is created with mode 0700, the socket and the token file
with 0600; the worker checks the peer's user id (``SO_PEERCRED``, Linux) and a random
token the client reads from the folder's ``token`` file, and refuses anything else. The
wire format carries no code: a JSON header (the task's kind, plain configuration values,
each array's name, dtype and shape) followed by the arrays' raw bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import math
import os
import secrets
import signal
import socket
import socketserver
import stat
import struct
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .task import NamedArrays, Scalar, TaskRequest, TaskResult

__all__ = [
    "SOCKET_FILE",
    "SOCKET_PATH_MAX",
    "TOKEN_FILE",
    "WORKER_KEY",
    "TaskHandler",
    "WarmWorker",
    "WarmWorkerError",
    "WorkerUnavailableError",
    "call_worker",
    "main",
    "plain_config",
    "run_task",
    "socket_answers",
    "worker_folder",
]

log = logging.getLogger(__name__)

WORKER_KEY = "warm-worker"
"""Node-config key naming the silo's worker folder (set by ``deploy-local``)."""
SOCKET_FILE = "worker.sock"
"""The worker's Unix socket, in its folder (mode 0600)."""
TOKEN_FILE = "token"
"""The token a client must present, in the worker's folder (mode 0600)."""

_MAGIC = b"LBW1"
_PREFIX = struct.Struct(">4sI")  # magic, header length
_MAX_HEADER = 1 << 24  # 16 MiB of JSON
_DTYPE_KINDS = frozenset("biuf")  # bool, integers, floats: what model arrays hold
SOCKET_PATH_MAX = 100
"""Longest Unix socket path used (sun_path holds 104-108 bytes depending on the platform)."""

TaskHandler = Callable[[TaskRequest], TaskResult]
"""Runs a task; the worker's default is :func:`fl_lbbsp.clients.silo_task.handle`."""


class WarmWorkerError(RuntimeError):
    """The worker refused the request (wrong token, another user) or the task failed in
    it; the ClientApp does not retry it in process."""


class WorkerUnavailableError(ConnectionError):
    """No worker answered (none started, or it died), or it was lost in the middle of the
    task: the ClientApp runs the task itself."""


# --------------------------------------------------------------------- wire format
def plain_config(values: Mapping[str, Any]) -> dict[str, Scalar]:
    """The entries of ``values`` that travel: strings, integers, floats and booleans
    (Flower's lists and bytes are left out; the silo task reads none)."""
    return {str(k): v for k, v in values.items() if isinstance(v, str | int | float | bool)}


def _encode(header: dict[str, Any], arrays: NamedArrays) -> list[bytes | memoryview]:
    specs = []
    buffers: list[bytes | memoryview] = []
    for name, array in arrays:
        data = np.asarray(array, order="C")  # 0-d arrays stay 0-d
        if data.dtype.kind not in _DTYPE_KINDS:
            raise TypeError(f"array {name!r} has dtype {data.dtype}, not a number type")
        specs.append({"name": str(name), "dtype": data.dtype.str, "shape": list(data.shape)})
        buffers.append(data.reshape(-1).data.cast("B"))
    text = json.dumps({**header, "arrays": specs}).encode()
    return [_PREFIX.pack(_MAGIC, len(text)), text, *buffers]


def _send(sock: socket.socket, header: dict[str, Any], arrays: NamedArrays = ()) -> None:
    for part in _encode(header, arrays):
        sock.sendall(part)


def _recv_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError(f"connection closed after {got} of {size} bytes")
        got += n
    return buffer


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[tuple[str, npt.NDArray[Any]]]]:
    magic, length = _PREFIX.unpack(bytes(_recv_exactly(sock, _PREFIX.size)))
    if magic != _MAGIC:
        raise ValueError("not a warm worker frame")
    if length > _MAX_HEADER:
        raise ValueError(f"frame header of {length} bytes is too large")
    header = json.loads(bytes(_recv_exactly(sock, length)))
    if not isinstance(header, dict):
        raise ValueError("frame header is not a JSON object")
    arrays = []
    for spec in header.pop("arrays", []):
        dtype = np.dtype(str(spec["dtype"]))
        shape = tuple(int(d) for d in spec["shape"])
        if dtype.kind not in _DTYPE_KINDS or any(d < 0 for d in shape):
            raise ValueError(f"array {spec.get('name')!r}: bad dtype or shape")
        size = math.prod(shape) * dtype.itemsize
        data = _recv_exactly(sock, size)
        arrays.append((str(spec["name"]), np.frombuffer(data, dtype=dtype).reshape(shape)))
    return header, arrays


# ------------------------------------------------------------------------ server
def _peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's user id (Linux ``SO_PEERCRED``); None where unknown."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux: the folder's mode protects it
        return None
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, 12))
    return int(uid)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    worker: WarmWorker


class _Connection(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.worker._serve(self.request)


class WarmWorker:
    """Serve silo tasks on ``<folder>/worker.sock`` to this user's processes.

    Parameters
    ----------
    folder : str | Path
        The worker's folder (created with mode 0700): its socket and token file.
    handler : TaskHandler
        Runs one task (called from a thread per connection).
    uid : int | None (default: None)
        User id allowed to connect; ``None``: this process's.

    Notes
    -----
    :meth:`start` serves in a background thread (tests), :meth:`serve_forever` in the
    calling one (the worker process); :meth:`close` stops serving and removes the socket
    and the token.
    """

    def __init__(self, *, folder: str | Path, handler: TaskHandler, uid: int | None = None) -> None:
        self.folder = Path(folder).resolve()
        self.handler = handler
        self.uid = os.getuid() if uid is None else uid
        self.socket_path = self.folder / SOCKET_FILE
        if len(os.fsencode(self.socket_path)) > SOCKET_PATH_MAX:
            raise ValueError(f"socket path {self.socket_path} is too long for a Unix socket")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        if socket_answers(self.socket_path):
            raise RuntimeError(f"a worker already serves {self.socket_path}")
        self.socket_path.unlink(missing_ok=True)  # left by a worker that died
        self._token = secrets.token_hex(32)
        old = os.umask(0o177)
        try:
            self._server = _Server(str(self.socket_path), _Connection)
        finally:
            os.umask(old)
        self.socket_path.chmod(0o600)
        self._server.worker = self
        token = self.folder / TOKEN_FILE
        token.unlink(missing_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self._token)
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        """Serve until :meth:`close` (from another thread) or an exception."""
        self._server.serve_forever(poll_interval=0.5)

    def start(self) -> WarmWorker:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; remove the socket and the token file."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self.socket_path.unlink(missing_ok=True)
        (self.folder / TOKEN_FILE).unlink(missing_ok=True)

    def __enter__(self) -> WarmWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, conn: socket.socket) -> None:
        peer = _peer_uid(conn)
        if peer is not None and peer != self.uid:
            log.warning("refused a connection from user id %d", peer)
            _send(conn, {"ok": False, "refused": True, "error": "another user's process"})
            return
        try:
            header, arrays = _recv(conn)
        except EOFError:  # a probe (is it serving?) or a client gone
            return
        except (ValueError, KeyError, TypeError, OSError) as err:
            log.warning("unreadable request: %s", err)
            return
        token = str(header.get("token", ""))
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            log.warning("refused a request with a wrong token")
            _send(conn, {"ok": False, "refused": True, "error": "wrong token"})
            return
        try:
            request = TaskRequest(
                kind=header["kind"],
                arrays=arrays,
                config=header.get("config", {}),
                run_config=header.get("run_config", {}),
                node_config=header.get("node_config", {}),
                process_started=float(header.get("process_started", 0.0)),
            )
            if request.kind not in ("train", "evaluate"):
                raise ValueError(f"unknown task kind {request.kind!r}")
            result = self.handler(request)
        except Exception as err:  # the task failed: tell the client, keep serving
            log.exception("task failed")
            with contextlib.suppress(OSError):
                _send(conn, {"ok": False, "error": f"{type(err).__name__}: {err}"})
            return
        with contextlib.suppress(OSError):  # a client gone meanwhile: nothing to do
            _send(conn, {"ok": True, "metrics": dict(result.metrics)}, result.arrays)


def socket_answers(path: str | Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, contextlib.suppress(OSError):
        probe.connect(str(path))
        return True
    return False


# ------------------------------------------------------------------------ client
def worker_folder(node_config: Mapping[str, Any]) -> str | None:
    """The node's worker folder (node config ``warm-worker``); None: no worker."""
    value = node_config.get(WORKER_KEY)
    return None if value in (None, "") else str(value)


def _read_token(folder: Path) -> str:
    path = folder / TOKEN_FILE
    info = path.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{path} must be this user's and mode 0600")
    return path.read_text().strip()


def call_worker(
    folder: str | Path, request: TaskRequest, *, timeout: float | None = None
) -> TaskResult:
    """Run ``request`` on the worker serving ``folder``.

    Parameters
    ----------
    folder : str | Path
        The worker's folder (node config ``warm-worker``).
    request : TaskRequest
        The task.
    timeout : float | None (default: None)
        Seconds to wait for each read or write; ``None``: as long as the task takes
        (a worker that dies closes the connection).

    Raises
    ------
    WorkerUnavailableError
        No worker answers in ``folder``, or the connection broke before the reply: the
        caller may run the task itself.
    WarmWorkerError
        The worker refused the request or the task failed in it.
    """
    base = Path(folder)
    try:
        token = _read_token(base)
    except FileNotFoundError as err:
        raise WorkerUnavailableError(f"no warm worker in {base}") from err
    except PermissionError as err:
        raise WarmWorkerError(str(err)) from err
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(base / SOCKET_FILE))
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise WorkerUnavailableError(f"no warm worker answers on {base / SOCKET_FILE}") from err
        header = {
            "token": token,
            "kind": request.kind,
            "config": plain_config(request.config),
            "run_config": plain_config(request.run_config),
            "node_config": plain_config(request.node_config),
            "process_started": request.process_started,
        }
        try:
            # refused before it read everything? its answer says so (else: lost)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                _send(sock, header, request.arrays)
            reply, arrays = _recv(sock)
        except (EOFError, ConnectionError, TimeoutError) as err:
            raise WorkerUnavailableError(f"warm worker in {base} lost mid-task: {err}") from err
    if not reply.get("ok"):
        raise WarmWorkerError(f"warm worker in {base}: {reply.get('error', 'failed')}")
    metrics = {str(k): v for k, v in dict(reply.get("metrics", {})).items()}
    return TaskResult(metrics=metrics, arrays=arrays)


def _in_process(request: TaskRequest) -> TaskResult:
    from .silo_task import handle  # torch and the data: only on this path

    return handle(request)


def run_task(
    request: TaskRequest,
    *,
    folder: str | Path | None,
    fallback: TaskHandler | None = None,
    timeout: float | None = None,
) -> tuple[TaskResult, bool]:
    """Run ``request`` on the silo's warm worker if there is one, else in this process.

    Parameters
    ----------
    request : TaskRequest
        The task.
    folder : str | Path | None
        The worker's folder (:func:`worker_folder`); ``None``: run in this process.
    fallback : TaskHandler | None (default: None)
        How to run it in this process; ``None``:
        :func:`fl_lbbsp.clients.silo_task.handle` (imports torch).
    timeout : float | None (default: None)
        See :func:`call_worker`.

    Returns
    -------
    tuple of (TaskResult, bool)
        The result, and whether the warm worker computed it.

    Raises
    ------
    WarmWorkerError
        The worker refused the request or the task failed in it (not retried here).
    """
    local = _in_process if fallback is None else fallback
    if folder is None:
        return local(request), False
    try:
        return call_worker(folder, request, timeout=timeout), True
    except WorkerUnavailableError as err:
        log.warning("%s; running the %s task in the ClientApp process", err, request.kind)
    return local(request), False


# -------------------------------------------------------------------- the process
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lbbsp.clients.warm --folder DIR``: serve the silo task until
    SIGTERM or SIGINT, with torch and the silo task imported before the first request."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--folder", type=Path, required=True, help="socket and token folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from .silo_task import handle, prepare_process

    prepare_process()

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    worker = WarmWorker(folder=args.folder, handler=handle)
    log.info("warm silo worker serving %s (pid %d)", worker.socket_path, os.getpid())
    try:
        worker.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
