"""What a new user meets first: a plaintext run without TenSEAL, one line per error with
its exit code (2 before round 1, 1 for a run that produced no model), readable logs."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lbbsp.cli import main
from fl_lbbsp.contract import error_summary
from fl_lbbsp.strategies.rounds import format_silos, natural_key
from fl_lbbsp.strategies.validation import log_rejected
from fl_lbbsp.telemetry import TelemetryWriter, read_telemetry

# A short in-process run; silo times come from a cost model, so nothing depends on load.
SHORT = [
    "--silos", "3", "--speeds", "4,2,1", "--rounds", "2", "--local-steps", "3",
    "--batch-size", "8", "--model", "mlp", "--partition", "iid", "--in-process",
    "--no-wait", "--quiet", "--cost-model", "0.001,0.002",
]  # fmt: skip

REAL_MNIST = Path(__file__).resolve().parents[2] / "shared/data/mnist"
NO_MNIST = pytest.mark.skipif(
    not (REAL_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
    reason=f"the real MNIST test set is not at {REAL_MNIST}",
)

NO_TENSEAL = "import sys; sys.modules['tenseal'] = None  # import tenseal fails\n"


def exit_code(argv: list[str]) -> int:
    """``fl-lbbsp argv``'s exit code, whether it returns or exits."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code or 0)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def run_without_tenseal(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = NO_TENSEAL + f"from fl_lbbsp.cli import main\nraise SystemExit(main({argv!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_a_plaintext_run_never_needs_tenseal(tmp_path: Path) -> None:
    # Execute: a whole comparison with `import tenseal` failing
    done = run_without_tenseal(["compare", *SHORT, "--out", str(tmp_path)], tmp_path)

    # Assert: it ran and reported, and no reply was rejected
    assert done.returncode == 0, done.stderr[-2000:]
    assert "round time / T*" in done.stdout
    events = read_telemetry(tmp_path / "lbbsp.jsonl")
    assert not [e for e in events if e["event"] == "rejected"]


def test_an_encrypted_run_without_tenseal_fails_before_round_1_naming_the_extra(
    tmp_path: Path,
) -> None:
    # Execute
    done = run_without_tenseal(
        ["simulate", *SHORT, "--encrypt", str(tmp_path / "keys"), "--out", str(tmp_path)],
        tmp_path,
    )

    # Assert: one line naming the extra; no telemetry, so no round was started
    assert done.returncode == 2
    assert "fl_lbbsp[he]" in one_line(done.stderr)
    assert not (tmp_path / "lbbsp.jsonl").exists()


def test_key_generation_without_tenseal_exits_2_naming_the_extra(tmp_path: Path) -> None:
    # Execute: its flags are made from CKKSConfig, which needs TenSEAL
    done = run_without_tenseal(["keys", "generate", "--out", str(tmp_path / "keys")], tmp_path)

    # Assert: one line naming the extra, no key written
    assert done.returncode == 2
    assert "fl_lbbsp[he]" in one_line(done.stderr)
    assert not (tmp_path / "keys").exists()


def test_a_run_whose_silos_all_fail_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a memory cap of 4 samples below the batch size of 8: every silo raises
    argv = ["simulate", *SHORT, "--cost-model", "0.001,0.002,0,4", "--out", str(tmp_path)]

    # Execute
    code = exit_code(argv)

    # Assert: exit 1 and one line with the silos' exception, never a report
    err = capsys.readouterr().err
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("fl-lbbsp: error: lbbsp: every silo failed in every round:")
    assert "OutOfMemoryError: batch size 8 exceeds this worker's memory cap 4" in last
    assert "Traceback" not in err
    assert not (tmp_path / "simulate.json").exists()


