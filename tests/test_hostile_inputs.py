"""Bad input from an unlucky operator or a hostile silo (issue 27, items 7 and 8): each is
refused with one line on stderr and exit code 2 by ``fl-lbbsp`` (run in process through
``main``), never a Python traceback; a reply's silo id is bounded on the server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FakeGrid, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_lbbsp.cli import main
from fl_lbbsp.security.silo_keys import write_silo_keys
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.checkpoint import write_checkpoint_key

LONG_ID = "s" * 1_000_000


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``fl-lbbsp argv``; assert exit code 2 with one stderr line and no traceback;
    return that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    assert len(err.splitlines()) == 1, err[:2000]
    assert "Traceback" not in err
    return err


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    """A plain file where a folder is expected."""
    path = tmp_path / "afile"
    path.write_text("not a folder\n")
    return path


SMALL = ["--silos", "3", "--model", "mlp", "--rounds", "1", "--in-process"]


# --------------------------------------------------------------------- run settings
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["simulate", *SMALL, "--batch-size", "1000000000"],
                     "over every silo's dataset", id="batch-1e9"),
        pytest.param(["cluster", "--schemes", "bsp", "--workers", "2", "--model", "mlp",
                      "--batch-size", "1000000000"], "over every worker's dataset",
                     id="cluster-batch-1e9"),
        pytest.param(["simulate", *SMALL, "--speeds", "1e308,1,1"], "times apart",
                     id="speeds-1e308"),
        pytest.param(["simulate", *SMALL, "--speeds", "inf,1,1"], "--speeds", id="speeds-inf"),
        pytest.param(["simulate", *SMALL, "--speeds", "nan,1,1"], "--speeds", id="speeds-nan"),
        pytest.param(["deploy-local", "--silos", "3", "--speeds", "1e308,1,1"], "times apart",
                     id="deploy-speeds-1e308"),
        pytest.param(["simulate", *SMALL, "--slowdown-schedules", "5:2,3:1;1;1"],
                     "out of order", id="schedule-unordered"),
        pytest.param(["simulate", *SMALL, "--slowdown-schedules", "1:1,1:2;1;1"],
                     "out of order", id="schedule-repeated"),
        pytest.param(["simulate", *SMALL, "--cost-model", "1"], "expected M,B",
                     id="cost-model-one"),
        pytest.param(["simulate", *SMALL, "--cost-model", "1,nan"], "--cost-model",
                     id="cost-model-nan"),
        pytest.param(["simulate", *SMALL, "--cost-model", "0,1"], "--cost-model",
                     id="cost-model-zero"),
        pytest.param(["simulate", *SMALL, "--cost-model", "1,2,3,4,5"], "--cost-model",
                     id="cost-model-five"),
        pytest.param(["simulate", *SMALL, "--cost-model", "1,-2"], "--cost-model",
                     id="cost-model-negative"),
        pytest.param(["simulate", *SMALL, "--target-accuracy", "2"], "(0, 1]", id="target-2"),
        pytest.param(["simulate", *SMALL, "--target-accuracy", "0"], "(0, 1]", id="target-0"),
        pytest.param(["simulate", *SMALL, "--target-accuracy", "nan"], "(0, 1]",
                     id="target-nan"),
        pytest.param(["cluster", "--target-accuracy", "1.5"], "(0, 1]", id="cluster-target"),
    ],
)  # fmt: skip
def test_bad_run_settings_are_refused_in_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused([*argv, *(["--out", str(tmp_path / "out")] if argv[0] != "deploy-local"
                             else ["--workdir", str(tmp_path / "w")])], capsys)  # fmt: skip

    # Assert
    assert message in err


def test_a_batch_that_cannot_fit_in_memory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: 1 MiB available (injected), a batch within every silo's data
    import fl_lbbsp.runs.config as run_config

    monkeypatch.setattr(run_config, "memory_available", lambda: 2**20)

    # Execute
    err = _refused(["simulate", *SMALL, "--batch-size", "200", "--out", str(tmp_path)], capsys)

    # Assert: the total batch and the fix
    assert "600 samples" in err and "use at most" in err


def test_the_batch_size_bound_names_the_largest_dataset_and_memory() -> None:
    # Prepare / Execute
    from fl_lbbsp.runs.config import batch_size_problem

    over_data = batch_size_problem(
        301, machines=3, largest_dataset=300, sample_bytes=100, available=10**9
    )
    over_memory = batch_size_problem(
        100, machines=3, largest_dataset=300, sample_bytes=10**6, available=10**8
    )
    fine = batch_size_problem(
        100, machines=3, largest_dataset=300, sample_bytes=10**5, available=10**8
    )

    # Assert
    assert over_data is not None and "use at most 300" in over_data
    assert over_memory is not None and "use at most 33" in over_memory
    assert fine is None


# ------------------------------------------------------------------ files, folders
def test_an_output_folder_that_is_a_file_is_refused(
    afile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused(["simulate", *SMALL, "--out", str(afile / "x")], capsys)

    # Assert
    assert err.startswith("fl-lbbsp: error: --out:") and "is not a directory" in err


def test_a_json_report_under_a_file_is_refused(
    afile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused(
        ["simulate", *SMALL, "--out", str(tmp_path), "--json", str(afile / "r.json")], capsys
    )

    # Assert
    assert "--json:" in err


def test_deploy_local_refuses_a_workdir_that_is_a_file(
    afile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused(["deploy-local", "--silos", "2", "--workdir", str(afile)], capsys)

    # Assert
    assert "--workdir" in err and "is not a directory" in err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["keys", "silos", "--silos", "2"], id="keys-silos"),
        pytest.param(["keys", "checkpoint"], id="keys-checkpoint"),
    ],
)
def test_key_output_under_a_file_is_one_line(
    argv: list[str], afile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused([*argv, "--out", str(afile / "x")], capsys)

    # Assert: the OS's reason, with the path
    assert str(afile) in err


# ----------------------------------------------------------------------- silo ids
@pytest.mark.parametrize(
    "ids", ["../x", "a/b", "a b", "", "x" * 129, LONG_ID, "ok,../../x", "\x00"]
)
def test_keys_silos_refuses_ids_outside_the_rule(
    ids: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    err = _refused(["keys", "silos", "--ids", ids, "--out", str(tmp_path / "k")], capsys)

    # Assert: the rule, a short line, nothing written
    assert "A-Z a-z 0-9 _ . -" in err and len(err) < 400
    assert not (tmp_path / "k").exists()


def test_a_registry_with_an_id_outside_the_rule_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a registry whose entry is renamed to a path
    files = write_silo_keys(tmp_path / "keys", ["0", "1", "2"])
    content = json.loads(files.registry.read_text())
    content["silos"]["../../x"] = content["silos"].pop("2")
    files.registry.write_text(json.dumps(content))

    # Execute
    err = _refused(
        ["simulate", *SMALL, "--silo-registry", str(tmp_path / "keys"), "--out", str(tmp_path)],
        capsys,
    )

    # Assert
    assert "--silo-registry" in err and "not a valid silo id" in err


def test_deploy_local_refuses_silo_ids_outside_the_rule(tmp_path: Path) -> None:
    # Prepare
    from fl_lbbsp.runs.deploy import LocalFederation
    from fl_lbbsp.security.identity import IdentityError

    # Execute / Assert
    with pytest.raises(IdentityError, match="not a valid silo id"):
        LocalFederation(tmp_path, num_silos=2, silo_ids=["ok", "../x"], insecure=True)


def _reply(node: int, silo: str) -> Any:
    arrays = ArrayRecord({"w": Array(np.ones(3, dtype=np.float32))})
    metrics = MetricRecord({"num-examples": 100, "train-time": 1.0, "batch-size": 32})
    content = RecordDict(
        {"arrays": arrays, "metrics": metrics, "silo": ConfigRecord({"silo-id": silo})}
    )
    return make_reply(content, node_id=node)


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize("silo", [LONG_ID, "../../x"])
def test_a_reply_claiming_an_id_outside_the_rule_is_rejected_in_a_short_line(
    silo: str, tmp_path: Path, fl_log: pytest.LogCaptureFixture
) -> None:
    # Prepare: no registry; node 13 claims a bad id
    strategy = LBBSPFedAvg(
        initial_batch_size=32, local_steps=10, lr=0.01, min_train_nodes=3,
        min_available_nodes=3, telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip
    strategy.configure_train(
        1, ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))}), ConfigRecord(),
        FakeGrid([11, 12, 13]),
    )  # fmt: skip

    # Execute
    arrays, _ = strategy.aggregate_train(1, [_reply(11, "a"), _reply(12, "b"), _reply(13, silo)])

    # Assert: the others aggregated; short lines naming the node's own id; no silo by
    # the claimed name in the telemetry
    assert arrays is not None
    lines = [r.getMessage() for r in fl_log.records if "rejected" in r.getMessage()]
    assert lines and all(len(line) < 1000 and "silo node-13 (node 13)" in line for line in lines)
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [e["silo"] for e in rejected] == ["node-13"]
    assert len(json.dumps(events)) < 20_000


# ------------------------------------------------------------ private key files
@pytest.mark.skipif(os.name != "posix", reason="file permissions as ssh reads them")
@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o604])
def test_a_signing_key_readable_by_others_is_refused_with_the_fix(
    mode: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    files = write_silo_keys(tmp_path / "keys", ["0", "1", "2"])
    files.keys["1"].chmod(mode)

    # Execute
    err = _refused(
        ["simulate", *SMALL, "--silo-registry", str(tmp_path / "keys"), "--out", str(tmp_path)],
        capsys,
    )

    # Assert
    assert f"{mode:04o}" in err and f"chmod 600 {files.keys['1']}" in err


@pytest.mark.skipif(os.name != "posix", reason="file permissions as ssh reads them")
def test_deploy_local_refuses_a_group_readable_signing_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    files = write_silo_keys(tmp_path / "keys", ["silo-0", "silo-1"])
    files.keys["silo-0"].chmod(0o640)

    # Execute
    err = _refused(
        ["deploy-local", "--silos", "2", "--silo-registry", str(tmp_path / "keys"),
         "--workdir", str(tmp_path / "w")], capsys,
    )  # fmt: skip

    # Assert
    assert "chmod 600" in err


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        pytest.param(None, 0o644, "chmod 600", id="readable"),
        pytest.param(b"short", 0o600, "fewer than 32", id="short"),
    ],
)
def test_a_checkpoint_key_that_cannot_be_trusted_is_refused(
    content: bytes | None,
    mode: int,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare
    key = write_checkpoint_key(tmp_path / "ckpt.key")
    if content is not None:
        key.write_bytes(content)
    key.chmod(mode)

    # Execute
    err = _refused(
        ["simulate", *SMALL, "--out", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"),
         "--checkpoint-key", str(key)], capsys,
    )  # fmt: skip

    # Assert
    assert err.startswith("fl-lbbsp: error: --checkpoint-key:") and message in err


def test_a_checkpoint_key_without_a_checkpoint_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    key = write_checkpoint_key(tmp_path / "ckpt.key")

    # Execute
    err = _refused(
        ["simulate", *SMALL, "--out", str(tmp_path), "--checkpoint-key", str(key)], capsys
    )

    # Assert
    assert "only with --checkpoint-dir" in err


def test_keys_checkpoint_writes_a_private_key_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    code = main(["keys", "checkpoint", "--out", str(tmp_path / "k")])
    first = (tmp_path / "k").read_bytes()
    err = _refused(["keys", "checkpoint", "--out", str(tmp_path / "k")], capsys)

    # Assert: 0600, 64 hex characters, not replaced without --force
    assert code == 0 and (tmp_path / "k").stat().st_mode & 0o777 == 0o600
    assert len(first.strip()) == 64 and int(first, 16) >= 0
    assert "--force" in err and (tmp_path / "k").read_bytes() == first


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("cpu-percent", 1e300, False),
        ("cpu-percent", -1.0, False),
        ("cpu-percent", 350.0, True),  # a process on several cores
        ("memory-percent", 1e300, False),
        ("memory-percent", 100.5, False),
        ("memory-percent", 42.0, True),
        ("he-time", -1.0, False),
    ],
)
def test_metric_ranges_are_checked_as_documented(key: str, value: float, accepted: bool) -> None:
    # Prepare: a well-formed reply's metrics, one of them set to value
    from fl_lbbsp.contract import InvalidReplyError, RecordKeys
    from fl_lbbsp.security.reply_screen import ReplyScreen

    keys = RecordKeys()
    validator = ReplyScreen(keys=keys, weight_key=keys.num_examples)
    metrics = {keys.num_examples: 100, keys.train_time: 0.5, keys.batch_size: 16, key: value}

    # Execute / Assert: docs/failures.md, "out of range ... rejected, naming key and value"
    if accepted:
        validator.check_metrics(metrics, sent_batch_size=16)
    else:
        with pytest.raises(InvalidReplyError, match=key):
            validator.check_metrics(metrics, sent_batch_size=16)
