"""The live progress display: fed by the telemetry file, round k of N, elapsed and
remaining time, last round's time / T* and idle; off with --quiet."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from fl_lbbsp.cli import main
from fl_lbbsp.runs.progress import RoundProgress, TelemetryFollower, round_ideal

# tau * (m * B + b) per silo, times its slowdown k: exact, load-free times
CONFIG = {
    "event": "config",
    "silos": 2,
    "batch_size": 10,
    "local_steps": 2,
    "speeds": [2.0, 1.0],
    "cost_model": "0.01,0.0",
}


def _train(server_round: int, sizes: tuple[int, int]) -> dict:  # type: ignore[type-arg]
    times = [2 * 0.01 * sizes[0], 2 * 2 * 0.01 * sizes[1]]  # k = 1 and 2
    return {
        "event": "train",
        "round": server_round,
        "round_time": max(times),
        "idle_fraction": 1 - (sum(times) / 2) / max(times),
        "total_batch_size": sum(sizes),
        "silos": {
            str(i): {"batch-size": b, "train-time": t}
            for i, (b, t) in enumerate(zip(sizes, times, strict=True))
        },
    }


def _write(path: Path, *events: dict) -> None:  # type: ignore[type-arg]
    with path.open("a", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def test_ideal_is_the_cost_models_t_star_and_a_proportional_estimate_otherwise() -> None:
    # Prepare: with b = 0, T* = X / sum v_i; v = 50 and 25 samples/s for tau = 2 steps
    event = _train(1, (10, 10))

    # Execute
    exact = round_ideal([CONFIG, event], event)
    estimated = round_ideal([event], event)  # no config: from the round's reports

    # Assert: both 20 / (1/0.02 + 1/0.04) * ... = 0.2667 s
    assert exact == pytest.approx(20 / (1 / 0.02 + 1 / 0.04))
    assert estimated == pytest.approx(exact)


def test_follower_reads_complete_lines_only_and_notices_a_restart(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "t.jsonl"
    follower = TelemetryFollower(path)

    # Execute / Assert: nothing yet, then a half-written line waits for its end
    assert follower.poll() == ([], False)
    path.write_text('{"a": 1}\n{"b": ')
    assert follower.poll() == ([{"a": 1}], False)
    with path.open("a") as f:
        f.write("2}\n")
    assert follower.poll() == ([{"b": 2}], False)
    path.write_text('{"c": 3}\n')  # a new run restarts the file
    assert follower.poll() == ([{"c": 3}], True)


def test_display_shows_round_k_of_n_times_ratio_and_idle(tmp_path: Path) -> None:
    # Prepare: a terminal console into a buffer, and a run that has done 2 of 5 rounds
    path = tmp_path / "telemetry.jsonl"
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200, color_system=None)
    _write(path, {"event": "config", "from": "an earlier run"}, _train(9, (1, 1)))

    # Execute: the earlier run's events are skipped, this run's followed
    with RoundProgress(
        path=path, total=5, label="lbbsp", console=console, refresh_seconds=60
    ) as progress:
        path.write_text("")  # the run restarts its telemetry
        progress.refresh()
        _write(path, CONFIG, _train(1, (10, 10)), _train(2, (13, 7)))
        progress.refresh()
        shown = progress.last, progress.done

    # Assert: round 2 took max(0.26, 0.28) s against T* = 0.2667 s; idle 1 - 0.27/0.28
    assert shown == ("| last 0.280 s = 1.05 T*, idle 3.6%", 2)
    text = buffer.getvalue()
    assert "lbbsp" in text and "2/5" in text and "1.05 T*" in text
    assert re.search(r"elapsed\s+\d+:\d\d:\d\d", text) and "left" in text


def test_a_skipped_round_is_shown_as_such(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "telemetry.jsonl"
    skipped = {"event": "train", "round": 1, "round_time": None, "silos": {}}
    console = Console(file=io.StringIO(), force_terminal=True, width=200)

    # Execute
    with RoundProgress(path=path, total=3, label="x", console=console) as progress:
        _write(path, CONFIG, skipped)
        progress.refresh()
        last = progress.last

    # Assert
    assert last == "| round 1 skipped"


def test_a_run_refused_before_round_1_draws_nothing(tmp_path: Path) -> None:
    # Prepare
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)

    # Execute: no telemetry event is ever written
    with RoundProgress(path=tmp_path / "none.jsonl", total=3, label="x", console=console):
        pass

    # Assert
    assert buffer.getvalue() == ""


SHORT = [
    "--silos", "3", "--speeds", "4,2,1", "--rounds", "2", "--local-steps", "3",
    "--batch-size", "8", "--model", "mlp", "--partition", "iid", "--in-process",
    "--no-wait", "--cost-model", "0.001,0.002",
]  # fmt: skip


@pytest.mark.parametrize(("quiet", "shown"), [(False, True), (True, False)])
def test_compare_shows_progress_unless_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet: bool, shown: bool
) -> None:
    # Prepare
    argv = ["compare", *SHORT, "--out", str(tmp_path), *(["--quiet"] if quiet else [])]

    # Execute
    assert main(argv) == 0

    # Assert: one finished display per scheme on stderr (not a terminal: drawn once),
    # with the last round's ratio to T*; the table stays alone on stdout
    out, err = capsys.readouterr()
    assert ("round 2/2" in err and "T*" in err) is shown
    assert ("fedavg" in err and "lbbsp" in err) or not shown
    assert "round 2/2" not in out and "round time / T*" in out