def test_each_rejected_reply_is_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: an error reply as Ray's backend words it, traceback included
    reason = (
        "error reply: <class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'"
        "ray::ClientAppActor.run() (pid=1, ip=1.2.3.4)\n"
        '  File "app.py", line 3, in train\n'
        "ModuleNotFoundError: No module named 'tenseal'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "ImportError: fl_lbbsp.crypto needs TenSEAL: pip install 'fl_lbbsp[he]'\n"
        "flwr.clientapp.client_app.ClientAppException: \n"
        "Exception ClientAppException occurred. Message: fl_lbbsp.crypto needs TenSEAL'>"
    )
    caplog.set_level(logging.DEBUG, logger="fl_lbbsp")

    # Execute
    entry = log_rejected(
        TelemetryWriter(tmp_path / "t.jsonl"),
        scheme="lbbsp", server_round=3, silo="2", node=7, reason=reason,
    )  # fmt: skip

    # Assert: one warning line with round, silo and the exception; the rest at DEBUG
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    line = warnings[0].getMessage()
    assert "\n" not in line
    assert line.startswith("round 3: reply of silo 2 (node 7) rejected:")
    assert "ImportError: fl_lbbsp.crypto needs TenSEAL: pip install 'fl_lbbsp[he]'" in line
    assert (
        entry["reason"] == "ImportError: fl_lbbsp.crypto needs TenSEAL: pip install 'fl_lbbsp[he]'"
    )
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("ModuleNotFoundError" in m for m in debug)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("ValueError: bad batch", "ValueError: bad batch"),
        ("<class 'KeyError'>:<'lr'>", "KeyError: lr"),
        (
            'Traceback (most recent call last):\n  File "x", line 1\n'
            "torch.OutOfMemoryError: CUDA out of memory\n",
            "OutOfMemoryError: CUDA out of memory",
        ),
        (
            "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\n"
            "Exception ClientAppException occurred. Message: disk full'>",
            "disk full",
        ),
        ("\n\nsomething odd\nhappened", "something odd"),
    ],
)
def test_error_summary_names_the_silos_own_exception(reason: str, expected: str) -> None:
    assert error_summary(reason) == expected


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--partition", "labels:11"], ["--partition labels:11", "11 classes", "10 classes"]),
        (["--partition", "dirichlet:0"], ["--partition"]),
    ],
)
def test_a_partition_the_data_cannot_give_is_refused_before_round_1(
    argv: list[str], names: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute
    code = exit_code(["simulate", *SHORT, *argv, "--out", str(tmp_path)])

    # Assert
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert all(name in line for name in names)
    assert not (tmp_path / "lbbsp.jsonl").exists()


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_round_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    not_a_folder = tmp_path / "checkpoints"
    not_a_folder.write_text("")

    # Execute
    code = exit_code(
        ["simulate", *SHORT, "--checkpoint-dir", str(not_a_folder), "--out", str(tmp_path)]
    )

    # Assert
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert f"--checkpoint-dir: {not_a_folder} is not a directory" in line
    assert not (tmp_path / "lbbsp.jsonl").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished 2-round run with checkpoints: (checkpoint dir, output dir)."""
    root = tmp_path_factory.mktemp("finished")
    argv = ["simulate", *SHORT, "--checkpoint-dir", str(root / "ckpt"), "--out", str(root / "out")]
    assert exit_code(argv) == 0
    return root / "ckpt", root / "out"


def _copy(run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    checkpoints, out = run
    shutil.copytree(checkpoints, tmp_path / "ckpt")
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "ckpt", tmp_path / "out"


@pytest.mark.parametrize(
    ("change", "field", "before", "after"),
    [
        (["--model", "lenet5"], "model", "'mlp'", "'lenet5'"),
        pytest.param(
            ["--dataset", f"mnist:{REAL_MNIST}"],
            "dataset",
            "'embedded'",
            repr(f"mnist:{REAL_MNIST}"),
            marks=NO_MNIST,
        ),  # fmt: skip
        (["--dataset", "embedded", "--silos", "4", "--speeds", "4,2,1,1"], "silos", "3", "4"),
        (["--partition", "labels:2"], "partition", "'iid'", "'labels:2'"),
        (["--seed", "7"], "seed", "0", "7"),
        (["--local-steps", "5"], "local_steps", "3", "5"),
        (["--lr", "0.1"], "lr", "0.05", "0.1"),
        (["--batch-size", "16"], "batch_size", "8", "16"),
        (["--estimator", "last"], "estimator", "'ema'", "'last'"),
        (["--allocator", "proportional"], "allocator", "'linear'", "'proportional'"),
    ],
)
def test_a_resume_with_other_settings_is_refused_naming_both_values(
    change: list[str],
    field: str,
    before: str,
    after: str,
    finished_run: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare
    checkpoints, out = _copy(finished_run, tmp_path)
    capsys.readouterr()

    # Execute: the same command with one setting changed (later flags win)
    code = exit_code(
        ["simulate", *SHORT, "--checkpoint-dir", str(checkpoints), "--out", str(out), *change]
    )

    # Assert
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert f"{field} {before} (now {after})" in line


def test_a_finished_run_rerun_with_a_new_out_reports_all_its_rounds(
    finished_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    checkpoints, _ = _copy(finished_run, tmp_path)
    capsys.readouterr()
    new_out = tmp_path / "elsewhere"

    # Execute
    code = exit_code(
        ["simulate", *SHORT, "--checkpoint-dir", str(checkpoints), "--out", str(new_out)]
    )

    # Assert: the earlier rounds' telemetry came along; the report has numbers, not NaN
    assert code == 0, capsys.readouterr().err
    report = json.loads((new_out / "simulate.json").read_text())["schemes"]["lbbsp"]
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert report["round_time_over_ideal"] > 0


def test_a_resume_without_the_earlier_telemetry_is_refused(
    finished_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the first run's output folder is gone
    checkpoints, out = _copy(finished_run, tmp_path)
    shutil.rmtree(out)
    run_file = next(checkpoints.glob("*/run.json"))
    saved = json.loads(run_file.read_text())
    saved["telemetry"] = str(out / "lbbsp.jsonl")
    run_file.write_text(json.dumps(saved))
    capsys.readouterr()

    # Execute
    code = exit_code(
        ["simulate", *SHORT, "--checkpoint-dir", str(checkpoints), "--out", str(tmp_path / "n")]
    )

    # Assert
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert "needs the telemetry of the earlier rounds" in line


def test_silo_ids_sort_naturally() -> None:
    assert sorted(["10", "2", "1"], key=natural_key) == ["1", "2", "10"]
    assert sorted(["silo-10", "silo-2", "a"], key=natural_key) == ["a", "silo-2", "silo-10"]


def test_per_silo_log_values_stay_short_with_many_silos() -> None:
    # Prepare: 1000 silos, silo 17 the largest
    sizes = {str(i): 40 + i % 9 for i in range(1000)} | {"17": 300}

    # Execute
    few = format_silos({"10": 3, "2": 5, "1": 4})
    many = format_silos(sizes, largest_label="largest")

    # Assert: natural order when few; a summary with the outliers when many
    assert few == "1=4 2=5 10=3"
    assert many.startswith("1000 silos: min 40 / median 44 / max 300; largest: 17=300")
    assert len(many) < 200


@pytest.mark.parametrize(
    ("source", "level", "message", "shown"),
    [
        ("vce_api.py", logging.ERROR, "Traceback (most recent call last): ...", False),
        ("raybackend.py", logging.ERROR, "An exception was raised when processing", False),
        ("vce_api.py", logging.WARNING, "a warning of the engine", True),
        ("run_simulation.py", logging.WARNING, "fraction_evaluate is set to 0.0. ...", False),
        ("logger.py", logging.WARNING, "DEPRECATED FEATURE: %s\n\n  This is a deprecated "
         "feature.", False),
        ("run_simulation.py", logging.ERROR, "the SuperLink is gone", True),
    ],
)  # fmt: skip
def test_the_cli_keeps_flowers_per_reply_tracebacks_and_known_notices_out(
    source: str, level: int, message: str, shown: bool
) -> None:
    # Prepare: the CLI's logging, as a run without --verbose sets it up
    from fl_lbbsp.cli import _setup_logging

    _setup_logging(quiet=False, verbose=False)
    # (Flower fills its deprecation notice in from an argument, as here)
    args = ("The `run_simulation` function is deprecated and will be removed",)
    record = logging.LogRecord(
        "flwr",
        level,
        f"/site-packages/flwr/{source}",
        1,
        message,
        args if "%s" in message else (),
        None,
    )

    # Execute
    passed = logging.getLogger("flwr").filter(record)

    # Assert
    assert bool(passed) is shown
