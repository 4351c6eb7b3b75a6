"""The warm silo worker (fl_lbbsp.clients.warm): its protocol in process, who may use it,
the ClientApp's fallback, and the quickstart task run through it. No timing assertions."""

from __future__ import annotations

import io
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fl_lbbsp.clients import warm
from fl_lbbsp.clients.task import TaskRequest, TaskResult
from fl_lbbsp.clients.warm import (
    SOCKET_FILE,
    TOKEN_FILE,
    WarmWorker,
    WarmWorkerError,
    WorkerUnavailableError,
    call_worker,
    run_task,
)
from fl_lbbsp.runs.deploy import LocalFederation, ManagedProcess, RestartPolicy
from fl_lbbsp.runs.deploy.silos import worker_args

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def folder() -> Iterator[Path]:
    # a short path: Unix socket paths hold about 100 bytes
    with tempfile.TemporaryDirectory(prefix="lbw-") as tmp:
        yield Path(tmp) / "w"


def _request(**overrides: object) -> TaskRequest:
    values: dict[str, object] = {
        "kind": "train",
        "arrays": [
            ("conv.weight", np.arange(24, dtype=np.float32).reshape(2, 3, 4)),
            ("fc.bias", np.array([1.5, -2.0], dtype=np.float64)),
            ("steps", np.array(7, dtype=np.int64)),
        ],
        "config": {"batch-size": 8, "lr": 0.05, "server-round": 3},
        "run_config": {"model": "lenet5", "dataset": "embedded"},
        "node_config": {"partition-id": 1, "silo-id": "silo-1", "slowdown": 2.0},
        "process_started": 123.0,
    }
    values.update(overrides)
    return TaskRequest(**values)  # type: ignore[arg-type]


def _doubling(request: TaskRequest) -> TaskResult:
    """A handler that shows what it got: every array doubled, the config echoed."""
    metrics: dict[str, int | float] = {
        "batch-size": int(request.config["batch-size"]),
        "partition-id": int(request.node_config["partition-id"]),
        "process-started": request.process_started,
        "train": int(request.kind == "train"),
    }
    return TaskResult(metrics=metrics, arrays=[(n, a * 2) for n, a in request.arrays])


def test_round_trip_of_arrays_and_config(folder: Path) -> None:
    with WarmWorker(folder=folder, handler=_doubling):
        result = call_worker(folder, _request())
    names = [n for n, _ in result.arrays]
    assert names == ["conv.weight", "fc.bias", "steps"]  # record order kept
    for (_, sent), (_, got) in zip(_request().arrays, result.arrays, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        np.testing.assert_array_equal(got, sent * 2)
    assert result.metrics == {
        "batch-size": 8,
        "partition-id": 1,
        "process-started": 123.0,
        "train": 1,
    }


def test_folder_socket_and_token_are_the_users_only(folder: Path) -> None:
    with WarmWorker(folder=folder, handler=_doubling):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / SOCKET_FILE).stat().st_mode) == 0o600
        assert stat.S_IMODE((folder / TOKEN_FILE).stat().st_mode) == 0o600
    assert not (folder / SOCKET_FILE).exists() and not (folder / TOKEN_FILE).exists()


def test_wrong_token_is_refused(folder: Path) -> None:
    calls: list[TaskRequest] = []

    def handler(request: TaskRequest) -> TaskResult:
        calls.append(request)
        return _doubling(request)

    with WarmWorker(folder=folder, handler=handler):
        (folder / TOKEN_FILE).write_text("0" * 64)  # a client holding another token
        with pytest.raises(WarmWorkerError, match="wrong token"):
            call_worker(folder, _request())
        # not retried in process either: a refusal is not an absent worker
        with pytest.raises(WarmWorkerError):
            run_task(_request(), folder=folder, fallback=_doubling)
    assert calls == []


def test_another_users_process_is_refused(folder: Path) -> None:
    # the worker only serves one user id; this process's is not it
    with (
        WarmWorker(folder=folder, handler=_doubling, uid=os.getuid() + 1),
        pytest.raises(WarmWorkerError, match="another user"),
    ):
        call_worker(folder, _request())


def test_refusal_before_a_large_request_is_read_is_still_a_refusal(folder: Path) -> None:
    big = _request(arrays=[("w", np.zeros(4_000_000, dtype=np.float32))])  # 16 MB
    with (
        WarmWorker(folder=folder, handler=_doubling, uid=os.getuid() + 1),
        pytest.raises(WarmWorkerError, match="another user"),
    ):
        run_task(big, folder=folder, fallback=_doubling)


def test_token_file_readable_by_others_is_not_used(folder: Path) -> None:
    with WarmWorker(folder=folder, handler=_doubling):
        (folder / TOKEN_FILE).chmod(0o644)
        with pytest.raises(WarmWorkerError, match="0600"):
            call_worker(folder, _request())


