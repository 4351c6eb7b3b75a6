"""Signed replies in a local deployment without a real federation: what
``deploy-local --silo-registry`` gives each SuperNode and the app, and the quickstart's
ClientApp signing and ServerApp checking its replies, in process."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomli
from flwr.app import Context, RecordDict
from flwr.common.config import parse_config_args

from fl_lbbsp.cli import main
from fl_lbbsp.runs.deploy import (
    LocalFederation,
    ManagedProcess,
    app_run,
    describe,
    federation,
    read_run_config,
    serve,
)
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.security.identity import (
    IdentityError,
    load_registry,
    load_signing_key,
    sign_reply,
)
from fl_lbbsp.security.silo_keys import write_silo_keys
from fl_lbbsp.telemetry import read_telemetry

APP = Path(__file__).resolve().parent.parent / "examples" / "quickstart"
IDS = ["silo-0", "silo-1", "silo-2"]


def _node_config(fed: LocalFederation, index: int) -> dict[str, Any]:
    """The ``--node-config`` of SuperNode ``index`` as ``flower-supernode`` parses it."""
    args = fed._supernode_args(fed.silos[index])
    return parse_config_args([args[args.index("--node-config") + 1]])


def _verifies(registry: Path, key_file: str, silo: str) -> bool:
    fields: dict[str, Any] = {
        "run_id": 1, "server_round": 1, "instruction": "m", "silo": silo, "metrics": {},
        "arrays": [],
    }  # fmt: skip
    try:
        load_registry(registry).verify(sign_reply(load_signing_key(key_file), **fields), **fields)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------- deploy-local wiring
def test_a_key_folder_gives_each_supernode_its_key_and_the_app_the_registry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    files = write_silo_keys(tmp_path / "keys", IDS)

    # Execute
    fed = LocalFederation(
        tmp_path / "fed", num_silos=3, insecure=True, silo_registry=files.registry.parent
    )
    configs = [_node_config(fed, i) for i in range(3)]

    # Assert: silo i signs with its own key, which the registry the app gets verifies
    registry = str(files.registry.resolve())
    assert fed.app_run_config() == {"silo-registry": registry}
    for silo, config in zip(IDS, configs, strict=True):
        assert config["signing-key"] == str(files.keys[silo].resolve())
        assert _verifies(files.registry, config["signing-key"], silo)
    assert not _verifies(files.registry, configs[2]["signing-key"], "silo-1")
    # ... and the printed command passes the registry in a form `flwr run` parses
    command = describe(fed).splitlines()[-1]
    assert f"--run-config 'silo-registry=\"{registry}\"'" in command
    assert parse_config_args([f'silo-registry="{registry}"']) == {"silo-registry": registry}


def test_without_a_registry_nodes_and_app_get_no_signing_entries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Execute
    fed = LocalFederation(tmp_path, num_silos=2, insecure=True)

    # Assert: nothing an app without the `silo-registry` key would be refused for
    assert fed.app_run_config() == {}
    assert "signing-key" not in _node_config(fed, 0)
    assert "--run-config" not in describe(fed)


def test_a_federation_running_your_app_does_not_tell_you_to_run_the_quickstart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    fed = LocalFederation(tmp_path, num_silos=2, insecure=True)

    # Execute
    yours, bare = describe(fed, app=tmp_path / "bankapp"), describe(fed)

    # Assert: the command to run the quickstart only where no app is run
    assert "quickstart" not in yours and "examples/quickstart" in bare
    assert yours.splitlines()[-1].startswith("logs: ")


def test_auto_generates_the_keys_in_the_workdir_at_start(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a federation whose processes are `sleep`s that count as started
    fed = LocalFederation(tmp_path, num_silos=2, insecure=True, silo_registry="auto")
    assert fed.silo_keys == tmp_path.resolve() / "silo-keys"
    assert not fed.silo_keys.exists()  # nothing written before start

    def spawn(name: str, args: list[str], home: str, **_: Any) -> ManagedProcess:
        popen = subprocess.Popen(["sleep", "30"], start_new_session=True)
        proc = ManagedProcess(
            name=name, popen=popen, log_path=tmp_path / f"{name}.log", args=tuple(args)
        )
        fed.processes.started.append(proc)
        return proc

    monkeypatch.setattr(fed.processes, "spawn", spawn)
    monkeypatch.setattr(federation, "wait_until_ready", lambda *_, **__: [])
    monkeypatch.setattr(federation, "registered_node_ids", lambda *_, **__: {})

    # Execute
    with fed:
        node_args = [list(p.args) for p in fed.supernodes]
        description = describe(fed)

    # Assert: a key per silo and the registry, each SuperNode started with its key
    registry = tmp_path.resolve() / "silo-keys" / "registry.json"
    assert sorted(load_registry(registry).keys) == ["silo-0", "silo-1"]
    for silo, args in zip(["silo-0", "silo-1"], node_args, strict=True):
        config = parse_config_args([args[args.index("--node-config") + 1]])
        assert _verifies(registry, config["signing-key"], silo)
    assert f"silo-registry {registry}" in description


def test_a_key_folder_that_misses_a_silo_is_refused_in_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: keys for silos 0..2 (`keys silos --silos 3`), not for deploy-local's ids
    write_silo_keys(tmp_path / "keys", ["0", "1", "2"])

    # Execute
    with pytest.raises(IdentityError, match="silo silo-0 is not in the silo registry"):
        LocalFederation(tmp_path / "fed", num_silos=3, silo_registry=tmp_path / "keys")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "deploy-local",
                "--workdir",
                str(tmp_path / "fed"),
                "--silo-registry",
                str(tmp_path / "keys"),
            ]
        )

    # Assert
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "silo silo-0 is not in the silo registry" in err.splitlines()[-1]


def test_deploy_local_refuses_a_run_config_that_is_not_toml(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    bad = tmp_path / "bad.toml"
    bad.write_text("num-server-rounds = \n")

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "deploy-local",
                "--workdir",
                str(tmp_path),
                "--app",
                str(APP),
                "--run-config",
                str(bad),
            ]
        )

    # Assert: refused before anything starts, in one line
    assert exit_info.value.code == 2
    assert f"--run-config {bad}:" in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "logs").exists()


def test_the_registry_joins_the_users_run_config_for_the_app(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the user's overrides file (a nested table too), a federation that
    # starts nothing, and a `flwr run` that prints the run id
    files = write_silo_keys(tmp_path / "keys", ["silo-0"])
    user = tmp_path / "user.toml"
    user.write_text('num-server-rounds = 2\ntelemetry = "t.jsonl"\n[narx]\nwarmup = 5\n')
    fed = LocalFederation(
        tmp_path / "fed", num_silos=1, insecure=True, silo_registry=tmp_path / "keys"
    )
    monkeypatch.setattr(fed, "start", lambda: fed)
    monkeypatch.setattr(fed, "stop", lambda **_: None)
    script = "import sys; print('Successfully started run 5'); print(sys.argv)"
    monkeypatch.setattr(
        fed, "run_command", lambda app, *extra: [sys.executable, "-c", script, *extra]
    )
    monkeypatch.setattr(app_run, "run_status", lambda federation, run_id: "finished:completed")

    # Execute: deploy-local --app APP --run-config user.toml
    code = serve(fed, app=APP, run_config=user, check_every=0.05)

    # Assert: one run-config file with the user's values and the registry
    written = fed.workdir / "run.toml"
    assert code == 0
    assert read_run_config(user) == {
        "num-server-rounds": 2,
        "telemetry": "t.jsonl",
        "narx.warmup": 5,
    }
    assert tomli.loads(written.read_text()) == {
        "silo-registry": str(files.registry.resolve()),
        "num-server-rounds": 2,
        "telemetry": "t.jsonl",
        "narx": {"warmup": 5},
    }
    argv = (fed.workdir / "logs" / "run-flwr-run.log").read_text()
    assert argv.count("--run-config") == 1 and str(written) in argv


# ------------------------------------------------------------ the quickstart's apps
@pytest.fixture
def quickstart() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The quickstart's ClientApp and ServerApp modules, imported from examples/quickstart."""
    sys.path.insert(0, str(APP))
    try:
        from lbbsp_quickstart import client_app, server_app

        yield client_app, server_app
    finally:
        sys.path.remove(str(APP))


