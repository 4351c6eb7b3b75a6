"""The strategy's start-up line says how the rounds split the batch: FedAvg's B_init every
round without balancing (no balancer settings); with it, B_init until the silos' speeds are
known, then by speed: true of a fresh run and of one resumed from a checkpoint alike."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fl_lbbsp.strategies import LBBSPFedAvg

SETTINGS: dict[str, Any] = {
    "initial_batch_size": 48,
    "local_steps": 2,
    "lr": 0.01,
    "estimator": "ema",
    "alpha": 0.3,
    "allocator": "linear",
}
FEDAVG_LINE = (
    "FedAvg split: batch size 48 per silo every round | 2 local steps, lr 0.01 for every silo"
)
LBBSP_LINE = (
    "LB-BSP (lbbsp): batch size 48 per silo until the silos' speeds are known, then by speed "
    "| 2 local steps, lr 0.01 for every silo | speed estimate ema (alpha 0.3), allocator linear"
)


@pytest.mark.parametrize(
    ("balance", "expected"), [(False, FEDAVG_LINE), (True, LBBSP_LINE)], ids=["fedavg", "lbbsp"]
)
def test_the_start_up_line_says_how_the_batch_is_split(
    balance: bool, expected: str, fl_log: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # Prepare
    fl_log.set_level(logging.INFO, logger="fl_lbbsp")
    strategy = LBBSPFedAvg(**SETTINGS, balance=balance, telemetry_path=tmp_path / "t.jsonl")

    # Execute
    strategy.summary()

    # Assert: one line (each record is seen twice: on fl_lbbsp's logger and propagated)
    lines = {id(r): r.getMessage() for r in fl_log.records if r.name == "fl_lbbsp"}.values()
    assert [m for m in lines if m.startswith(("FedAvg split", "LB-BSP ("))] == [expected]
