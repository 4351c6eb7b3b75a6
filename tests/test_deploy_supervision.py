"""Supervision of a local deployment without a real federation (issue 16, item 4): when a
dead SuperNode is restarted, what ends the federation, which processes it leaves behind,
the run's final status as an exit code, and the SuperNodes' authentication keys."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from fl_lbbsp.cli import main
from fl_lbbsp.runs.deploy import (
    LocalFederation,
    ManagedProcess,
    RestartPolicy,
    RunOutcome,
    TlsFiles,
    exit_code_for,
    generate_node_keys,
    stop_processes,
)


def _process(tmp_path: Path, name: str, script: str, **env: str) -> ManagedProcess:
    log_path = tmp_path / f"{name}.log"
    popen = subprocess.Popen(
        ["sh", "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )
    return ManagedProcess(name=name, popen=popen, log_path=log_path, args=("sh", "-c", script))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------ restart policy
def test_a_dead_node_is_restarted_at_once_then_with_growing_delays() -> None:
    # Prepare
    policy = RestartPolicy(first_delay=1.0, max_delay=5.0, stable_after=60.0)

    # Execute: a healthy node dies, then its restarts die within seconds
    delays = [policy.delay("silo-0", uptime=600.0)]
    delays += [policy.delay("silo-0", uptime=2.0) for _ in range(5)]
    after_a_stable_run = policy.delay("silo-0", uptime=61.0)
    other = policy.delay("silo-1", uptime=1.0)

    # Assert
    assert delays == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert after_a_stable_run == 0.0
    assert other == 1.0  # a node dying right after the first start waits a little


def test_no_restart_leaves_a_dead_node_out() -> None:
    assert RestartPolicy(restart=False).delay("silo-0", uptime=100.0) is None


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("finished:completed", 0),
        ("finished:failed", 1),
        ("finished:stopped", 1),
        ("running", 1),
        (None, 1),
    ],
)
def test_only_a_completed_run_exits_0(status, code) -> None:  # type: ignore[no-untyped-def]
    # Execute
    outcome = RunOutcome(7, 0, status, "", 12.0, None)

    # Assert: flwr run's own exit code (0 here) does not decide
    assert exit_code_for(status) == code
    assert outcome.exit_code == code and outcome.completed == (code == 0)
    assert outcome.summary().startswith("run 7 ended ")
    assert "\n" not in outcome.summary()


# ------------------------------------------------------------------- supervision
def test_supervise_logs_a_dead_node_and_restarts_it_after_its_delay(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a live SuperLink, a SuperNode that exited with code 3 after 2 s up
    fed = LocalFederation(tmp_path, num_silos=1, insecure=True)
    fed.superlink = _process(tmp_path, "superlink", "sleep 60")
    node = _process(tmp_path, "silo-0", "exit 3")
    node.popen.wait()
    node.started_at = 100.0
    fed.supernodes = [node]
    fed.processes.started = [fed.superlink, node]
    restarted: list[int] = []
    monkeypatch.setattr(fed, "restart_silo", lambda index: restarted.append(index) or node)
    policy = RestartPolicy(first_delay=4.0)
    policy.delay("silo-0", uptime=1.0)  # it already died once right after a start
    log = io.StringIO()
    try:
        # Execute: supervision steps at 102 s (death seen), 104 s and 106.5 s
        reasons = [fed.supervise(policy, log=log, now=now) for now in (102.0, 104.0, 106.5)]

        # Assert: logged once; restarted only when its 8 s delay (the second quick death:
        # 2 x first_delay) counted from 102 s has passed
        assert reasons == [None, None, None]
        assert restarted == []
        fed.supervise(policy, log=log, now=110.0)
        assert restarted == [0]
        assert log.getvalue().count("exited with code 3") == 1
        assert "restarting in 8 s" in log.getvalue()
    finally:
        stop_processes([fed.superlink.pid])


def test_supervise_leaves_a_node_out_without_restart(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    fed = LocalFederation(tmp_path, num_silos=1, insecure=True)
    fed.superlink = _process(tmp_path, "superlink", "sleep 60")
    node = _process(tmp_path, "silo-0", "exit 1")
    node.popen.wait()
    fed.supernodes, fed.processes.started = [node], [fed.superlink, node]
    monkeypatch.setattr(fed, "restart_silo", lambda index: pytest.fail("restarted"))
    log = io.StringIO()
    try:
        # Execute
        reasons = [fed.supervise(RestartPolicy(restart=False), log=log) for _ in range(3)]

        # Assert: the federation goes on, the death is reported once
        assert reasons == [None, None, None]
        assert log.getvalue().count("left out") == 1
    finally:
        stop_processes([fed.superlink.pid])


def test_a_dead_superlink_stops_the_federation_and_its_orphans(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a SuperLink that died, a SuperNode, and an orphan of the SuperLink (a
    # ServerApp reparented to init) that only its environment ties to the federation
    fed = LocalFederation(tmp_path, num_silos=1, insecure=True)
    fed.superlink = _process(tmp_path, "superlink", "exit 0")
    fed.superlink.popen.wait()
    node = _process(tmp_path, "silo-0", "sleep 60")
    fed.supernodes, fed.processes.started = [node], [fed.superlink, node]
    orphan = subprocess.Popen(
        ["sleep", "60"],
        env={**os.environ, "FLWR_HOME": str(tmp_path.resolve() / "homes" / "superlink")},
        start_new_session=True,
    )
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # Execute
        reason = fed.supervise(RestartPolicy(), log=io.StringIO())
        found = fed.leftovers()
        fed.stop(grace=2.0)

        # Assert
        assert reason is not None and reason.startswith("superlink exited with code 0")
        assert orphan.pid in found and stranger.pid not in found
        orphan.wait(timeout=10)
        assert not _alive(node.pid) and not _alive(orphan.pid)
        assert _alive(stranger.pid)
    finally:
        for proc in (orphan, stranger, node.popen):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ----------------------------------------------------------------- node keys
def test_node_keys_are_what_flower_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    # Execute
    keys = generate_node_keys(tmp_path / "keys", ["silo-0", "silo-1"])

    # Assert: the SuperNode's loader and `flwr supernode register`'s both accept them
    assert sorted(keys) == ["silo-0", "silo-1"]
    private = load_ssh_private_key(keys["silo-0"].private_key.read_bytes(), None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert keys["silo-0"].private_key.stat().st_mode & 0o077 == 0
    assert try_load_public_key(keys["silo-0"].public_key).startswith(b"-----BEGIN PUBLIC KEY")
    assert keys["silo-0"].public_key.read_bytes() != keys["silo-1"].public_key.read_bytes()


def test_node_auth_is_on_with_tls_and_needs_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert LocalFederation(tmp_path).node_auth
    assert not LocalFederation(tmp_path, insecure=True).node_auth
    assert not LocalFederation(tmp_path, node_auth=False).node_auth
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(tmp_path, insecure=True, node_auth=True)
    fed = LocalFederation(tmp_path, num_silos=1)
    fed.tls = TlsFiles(tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key")
    fed.node_keys = generate_node_keys(tmp_path / "k", ["silo-0"])
    args = fed._supernode_args(fed.silos[0])
    assert args[args.index("--auth-supernode-private-key") + 1] == str(tmp_path / "k" / "silo-0")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run-config", "x.toml"], "--run-config needs --app"),
        (["--app", "nowhere"], "not a Flower app"),
        (["--app", "examples/quickstart", "--run-timeout", "0"], "--run-timeout"),
    ],
)
def test_deploy_local_refuses_bad_run_flags(tmp_path, capsys, argv, message) -> None:  # type: ignore[no-untyped-def]
    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy-local", "--workdir", str(tmp_path), *argv])

    # Assert
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_deploy_local_flags_reach_the_federation() -> None:
    from fl_lbbsp.cli import _deploy_federation, build_parser

    # Execute
    plain = build_parser().parse_args(["deploy-local"])
    off = build_parser().parse_args(["deploy-local", "--no-node-auth", "--no-restart"])

    # Assert
    assert _deploy_federation(plain).node_auth
    assert not _deploy_federation(off).node_auth and off.no_restart
