"""Ctrl-C ends every fl-lbbsp command with one line and exit code 130, never a traceback;
``deploy-local`` keeps its own clean stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fl_lbbsp import cli_runs
from fl_lbbsp.cli import main
from fl_lbbsp.strategies.checkpoint import CheckpointStore


def exit_code(argv: list[str]) -> int:
    """``fl-lbbsp argv``'s exit code, whether it returns or exits."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code or 0)


def _interrupt_runs(monkeypatch: pytest.MonkeyPatch, *, after_rounds: int = 0) -> None:
    """Every scheme's run (simulation and cluster) raises KeyboardInterrupt, as Ctrl-C
    would, once its first ``after_rounds`` rounds are checkpointed (with a checkpoint
    folder); no data is loaded for the batch-size check."""

    def interrupted(config: Any) -> list[dict[str, Any]]:
        folder = config.checkpoint_path()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for server_round in range(1, after_rounds + 1):
                CheckpointStore(folder).path(server_round).write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_runs, "_check_batch_size", lambda config: None)
    monkeypatch.setattr("fl_lbbsp.runs.fl.run", interrupted)
    monkeypatch.setattr("fl_lbbsp.runs.cluster.run_cluster", interrupted)


@pytest.mark.parametrize(
    ("argv", "running"),
    [
        (["simulate", "--scheme", "lbbsp", "--silos", "3", "--rounds", "50"], "simulate lbbsp"),
        (["compare", "--schemes", "fedavg,lbbsp"], "compare fedavg"),
        (["cluster", "--schemes", "bsp,lbbsp"], "cluster bsp"),
    ],
)
def test_ctrl_c_in_a_run_ends_with_one_line_and_exit_code_130(
    argv: list[str],
    running: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Prepare
    _interrupt_runs(monkeypatch)

    # Execute
    code = exit_code([*argv, "--quiet", "--out", str(tmp_path / "out")])

    # Assert: which run stopped, in one line
    err = capsys.readouterr().err
    assert code == 130
    assert err == f"fl-lbbsp: interrupted: {running}\n"
    assert "Traceback" not in err


def test_ctrl_c_in_a_checkpointed_run_says_how_to_resume(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Prepare: interrupted once rounds 1-3 are checkpointed
    _interrupt_runs(monkeypatch, after_rounds=3)
    checkpoints = tmp_path / "ckpt"
    argv = ["simulate", "--scheme", "lbbsp", "--silos", "3", "--rounds", "50", "--in-process"]

    # Execute
    code = exit_code(
        [*argv, "--quiet", "--checkpoint-dir", str(checkpoints), "--out", str(tmp_path / "out")]
    )

    # Assert: the last round checkpointed and the folder to resume from, in one line
    err = capsys.readouterr().err
    assert code == 130
    assert err == (
        "fl-lbbsp: interrupted: simulate lbbsp (round 3 of 50 checkpointed); resume with the "
        f"same command and --checkpoint-dir {checkpoints}\n"
    )
    assert "Traceback" not in err


def test_ctrl_c_outside_a_run_ends_with_one_line_and_exit_code_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Prepare: Ctrl-C while a key is written
    def interrupted(*args: Any, **kwargs: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr("fl_lbbsp.strategies.checkpoint.write_checkpoint_key", interrupted)

    # Execute
    code = exit_code(["keys", "checkpoint", "--out", str(tmp_path / "key")])

    # Assert
    err = capsys.readouterr().err
    assert code == 130
    assert err == "fl-lbbsp: interrupted\n"


class _InterruptedFederation:
    """A local federation that Ctrl-C stops while it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _InterruptedFederation:
        raise KeyboardInterrupt

    def __exit__(self, *exc_info: object) -> None:
        pass


def test_ctrl_c_in_deploy_local_still_stops_the_federation_cleanly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Prepare
    monkeypatch.setattr("fl_lbbsp.runs.deploy.LocalFederation", _InterruptedFederation)

    # Execute
    code = exit_code(["deploy-local", "--insecure", "--workdir", str(tmp_path / "deploy")])

    # Assert: deploy-local's own stop and exit code 0, not the run commands' line
    err = capsys.readouterr().err
    assert code == 0
    assert err.strip() == "stopping the federation ..."
