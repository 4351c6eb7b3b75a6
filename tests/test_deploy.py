"""End to end on Flower's Deployment Engine: SuperLink + 3 SuperNodes over TLS on loopback,
the quickstart app through ``flwr run`` with signed replies, one SuperNode killed in the
last round.

Every process is started by :class:`fl_lbbsp.runs.deploy.LocalFederation`, which stops them all
by pid when the ``with`` block ends, whether the test passed or not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import tomli

from fl_lbbsp.runs.deploy import (
    LocalFederation,
    RestartPolicy,
    free_port,
    generate_tls,
    run_app,
    slowdowns_from_speeds,
    stop_processes,
    write_run_config,
)
from fl_lbbsp.security.silo_keys import write_silo_keys
from fl_lbbsp.telemetry import read_telemetry

APP = Path(__file__).resolve().parent.parent / "examples" / "quickstart"
SPEEDS = (4.0, 2.0, 1.0)  # emulated capacities of silo-0, silo-1, silo-2
# The killed-SuperNode run's limits follow from its deadlines, with room for a busy
# machine (ClientApp start-up alone took 9-25 s per round on a loaded 2-core box): a round
# may last up to the deadline ceiling, the federation needs time to start and stop; no
# deadline is shorter than a loaded machine's reply (a floor of 10 s was missed by 0.6 s
# under a load of 8-14).
ROUNDS = 4
DEADLINE_MARGIN, DEADLINE_FLOOR, DEADLINE_CEILING = 2.5, 30.0, 150.0
AGGREGATION_SLACK = 20.0  # seconds from a round's deadline to its aggregate being logged
START_LIMIT = 120.0  # seconds to start and stop the SuperLink and SuperNodes
RUN_LIMIT = ROUNDS * (DEADLINE_CEILING + AGGREGATION_SLACK) + START_LIMIT


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


def _rogue_supernode(fed: LocalFederation, folder: Path) -> subprocess.Popen[bytes]:
    """A SuperNode that has what any process on this machine has: the public CA file."""
    env = fed.environment()
    env["FLWR_HOME"] = str(folder / "home")
    folder.mkdir(parents=True, exist_ok=True)
    assert fed.tls is not None
    args = [str(fed.bin_dir / "flower-supernode"), "--superlink", fed.address]
    args += ["--root-certificates", str(fed.tls.ca_cert), "--host", fed.host]
    args += ["--port", str(free_port(fed.host)), "--isolation", "subprocess"]
    with (folder / "rogue.log").open("wb") as log:
        return subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------ the pieces
def test_generated_server_certificate_is_signed_by_the_ca_for_loopback(tmp_path) -> None:
    from cryptography import x509

    # Execute
    files = generate_tls(tmp_path / "tls")

    # Assert
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert files.server_key.stat().st_mode & 0o077 == 0
    context = ssl.create_default_context(cafile=str(files.ca_cert))  # loads as a trust root
    context.load_cert_chain(files.server_cert, files.server_key)  # key matches the cert


def test_speeds_become_slowdowns_and_bad_settings_are_refused(tmp_path) -> None:
    assert slowdowns_from_speeds([4, 2, 1]) == (1.0, 2.0, 4.0)
    with pytest.raises(ValueError):
        slowdowns_from_speeds([4, 0])
    with pytest.raises(ValueError, match="slowdowns"):
        LocalFederation(tmp_path, num_silos=2, slowdowns=(1.0,))
    with pytest.raises(ValueError, match=">= 1"):
        LocalFederation(tmp_path, num_silos=2, slowdowns=(1.0, 0.5))
    with pytest.raises(ValueError, match="distinct"):
        LocalFederation(tmp_path, num_silos=2, silo_ids=("a", "a"))


def test_run_config_file_is_toml(tmp_path) -> None:
    path = write_run_config(
        tmp_path / "run.toml",
        {"telemetry": str(tmp_path / 'a "b".jsonl'), "num-server-rounds": 3, "lr": 0.1},
    )
    assert tomli.loads(path.read_text()) == {
        "telemetry": str(tmp_path / 'a "b".jsonl'),
        "num-server-rounds": 3,
        "lr": 0.1,
    }


def test_stop_processes_ends_a_process_and_its_children(tmp_path) -> None:
    # Prepare: a shell in its own session with a child in yet another session
    script = "setsid sleep 300 & sleep 300"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        assert len(tree) >= 2

        # Execute
        stop_processes([proc.pid], grace=2.0)
        proc.wait(timeout=5)

        # Assert
        assert not [pid for pid in tree if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()


# ------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_deploy_local_cli_starts_a_federation_and_ctrl_c_stops_it(tmp_path) -> None:
    # Prepare
    cmd = [sys.executable, "-m", "fl_lbbsp.cli", "deploy-local", "--silos", "2"]
    cmd += ["--speeds", "2,1", "--workdir", str(tmp_path), "--insecure"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    tree: list[int] = []
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:  # the CLI prints the plan once everything is up
            lines.append(line)
            if "Ctrl-C stops" in line:
                break
        text = "".join(lines)
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        port = int(re.search(r"SuperLink +127\.0\.0\.1:(\d+) +INSECURE", text).group(1))  # type: ignore[union-attr]

        # Execute: plain HTTP answers (--insecure), then Ctrl-C
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = raw.recv(64)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)

        # Assert
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert proc.returncode == 0, text + rest
        assert "flwr run examples/quickstart lbbsp-local" in text
        assert text.count("SuperNode  silo-id=") == 2
        assert len(tree) >= 5  # CLI, SuperLink, 2 SuperNodes and their SuperExecs
        time.sleep(0.5)
        assert not [pid for pid in tree if _alive(pid)]
    finally:
        stop_processes([pid for pid in tree if _alive(pid)] or [proc.pid])


@pytest.mark.slow
def test_flwr_run_over_tls_balances_silos_and_survives_a_killed_supernode(tmp_path) -> None:
    """Also: every silo signs its replies and the server checks them against the silo
    registry (``deploy-local --silo-registry``), the killed SuperNode is restarted by the
    supervision (``deploy-local``'s), the run's final status is read, and a rogue SuperNode
    with only the CA file cannot join."""
    # Prepare: one signing key per silo, the registry for the server
    keys = write_silo_keys(tmp_path / "silo-keys", ["silo-0", "silo-1", "silo-2"])
    telemetry = tmp_path / "telemetry.jsonl"
    seen_pids: set[int] = set()
    stop = threading.Event()
    killed_at: list[float] = []
    started = time.monotonic()

    with LocalFederation(
        tmp_path / "fed",
        num_silos=3,
        slowdowns=slowdowns_from_speeds(SPEEDS),
        silo_registry=tmp_path / "silo-keys",
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
            # Execute: 3 rounds with every silo, then silo-2 dies as round 4 starts. The
            # silos report a cost model's times (so the batch sizes do not depend on this
            # machine's load) and the run may take as long as its deadlines allow
            outcome = run_app(
                fed,
                APP,
                run_config={
                    "num-server-rounds": ROUNDS,
                    "model": "lenet5",
                    "local-steps": 80,
                    "batch-size": 32,
                    "min-nodes": 2,
                    "telemetry": str(telemetry),
                    "cost-model": "0.0004,0.002",
                    "deadline-margin": DEADLINE_MARGIN,
                    "deadline-floor": DEADLINE_FLOOR,
                    "deadline-ceiling": DEADLINE_CEILING,
                    "poll-interval": 0.1,
                },
                timeout=RUN_LIMIT,
                policy=RestartPolicy(),  # what deploy-local does while the run lasts
            )
        finally:
            stop.set()
            killer.join(timeout=15)
            seen_pids.update(fed.process_tree())

        # Execute: a rogue SuperNode (no registered key) tries to join the federation
        rogue = _rogue_supernode(fed, tmp_path / "rogue")
        try:
            rogue_code = rogue.wait(timeout=START_LIMIT)
        finally:
            stop_processes([rogue.pid])
        rogue_log = (tmp_path / "rogue" / "rogue.log").read_text(errors="replace")

        # Assert: refused (Flower's SuperNode authentication), not one of the nodes
        assert fed.node_auth
        assert rogue_code != 0, rogue_log[-2000:]
        assert "SuperNode authentication is enabled" in rogue_log, rogue_log[-2000:]
        assert "SuperNode ID:" not in rogue_log

        # Assert: the run finished, and the dead SuperNode was started again
        assert outcome.status == "finished:completed", outcome.output[-4000:]
        assert outcome.returncode == 0 and outcome.exit_code == 0
        assert "restarted by fl_lbbsp" in fed.supernodes[2].log_text()
        events = read_telemetry(telemetry)
        train = [e for e in events if e["event"] == "train"]
        assert [e["round"] for e in train] == [1, 2, 3, 4]
        assert any(e["event"] == "finished" for e in events)
        assert killed_at, "silo-2 was never killed"

        # ... every reply was signed by its silo and accepted: none rejected while all
        # three silos are up, and none for its signature in any round (round 4 may see a
        # stray reply of the killed node, rejected as not sent a message this round)
        assert fed.app_run_config() == {"silo-registry": str(keys.registry)}
        assert all(e["rejected"] == [] for e in train[:3]), [e["rejected"] for e in train]
        rejected = [e["reason"] for e in events if e["event"] == "rejected"]
        assert not [r for r in rejected if re.search("signature|unsigned|registry", r)], rejected
        assert "silo identities are unverified" not in outcome.output

        # ... batch sizes follow the emulated speeds while all three silos are up
        for event in train[:3]:
            assert sorted(event["silos"]) == ["silo-0", "silo-1", "silo-2"]
            assert event["total_batch_size"] == 96
            assert sum(s["batch-size"] for s in event["silos"].values()) == 96
            assert [event["silos"][s]["slowdown"] for s in sorted(event["silos"])] == [1, 2, 4]
        assert {s["batch-size"] for s in train[0]["silos"].values()} == {32}
        final = [train[2]["silos"][f"silo-{i}"]["batch-size"] for i in range(3)]
        assert final[0] > final[1] > final[2], final
        ideal = [v / sum(SPEEDS) for v in SPEEDS]  # shares 4/7, 2/7, 1/7 of X = 96
        assert all(abs(b / 96 - i) < 0.15 for b, i in zip(final, ideal, strict=True)), final

        # ... and the round with a dead SuperNode ended at its deadline with the others
        last = train[3]
        assert last["missed"] == ["silo-2"]
        assert sorted(last["silos"]) == ["silo-0", "silo-1"]
        assert DEADLINE_FLOOR <= last["deadline"] < DEADLINE_CEILING
        assert last["wall_time"] <= last["deadline"] + AGGREGATION_SLACK

    # Every process started (and every descendant seen) is gone
    assert not [pid for pid in seen_pids if _alive(pid)]
    assert time.monotonic() - started < RUN_LIMIT + START_LIMIT


@pytest.mark.slow
def test_deploy_local_app_run_ends_nonzero_and_leaves_nothing_when_the_superlink_dies(
    tmp_path,
) -> None:
    # Prepare: deploy-local running the quickstart for many rounds
    config = write_run_config(
        tmp_path / "run.toml",
        {"num-server-rounds": 100, "model": "mlp", "local-steps": 5, "min-nodes": 2,
         "cost-model": "0.0004,0.002", "deadline-floor": DEADLINE_FLOOR,
         "deadline-ceiling": DEADLINE_CEILING},
    )  # fmt: skip
    cmd = [sys.executable, "-m", "fl_lbbsp.cli", "deploy-local", "--silos", "2"]
    cmd += ["--workdir", str(tmp_path / "fed"), "--app", str(APP), "--run-config", str(config)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen: set[int] = set()
    superlink = serverapp = None
    try:
        deadline = time.monotonic() + 2 * START_LIMIT  # start, then the ServerApp's start
        while serverapp is None and time.monotonic() < deadline and proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                seen.add(child.pid)
                with contextlib.suppress(psutil.Error):
                    line = " ".join(child.cmdline())
                    superlink = child if "flower-superlink" in line else superlink
                    serverapp = child if "flwr-serverapp" in line else serverapp
            time.sleep(0.2)
        assert superlink is not None and serverapp is not None, "no ServerApp started"

        # Execute: the SuperLink crashes mid-run
        superlink.kill()
        out, _ = proc.communicate(timeout=START_LIMIT)

        # Assert: a nonzero exit a script can see, the final line says why
        assert proc.returncode == 1, out[-3000:]
        assert "superlink exited with code -9" in out, out[-3000:]
        assert "ended unknown" in out
        # ... and nothing left behind: not the ServerApp, not any other process
        time.sleep(0.5)
        assert not _alive(serverapp.pid)
        assert not [pid for pid in seen if _alive(pid)]
    finally:
        stop_processes([pid for pid in seen if _alive(pid)] or [proc.pid])
