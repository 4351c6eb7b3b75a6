"""Wall clock that follows the emulation: silos compute in shared slots, wait out their
slowdown from the moment they queued, and the federation is dilated to fit the slots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fl_lbbsp.clients.emulation import CostModel, compute_slot, emulated_time
from fl_lbbsp.runs.fl import SimulationConfig
from fl_lbbsp.runs.summary import slowdowns_at


class FakeClock:
    """A clock that moves only when told to, and records the sleeps asked of it."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("queued_for", "compute", "factor", "wait"),
    [
        (0.0, 1.0, 4.0, 3.0),  # no queue: (k - 1) t, as before
        (2.0, 1.0, 4.0, 1.0),  # 2 s in the queue count towards its 4 s round
        (5.0, 1.0, 4.0, 0.0),  # queued longer than its round: no wait, never negative
        (0.5, 2.0, 1.0, 0.0),  # the fastest silo only computes
    ],
)
def test_the_wait_ends_when_the_emulated_time_has_passed_since_the_silo_queued(
    queued_for: float, compute: float, factor: float, wait: float
) -> None:
    # Prepare: the silo queued at 100 s, waited for its slot, then computed
    clock = FakeClock(100.0 + queued_for + compute)

    # Execute
    reported = emulated_time(
        compute, factor, cost=None, batch_size=8, started=100.0, clock=clock, sleep=clock.sleep
    )

    # Assert
    assert reported == pytest.approx(factor * compute)
    assert sum(clock.slept) == pytest.approx(wait)


def test_a_cost_model_silo_reports_the_models_time_and_waits_it_out() -> None:
    # Prepare: 10 steps of 8 samples at 0.01 s/sample + 0.02 s/step, 2x slower: 2 s
    clock = FakeClock(50.5)

    # Execute
    reported = emulated_time(
        0.5, 2.0, cost=CostModel.parse("0.01,0.02"), batch_size=8, local_steps=10,
        started=50.0, clock=clock, sleep=clock.sleep,
    )  # fmt: skip

    # Assert
    assert reported == pytest.approx(2.0)
    assert clock.now == pytest.approx(52.0)


def _hold(folder: Path, slots: int, entered: threading.Event, release: threading.Event) -> None:
    with compute_slot(folder, slots=slots):
        entered.set()
        release.wait(60)


@pytest.mark.parametrize("slots", [1, 2])
def test_compute_slots_admit_that_many_silos_at_a_time(tmp_path: Path, slots: int) -> None:
    # Prepare: `slots` holders take every slot
    release = threading.Event()
    holders = []
    for _ in range(slots):
        entered = threading.Event()
        thread = threading.Thread(target=_hold, args=(tmp_path, slots, entered, release))
        thread.start()
        assert entered.wait(60)
        holders.append(thread)

    # Execute: one more silo asks for a slot
    late = threading.Event()
    waiting = threading.Thread(target=_hold, args=(tmp_path, slots, late, release))
    waiting.start()
    waiting.join(0.3)
    blocked = not late.is_set()  # it cannot have entered, however slow this machine is
    release.set()

    # Assert: it entered only once the others let go
    assert blocked
    assert late.wait(60)
    for thread in [*holders, waiting]:
        thread.join(60)


def test_no_slot_folder_means_no_waiting(tmp_path: Path) -> None:
    with compute_slot(None), compute_slot(None):
        pass  # two holders at once: nothing to wait for


@pytest.mark.parametrize(
    ("settings", "dilation"),
    [
        ({"speeds": (4.0, 2.0, 1.0, 1.0)}, 2.4),  # capacity 1 + 1/2 + 1/4 + 1/4 = 2
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "parallel": 2}, 1.2),
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "parallel": 4}, 1.0),
        ({}, 4.8),  # 4 silos of this machine's speed, one slot
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "emulate_wait": False}, 1.0),
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "runtime": "inprocess"}, 1.0),
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "cost_model": "0.001"}, 1.0),
        # silo 0 at a third from round 3: the capacity of rounds 1-2 bounds it
        ({"speeds": (4.0, 2.0, 1.0, 1.0), "slowdown_schedules": ("1:1,3:3", "1", "1", "1")}, 2.4),
    ],
)
def test_the_federation_is_dilated_to_fit_the_compute_slots(
    settings: dict[str, object], dilation: float
) -> None:
    # Execute
    config = SimulationConfig(silos=4, **settings)  # type: ignore[arg-type]

    # Assert: the dilation multiplies every silo's slowdown, for the silos and the report
    assert config.time_dilation == pytest.approx(dilation)
    base = SimulationConfig(silos=4, **{**settings, "emulate_wait": False})  # type: ignore[arg-type]
    for server_round in (1, 3):
        silo_side = [s.factor(server_round) for s in config.schedules()]
        expected = [dilation * s.factor(server_round) for s in base.schedules()]
        assert silo_side == pytest.approx(expected)
        report_side = slowdowns_at(config.model_dump(mode="json"), server_round)
        assert report_side == pytest.approx(silo_side)


@pytest.mark.slow
def test_wallclock_section_smoke_run_writes_a_valid_section(tmp_path: Path) -> None:
    # Prepare: the section's pipeline in process (its Ray runtime is run end to end by
    # tests/test_simulation.py); silos really wait, one after the other
    root = Path(__file__).resolve().parents[1]
    command = [
        sys.executable, str(root / "benchmarks" / "bench_wallclock.py"), "--smoke",
        "--runtime", "inprocess", "--out", str(tmp_path),
    ]  # fmt: skip

    # Execute
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=root, check=False,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip

    # Assert: the section validates, says how it ran, and compares both schemes in both clocks
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sys.path.insert(0, str(root / "benchmarks"))
    import report  # type: ignore[import-not-found]

    data = report.validate_section(json.loads((tmp_path / "wallclock.json").read_text()))
    assert data["section"] == "wallclock" and "runtime inprocess" in data["setting"]
    labels = [f["label"] for f in data["figures"]]
    assert "LB-BSP / FedAvg round time, emulated" in labels
    assert "LB-BSP / FedAvg round time, wall clock" in labels
    assert {row[0] for row in data["tables"][0]["rows"]} == {"fedavg", "lbbsp"}
    assert all(float(v) > 0 for row in data["tables"][0]["rows"] for v in row[2:4])


@pytest.mark.parametrize(
    ("env", "niceness"),
    [(None, 0), ("15", None), ("5", None)],
    ids=["default", "ray-default-asked-for", "user-set"],
)
def test_simulated_silos_run_at_normal_priority_unless_the_user_says(
    env: str | None, niceness: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: Ray's own default starts workers at niceness 15, starved by any busy process
    from fl_lbbsp.runs.engine import ray_init_args

    if env is None:
        monkeypatch.delenv("RAY_worker_niceness", raising=False)
    else:
        monkeypatch.setenv("RAY_worker_niceness", env)

    # Execute
    args = ray_init_args(2)

    # Assert: niceness 0 asked of Ray, or the user's environment left to Ray
    assert args["num_cpus"] == 2 and args["include_dashboard"] is False
    assert args.get("_system_config", {}).get("worker_niceness") == niceness