def test_garbage_on_the_socket_is_dropped_and_the_worker_keeps_serving(folder: Path) -> None:
    with WarmWorker(folder=folder, handler=_doubling):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(folder / SOCKET_FILE))
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            sock.settimeout(30)
            try:
                answer = sock.recv(100)
            except ConnectionResetError:  # closed with our bytes unread
                answer = b""
            assert answer == b""  # closed without an answer
        assert call_worker(folder, _request()).metrics["train"] == 1


def test_no_worker_falls_back_to_the_process(folder: Path) -> None:
    with pytest.raises(WorkerUnavailableError):
        call_worker(folder, _request())
    result, used_worker = run_task(_request(), folder=folder, fallback=_doubling)
    assert not used_worker and result.metrics["batch-size"] == 8
    # no folder configured (simulation): in process, no attempt at all
    result, used_worker = run_task(_request(), folder=None, fallback=_doubling)
    assert not used_worker


def test_stale_socket_of_a_dead_worker_falls_back_and_is_replaced(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / TOKEN_FILE).write_text("t")
    (folder / TOKEN_FILE).chmod(0o600)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(folder / SOCKET_FILE))  # a killed worker leaves its socket file behind
    dead.close()
    result, used_worker = run_task(_request(), folder=folder, fallback=_doubling)
    assert not used_worker and result.metrics["train"] == 1
    with WarmWorker(folder=folder, handler=_doubling):  # a restart takes the folder over
        assert run_task(_request(), folder=folder, fallback=_doubling)[1]


def test_second_worker_on_a_served_folder_is_refused(folder: Path) -> None:
    with (
        WarmWorker(folder=folder, handler=_doubling),
        pytest.raises(RuntimeError, match="already serves"),
    ):
        WarmWorker(folder=folder, handler=_doubling)


def test_worker_lost_mid_task_falls_back(folder: Path) -> None:
    """A worker that dies while training closes the connection: the ClientApp trains."""
    folder.mkdir(parents=True)
    (folder / TOKEN_FILE).write_text("t")
    (folder / TOKEN_FILE).chmod(0o600)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / SOCKET_FILE))
    server.listen(1)

    def crash() -> None:  # reads the request, then goes away without a reply
        conn, _ = server.accept()
        with conn:
            warm._recv(conn)

    thread = threading.Thread(target=crash, daemon=True)
    thread.start()
    try:
        result, used_worker = run_task(_request(), folder=folder, fallback=_doubling)
    finally:
        thread.join(timeout=60)
        server.close()
    assert not used_worker and result.metrics["batch-size"] == 8


def test_failing_task_is_reported_not_retried(folder: Path) -> None:
    def broken(request: TaskRequest) -> TaskResult:
        raise ValueError("batch size 0")

    fallbacks: list[TaskRequest] = []

    def fallback(request: TaskRequest) -> TaskResult:
        fallbacks.append(request)
        return _doubling(request)

    with WarmWorker(folder=folder, handler=broken):
        with pytest.raises(WarmWorkerError, match="ValueError: batch size 0"):
            run_task(_request(), folder=folder, fallback=fallback)
        assert fallbacks == []
        # the worker survives a failed task
        with pytest.raises(WarmWorkerError):
            call_worker(folder, _request())


def test_object_arrays_do_not_travel(folder: Path) -> None:
    with WarmWorker(folder=folder, handler=_doubling):
        bad = _request(arrays=[("x", np.array([object()], dtype=object))])
        with pytest.raises(TypeError, match="not a number type"):
            call_worker(folder, bad)


def test_plain_config_keeps_scalars_only() -> None:
    assert warm.plain_config({"a": 1, "b": "x", "c": [1, 2], "d": b"k", "e": True}) == {
        "a": 1,
        "b": "x",
        "e": True,
    }


def _quickstart_request(tmp: Path, server_round: int = 2) -> TaskRequest:
    from fl_lbbsp.clients.silo_task import build_model_for, local_train_set

    run_config = {
        "dataset": "embedded",
        "partition": "iid",
        "seed": 0,
        "model": "lenet5",
        "slowdowns": "",
        "cost-model": "",
    }
    node_config = {
        "partition-id": 1,
        "num-partitions": 3,
        "silo-id": "silo-1",
        "slowdown": 1.0,
        "compute-lock": str(tmp / "compute.lock"),
    }
    model = build_model_for(run_config, local_train_set(run_config, node_config))
    arrays = [(n, t.detach().numpy()) for n, t in model.state_dict().items()]
    return TaskRequest(
        kind="train",
        arrays=arrays,
        config={"batch-size": 16, "local-steps": 3, "lr": 0.05, "server-round": server_round},
        run_config=run_config,
        node_config=node_config,
        process_started=time.time(),
    )