def _run_config(**overrides: Any) -> dict[str, Any]:
    config = tomli.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return {**config, **overrides}


@pytest.mark.parametrize("forger", [False, True], ids=["all-honest", "silo-1-forges"])
def test_quickstart_silos_sign_and_its_server_checks_them(
    quickstart, tmp_path, monkeypatch, forger
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 quickstart silos, each with its key (silo-1 with silo-2's when it
    # forges), the quickstart server with the registry; 2 short rounds of an MLP
    client_app, server_app = quickstart
    files = write_silo_keys(tmp_path / "keys", IDS)
    keys = {**files.keys, "silo-1": files.keys["silo-2"]} if forger else files.keys
    telemetry = tmp_path / "t.jsonl"
    run_config = _run_config(
        **{"num-server-rounds": 2, "model": "mlp", "local-steps": 2, "min-nodes": 2,
           "cost-model": "0.0004,0.002", "telemetry": str(telemetry),
           "silo-registry": str(files.registry)}
    )  # fmt: skip
    grid = InProcessGrid(
        client_app.app,
        num_nodes=3,
        node_configs=[
            {"silo-id": s, "num-partitions": 3, "signing-key": str(keys[s])} for s in IDS
        ],
        run_config=run_config,
    )
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    monkeypatch.setattr(logging.getLogger("fl_lbbsp"), "handlers", [logging.NullHandler()])

    # Execute
    server_app.main(grid, context)

    # Assert: every honest reply accepted; a forged one rejected as a bad signature
    events = read_telemetry(telemetry)
    train = [e for e in events if e["event"] == "train"]
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [e["round"] for e in train] == [1, 2]
    if not forger:
        assert not rejected
        assert all(sorted(e["silos"]) == IDS for e in train)
    else:
        assert [(e["round"], e["silo"]) for e in rejected] == [(1, "silo-1"), (2, "silo-1")]
        assert all("bad signature" in e["reason"] for e in rejected)
        assert all(sorted(e["silos"]) == ["silo-0", "silo-2"] for e in train)


@pytest.mark.parametrize(
    ("argv", "signed"),
    [
        pytest.param([], True, id="tls-default"),
        pytest.param(["--insecure"], False, id="insecure-default"),
        pytest.param(["--silo-registry", "none"], False, id="told-none"),
        pytest.param(["--insecure", "--silo-registry", "auto"], True, id="insecure-told-auto"),
        pytest.param(["--app", str(APP)], True, id="app-with-a-registry-setting"),
    ],
)
def test_deploy_local_signs_replies_by_default_with_tls(
    argv: list[str], signed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the command line as deploy-local reads it (nothing is started)
    from fl_lbbsp.cli import _deploy_federation, build_parser

    args = build_parser().parse_args(["deploy-local", "--workdir", str(tmp_path), *argv])

    # Execute
    fed = _deploy_federation(args)

    # Assert: signed = keys generated in the workdir, the registry given to the app
    expected = tmp_path.resolve() / "silo-keys" if signed else None
    assert fed.silo_keys == expected
    assert ("silo-registry" in fed.app_run_config()) is signed
    assert capsys.readouterr().err == ""


def test_deploy_local_notes_an_app_that_cannot_check_signatures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: an app that declares no silo-registry setting
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text("[tool.flwr.app.config]\nnum-server-rounds = 3\n")
    from fl_lbbsp.cli import _deploy_federation, build_parser

    args = build_parser().parse_args(
        ["deploy-local", "--workdir", str(tmp_path / "w"), "--app", str(app)]
    )

    # Execute
    fed = _deploy_federation(args)

    # Assert: unsigned (Flower would refuse the setting), said in one line
    err = capsys.readouterr().err.strip()
    assert fed.silo_keys is None and fed.app_run_config() == {}
    assert len(err.splitlines()) == 1 and "declares no silo-registry" in err
