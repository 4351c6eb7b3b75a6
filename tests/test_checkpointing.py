"""The checkpointing wrapper (fl_lbbsp.strategies.checkpointing): it checkpoints the
strategy it wraps after every round and alone shifts the round numbers of a resumed run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, Result

from fl_lbbsp.clients.app import SiloSetup, make_client_app
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.checkpoint import CheckpointStore
from fl_lbbsp.strategies.checkpointing import Checkpointing
from fl_lbbsp.strategies.outcomes import NoUpdateError

pytestmark = pytest.mark.usefixtures("flower_task")


def _initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(build_model("mlp", input_shape=(1, 32, 32), num_classes=10).state_dict())


def _run(
    folder: Path, grid: InProcessGrid, rounds: int, telemetry: Path, evaluated: list[int]
) -> Result:
    """``rounds`` rounds of a new LBBSPFedAvg (no checkpoint_dir of its own) inside a new
    wrapper on ``folder``; ``evaluate_fn`` notes the rounds it is called with."""
    strategy = LBBSPFedAvg(
        initial_batch_size=8,
        local_steps=1,
        lr=0.05,
        min_train_nodes=3,
        min_available_nodes=3,
        fraction_evaluate=0.0,
        telemetry_path=telemetry,
    )

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        evaluated.append(server_round)
        return MetricRecord({"round": server_round})

    return Checkpointing(strategy, store=CheckpointStore(folder)).start(
        grid=strategy.deadline_grid(grid, timeout=60),
        initial_arrays=_initial(),
        num_rounds=rounds,
        evaluate_fn=evaluate,
    )


def _train_rounds(telemetry: Path) -> list[int]:
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    return [e["round"] for e in events if e["event"] == "train"]


@pytest.fixture(scope="module")
def grid() -> InProcessGrid:
    return InProcessGrid(make_client_app(SiloSetup(num_silos=3, model="mlp")), num_nodes=3)


def test_a_resumed_run_goes_on_with_its_real_round_numbers(
    grid: InProcessGrid, tmp_path: Path
) -> None:
    # Prepare: a run of 2 rounds, checkpointed
    folder, telemetry = tmp_path / "ckpt", tmp_path / "telemetry.jsonl"
    first: list[int] = []
    _run(folder, grid, 2, telemetry, first)

    # Execute: a new strategy and wrapper on the same folder, 4 rounds in all
    evaluated: list[int] = []
    result = _run(folder, grid, 4, telemetry, evaluated)

    # Assert: rounds 3 and 4 only, under their own numbers everywhere
    assert first == [0, 1, 2]
    assert evaluated == [2, 3, 4]
    assert sorted(result.train_metrics_clientapp) == [3, 4]
    assert sorted(result.evaluate_metrics_serverapp) == [2, 3, 4]
    assert _train_rounds(telemetry) == [1, 2, 3, 4]
    assert CheckpointStore(folder).rounds() == [3, 4]


def test_a_finished_run_is_not_run_again(grid: InProcessGrid, tmp_path: Path) -> None:
    # Prepare
    folder, telemetry = tmp_path / "ckpt", tmp_path / "telemetry.jsonl"
    _run(folder, grid, 2, telemetry, [])
    saved = CheckpointStore(folder).latest()
    assert saved is not None

    # Execute
    evaluated: list[int] = []
    result = _run(folder, grid, 2, telemetry, evaluated)

    # Assert: the checkpoint's model, nothing sent or evaluated
    assert evaluated == []
    assert result.train_metrics_clientapp == {}
    assert list(result.arrays.keys()) == list(saved.arrays.keys())
    assert _train_rounds(telemetry) == [1, 2]


def test_a_round_that_stops_the_run_writes_no_checkpoint(tmp_path: Path) -> None:
    # Prepare: silos whose every train reply is an error
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Any:
        raise RuntimeError("this silo always fails")

    grid = InProcessGrid(app, num_nodes=3)
    folder = tmp_path / "ckpt"

    # Execute
    with pytest.raises(NoUpdateError):
        _run(folder, grid, 2, tmp_path / "telemetry.jsonl", [])

    # Assert
    assert CheckpointStore(folder).rounds() == []


@pytest.mark.parametrize("strategy", [FedAvg(), object()], ids=["flower-fedavg", "not-a-strategy"])
def test_a_strategy_without_checkpoint_state_is_refused(strategy: Any, tmp_path: Path) -> None:
    # Execute / Assert: refused when wrapped, before any round
    with pytest.raises(TypeError, match="offers no checkpoint state"):
        Checkpointing(strategy, store=CheckpointStore(tmp_path))


def test_a_resume_checks_the_checkpoints_model_with_numpys_blas_on_one_thread(
    grid: InProcessGrid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a checkpointed run of 1 round; BLAS allowed 2 threads in this process (under
    # Flower's simulation a resume hung for good in OpenBLAS, in the model's norm); record
    # what the check of the checkpoint's arrays sees
    from threadpoolctl import threadpool_info, threadpool_limits

    from fl_lbbsp.strategies import checkpointing

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    if not blas_threads():
        pytest.skip("numpy has no BLAS library that threadpoolctl can hold")
    folder, telemetry = tmp_path / "ckpt", tmp_path / "telemetry.jsonl"
    _run(folder, grid, 1, telemetry, [])
    seen: list[int] = []
    check = checkpointing.check_arrays

    def spy(*args: Any, **kwargs: Any) -> None:
        seen.extend(blas_threads())
        check(*args, **kwargs)

    monkeypatch.setattr(checkpointing, "check_arrays", spy)

    # Execute: the resume
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("this BLAS cannot run 2 threads")
        _run(folder, grid, 2, telemetry, [])
        after = blas_threads()

    # Assert: one thread in the check, the process's setting restored after it
    assert seen and set(seen) == {1}
    assert after == {2}
