"""Checkpoint faults (issue 39, "Smaller faults"): a run asked to checkpoint that writes
none ends with an error, never an rc 0; a writer killed mid-write leaves no temporary
file at the next start; the refusal of an unkeyed checkpoint under a key says how to
resume safely, never "resume without the key"."""

from __future__ import annotations

import errno
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord

from fl_lbbsp.cli import main
from fl_lbbsp.clients.app import SiloSetup, make_client_app
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.checkpoint import CheckpointKeyError, CheckpointStore
from fl_lbbsp.strategies.checkpointing import Checkpointing

pytestmark = pytest.mark.usefixtures("flower_task")

KEY = b"k" * 32


def _initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(build_model("mlp", input_shape=(1, 32, 32), num_classes=10).state_dict())


class FullDisk(CheckpointStore):
    """A folder whose disk fills up before round ``full_from``'s checkpoint."""

    def __init__(self, directory: Path, *, full_from: int) -> None:
        super().__init__(directory)
        self.full_from = full_from

    def save(self, server_round: int, **parts: Any) -> Path:
        if server_round >= self.full_from:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path(server_round)))
        return super().save(server_round, **parts)


def _run(store: CheckpointStore, rounds: int) -> Any:
    strategy = LBBSPFedAvg(
        initial_batch_size=8,
        local_steps=1,
        lr=0.05,
        min_train_nodes=3,
        min_available_nodes=3,
        fraction_evaluate=0.0,
        telemetry_path=store.directory.parent / "telemetry.jsonl",
    )
    grid = InProcessGrid(make_client_app(SiloSetup(num_silos=3, model="mlp")), num_nodes=3)
    return Checkpointing(strategy, store=store).start(
        grid=strategy.deadline_grid(grid, timeout=60),
        initial_arrays=_initial(),
        num_rounds=rounds,
        evaluate_fn=lambda r, a: MetricRecord({"round": r}),
    )


def test_a_run_that_writes_no_checkpoint_ends_with_an_error(tmp_path: Path) -> None:
    # Prepare: a disk full from round 1 on
    from fl_lbbsp.strategies.checkpoint import CheckpointWriteError

    store = FullDisk(tmp_path / "ckpt", full_from=1)

    # Execute
    with pytest.raises(CheckpointWriteError) as info:
        _run(store, 2)

    # Assert: one line naming the folder and the cause; the run's result kept on it
    message = str(info.value)
    assert "\n" not in message and str(store.directory) in message
    assert "No space left on device" in message and "2 rounds" in message
    assert info.value.result is not None and sorted(info.value.result.train_metrics_clientapp)
    assert store.rounds() == []


def test_a_run_whose_later_checkpoints_fail_names_the_newest_at_the_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a disk that fills up after round 1's checkpoint
    store = FullDisk(tmp_path / "ckpt", full_from=2)

    # Execute
    with caplog.at_level(logging.ERROR, logger="fl_lbbsp"):
        result = _run(store, 3)

    # Assert: the run ends, and its last error line names the checkpoint a rerun resumes
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert store.rounds() == [1]
    last = caplog.records[-1].getMessage()
    assert "rounds 2-3" in last and "round-000001.ckpt" in last


def test_cli_run_that_writes_no_checkpoint_exits_non_zero_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: files of this process limited to 256 KB (a checkpoint is about 560 KB, the
    # telemetry a few KB): every checkpoint write fails as on a full disk
    resource = pytest.importorskip("resource")
    argv = ["simulate", "--silos", "3", "--model", "mlp", "--rounds", "2", "--in-process",
            "--quiet", "--no-wait", "--local-steps", "1", "--batch-size", "8",
            "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, limits[1]))
    try:
        # Execute
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)

    # Assert: exit 1 and one last line that says no checkpoint was written
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("fl-lbbsp: error:") and "no checkpoint written" in err[-1]
    assert not list((tmp_path / "ckpt" / "lbbsp").glob("*.ckpt"))


_KILLED_WRITER = """
import resource, signal, sys
import numpy as np
from flwr.app import Array, ArrayRecord
from fl_lbbsp.strategies.checkpoint import CheckpointStore

arrays = ArrayRecord({"w": Array(np.zeros(100_000, np.float32))})
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # the kernel kills the writer mid-write
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
CheckpointStore(sys.argv[1]).save(1, arrays=arrays, manifest={}, state={})
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file-size limits")
@pytest.mark.parametrize("next_start", ["resume", "save"])
def test_a_temporary_file_a_killed_writer_left_is_cleaned(tmp_path: Path, next_start: str) -> None:
    # Prepare: a writer killed by the kernel half-way through its checkpoint
    folder = tmp_path / "ckpt"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(folder)], cwd=tmp_path, check=False
    )
    assert killed.returncode == -signal.SIGXFSZ
    left = [p.name for p in folder.iterdir()]
    assert len(left) == 1 and left[0].endswith(".tmp"), left

    # Execute: the next run in that folder resumes (finds nothing) or saves a round
    store = CheckpointStore(folder)
    if next_start == "resume":
        assert store.latest() is None
    else:
        store.save(2, arrays=ArrayRecord({"w": Array(np.ones(3))}), manifest={}, state={})

    # Assert: the half-written file is gone, the new checkpoint alone is there
    expected = [] if next_start == "resume" else ["round-000002.ckpt"]
    assert sorted(p.name for p in folder.iterdir()) == expected


def test_the_unkeyed_checkpoints_refusal_advises_a_safe_resume(tmp_path: Path) -> None:
    # Prepare: a checkpoint written without a key
    arrays = ArrayRecord({"w": Array(np.ones(3))})
    CheckpointStore(tmp_path).save(1, arrays=arrays, manifest={}, state={})

    # Execute
    with pytest.raises(CheckpointKeyError) as info:
        CheckpointStore(tmp_path, key=KEY).latest()

    # Assert: start afresh under the key, or re-sign what you trust; never drop the key
    message = str(info.value)
    assert "without --checkpoint-key" not in message and "resume without" not in message
    assert "start afresh" in message and "keys checkpoint --out KEY --sign" in message


def test_cli_re_signs_trusted_checkpoints_under_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: an unkeyed checkpoint, a key file
    from fl_lbbsp.strategies.checkpointing import save_checkpoint

    folder = tmp_path / "ckpt"
    strategy = LBBSPFedAvg(initial_batch_size=8, local_steps=1, lr=0.05)
    save_checkpoint(CheckpointStore(folder), strategy, 1, ArrayRecord({"w": Array(np.ones(3))}))
    assert main(["keys", "checkpoint", "--out", str(tmp_path / "key")]) == 0
    key = (tmp_path / "key").read_bytes().strip()

    # Execute
    code = main(["keys", "checkpoint", "--out", str(tmp_path / "key"), "--sign", str(folder)])

    again = main(["keys", "checkpoint", "--out", str(tmp_path / "key"), "--sign", str(folder)])

    # Assert: the key kept, the file now read under it (signing twice is signing once),
    # and no longer without it
    assert code == again == 0 and (tmp_path / "key").read_bytes().strip() == key
    store = CheckpointStore(folder, key=key)
    assert store.load(store.path(1)).server_round == 1
    assert "round-000001.ckpt" in capsys.readouterr().out
    with pytest.raises(CheckpointKeyError, match="give the same key"):
        CheckpointStore(folder).latest()