def test_quickstart_task_gives_the_same_update_in_the_worker_and_in_process(
    folder: Path, tmp_path: Path
) -> None:
    from fl_lbbsp.clients.silo_task import handle

    request = _quickstart_request(tmp_path)
    local, used = run_task(request, folder=None)
    assert not used
    with WarmWorker(folder=folder, handler=handle):
        remote, used = run_task(request, folder=folder)
        evaluated, _ = run_task(
            TaskRequest(
                kind="evaluate",
                arrays=remote.arrays,
                config={},
                run_config=request.run_config,
                node_config=request.node_config,
                process_started=time.time(),
            ),
            folder=folder,
        )
    assert used
    assert [n for n, _ in remote.arrays] == [n for n, _ in local.arrays]
    for (_, a), (_, b) in zip(local.arrays, remote.arrays, strict=True):
        np.testing.assert_array_equal(a, b)  # same seed, same steps: the same update
    for key in ("num-examples", "batch-size", "samples-processed", "train-loss", "slowdown"):
        assert remote.metrics[key] == local.metrics[key]
    assert remote.metrics["train-time"] > 0 and remote.metrics["startup-time"] >= 0
    assert 0.0 <= evaluated.metrics["eval-acc"] <= 1.0


def test_worker_process_serves_and_stops_on_sigterm(folder: Path) -> None:
    """``python -m fl_lbbsp.clients.warm``: serves the quickstart task, then SIGTERM
    removes its socket and token."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fl_lbbsp.clients.warm", "--folder", str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()  # logged once it serves
        assert "warm silo worker serving" in line, line
        with tempfile.TemporaryDirectory() as tmp:
            result, used = run_task(_quickstart_request(Path(tmp)), folder=folder)
        assert used and result.metrics["samples-processed"] == 48
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert not (folder / SOCKET_FILE).exists() and not (folder / TOKEN_FILE).exists()


def test_quickstart_client_app_imports_no_torch() -> None:
    code = (
        "import sys; import lbbsp_quickstart.client_app; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples" / "quickstart")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------- the workers in deploy-local
def _node_config(fed: LocalFederation, index: int) -> dict[str, object]:
    from flwr.common.config import parse_config_args

    args = fed._supernode_args(fed.silos[index])
    return dict(parse_config_args([args[args.index("--node-config") + 1]]))


def test_each_supernode_gets_its_workers_folder_and_a_faster_task_poll(tmp_path: Path) -> None:
    fed = LocalFederation(tmp_path, num_silos=2, insecure=True)
    folders = [_node_config(fed, i)["warm-worker"] for i in range(2)]
    assert folders == [str(fed.warm_folder("silo-0")), str(fed.warm_folder("silo-1"))]
    assert worker_args(fed.warm_folder("silo-1"))[-2:] == ["--folder", folders[1]]
    assert fed._base_env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.2"

    off = LocalFederation(tmp_path, num_silos=2, insecure=True, warm_workers=False)
    assert "warm-worker" not in _node_config(off, 0)
    explicit = LocalFederation(
        tmp_path, insecure=True, env={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "2"}
    )
    assert explicit._base_env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "2"
    with pytest.raises(ValueError, match="task_poll_interval"):
        LocalFederation(tmp_path, insecure=True, task_poll_interval=0.0)


def test_a_workdir_too_deep_for_a_socket_gets_a_short_worker_folder(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    fed = LocalFederation(deep, num_silos=1, insecure=True)
    folder = fed.warm_folder("silo-0")
    assert not folder.is_relative_to(fed.workdir)
    assert len(os.fsencode(folder / SOCKET_FILE)) <= 100
    fed.stop()  # removes the temporary folder
    assert not folder.parent.exists()


def test_supervise_restarts_a_dead_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fed = LocalFederation(tmp_path, num_silos=1, insecure=True)
    worker = ManagedProcess(
        name="silo-0-worker",
        popen=subprocess.Popen(["sh", "-c", "exit 3"]),
        log_path=tmp_path / "w.log",
        args=("sh", "-c", "exit 3"),
    )
    worker.popen.wait()
    worker.started_at = 100.0
    fed.workers = [worker]
    restarted: list[int] = []
    monkeypatch.setattr(fed, "restart_worker", lambda index: restarted.append(index) or worker)
    log = io.StringIO()
    assert fed.supervise(RestartPolicy(), log=log, now=200.0) is None
    assert restarted == [0]
    assert "silo-0-worker" in log.getvalue() and "exited with code 3" in log.getvalue()
    restarted.clear()
    assert fed.supervise(RestartPolicy(restart=False), log=log, now=300.0) is None
    assert restarted == []
    assert "trains in its ClientApp processes" in log.getvalue()
