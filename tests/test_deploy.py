"""End to end on Flower's Deployment Engine: SuperLink + 3 SuperNodes over TLS on loopback,
the quickstart app through ``flwr run``, one SuperNode killed in the last round.

Every process is started by :class:`fl_lbbsp.deploy.LocalFederation`, which stops them all
by pid when the ``with`` block ends, whether the test passed or not.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import psutil
import pytest

from fl_lbbsp.deploy import LocalFederation, run_app, slowdowns_from_speeds
from fl_lbbsp.telemetry import read_telemetry

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parent.parent / "examples" / "quickstart"
SPEEDS = (4.0, 2.0, 1.0)  # emulated capacities of silo-0, silo-1, silo-2


def _tls_handshake(host: str, port: int, ca: Path) -> str:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return str(tls.version())


def _plain_http_refused(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=10) as raw:
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw.settimeout(10)
        try:
            answer = raw.recv(64)
        except (TimeoutError, ConnectionResetError):
            return True
    return not answer.startswith(b"HTTP/1.1 200")


def _wait_for_round(path: Path, server_round: int, stop: threading.Event) -> bool:
    while not stop.is_set():
        if path.exists() and any(
            e.get("event") == "train" and e["round"] == server_round for e in read_telemetry(path)
        ):
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_flwr_run_over_tls_balances_silos_and_survives_a_killed_supernode(tmp_path) -> None:
    # Prepare
    telemetry = tmp_path / "telemetry.jsonl"
    seen_pids: set[int] = set()
    stop = threading.Event()
    killed_at: list[float] = []
    started = time.monotonic()

    with LocalFederation(
        tmp_path / "fed", num_silos=3, slowdowns=slowdowns_from_speeds(SPEEDS)
    ) as fed:
        seen_pids.update(fed.process_tree())
        assert fed.tls is not None
        assert _tls_handshake(fed.host, fed.port, fed.tls.ca_cert).startswith("TLS")
        assert _plain_http_refused(fed.host, fed.port)

        def kill_silo_2_in_round_4() -> None:
            if _wait_for_round(telemetry, 3, stop):
                seen_pids.update(fed.process_tree())
                fed.kill_silo(2)  # SIGKILL: a crash, no goodbye to the SuperLink
                killed_at.append(time.monotonic())

        killer = threading.Thread(target=kill_silo_2_in_round_4, daemon=True)
        killer.start()
        try:
            # Execute: 3 rounds with every silo, then silo-2 dies as round 4 starts
            outcome = run_app(
                fed,
                APP,
                run_config={
                    "num-server-rounds": 4,
                    "model": "lenet5",
                    "local-steps": 40,
                    "batch-size": 32,
                    "min-nodes": 2,
                    "telemetry": str(telemetry),
                    "deadline-margin": 1.5,
                    "deadline-floor": 5.0,
                    "deadline-ceiling": 120.0,
                    "poll-interval": 0.1,
                },
                timeout=150,
            )
        finally:
            stop.set()
            killer.join(timeout=15)
            seen_pids.update(fed.process_tree())

        # Assert: the run finished
        assert outcome.status == "finished:completed", outcome.output[-4000:]
        assert outcome.returncode == 0
        events = read_telemetry(telemetry)
        train = [e for e in events if e["event"] == "train"]
        assert [e["round"] for e in train] == [1, 2, 3, 4]
        assert any(e["event"] == "finished" for e in events)
        assert killed_at, "silo-2 was never killed"

        # ... batch sizes follow the emulated speeds while all three silos are up
        for event in train[:3]:
            assert sorted(event["silos"]) == ["silo-0", "silo-1", "silo-2"]
            assert event["total_batch_size"] == 96
            assert sum(s["batch-size"] for s in event["silos"].values()) == 96
            assert [event["silos"][s]["slowdown"] for s in sorted(event["silos"])] == [1, 2, 4]
        assert {s["batch-size"] for s in train[0]["silos"].values()} == {32}
        for event in train[1:3]:
            b = [event["silos"][f"silo-{i}"]["batch-size"] for i in range(3)]
            assert b[0] > b[1] > b[2], b
            shares = [x / 96 for x in b]
            ideal = [v / sum(SPEEDS) for v in SPEEDS]  # 4/7, 2/7, 1/7
            assert all(abs(s - i) < 0.15 for s, i in zip(shares, ideal, strict=True)), b
        assert train[2]["idle_fraction"] < train[0]["idle_fraction"]

        # ... and the round with a dead SuperNode ended at its deadline with the others
        last = train[3]
        assert last["missed"] == ["silo-2"]
        assert sorted(last["silos"]) == ["silo-0", "silo-1"]
        assert 5.0 <= last["deadline"] < 120.0
        assert last["wall_time"] <= last["deadline"] + 5.0

    # Every process started (and every descendant seen) is gone
    assert not [pid for pid in seen_pids if _alive(pid)]
    assert time.monotonic() - started < 180
