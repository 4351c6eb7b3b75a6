"""A Flower app written the way Flower's quickstart-pytorch is written (tests/apps: its
own CNN, data through flwr-datasets, ``train_loss``, client-side evaluate), switched to
LB-BSP with only the README's plug-in changes, run under ``flwr run``."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from flower_run import flower_ports_taken, run_app

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.telemetry import read_telemetry

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
BEFORE, AFTER = APPS / "quickstart_fedavg", APPS / "quickstart_lbbsp"
KEYS = RecordKeys()
SLOWDOWNS = (1.0, 2.0, 4.0)
COST_MODEL = "0.001,0.002"
"""Emulated seconds per sample and per step of the fastest silo."""


def plugin_diff() -> str:
    """The unified diff from the app as written to the app with LB-BSP plugged in."""
    parts = []
    for before in sorted(BEFORE.rglob("*")):
        if before.is_dir() or "__pycache__" in before.parts:
            continue
        name = before.relative_to(BEFORE).as_posix()
        old = before.read_text().splitlines(keepends=True)
        new = (AFTER / name).read_text().splitlines(keepends=True)
        parts.extend(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}", n=1))
    return "".join(parts)


def test_the_readmes_plugin_section_is_exactly_the_apps_diff() -> None:
    # Prepare
    readme = (ROOT / "README.md").read_text()

    # Execute: the fenced diff under the plug-in marker
    found = re.search(r"<!-- plug-in diff -->\n```diff\n(.*?)```", readme, re.DOTALL)

    # Assert
    assert found is not None, "README.md has no plug-in diff block"
    assert found.group(1) == plugin_diff()


@pytest.mark.slow
def test_the_quickstart_app_with_lbbsp_plugged_in_runs_under_flwr_run(tmp_path: Path) -> None:
    # Prepare: emulated slowdowns 1;2;4 over an emulated cost model (the silos report
    # tau k (m B + b), not their wall clock, so the order asserted below holds on a busy
    # machine) and the telemetry file, declared in the copy's run config (the test's own
    # instruments: Flower refuses --run-config keys the app does not declare); nothing
    # else of the app changes
    if flower_ports_taken():
        pytest.skip("another SuperLink holds Flower's ServerAppIo/Fleet ports")
    telemetry = tmp_path / "telemetry.jsonl"
    slowdowns = ";".join(f"{k:g}" for k in SLOWDOWNS)

    # Execute
    done = run_app(
        AFTER,
        tmp_path,
        overrides=f"num-server-rounds=4 slowdowns='{slowdowns}' telemetry-path='{telemetry}' "
        f"cost-model='{COST_MODEL}'",
        declare='slowdowns = ""\ntelemetry-path = ""\ncost-model = ""\n',
    )
    output = done.stdout + done.stderr

    # Assert: rc 0, every reply accepted, one decision line per round in the stream, a
    # finite non-empty model saved, batch sizes ordered like the speeds from round 2
    assert done.returncode == 0 and "raised an exception" not in output, output[-4000:]
    rounds = [e for e in read_telemetry(telemetry) if e["event"] == "train"]
    assert len(rounds) == 4 and all(e["rejected"] == [] for e in rounds), output[-4000:]
    for k in range(1, 5):
        assert f"[lbbsp] round {k}: B " in output, output[-4000:]
    for event in rounds[1:]:
        silos = event["silos"]
        by_speed = sorted(silos, key=lambda s: SLOWDOWNS[int(s)])
        sizes = [silos[s][KEYS.batch_size] for s in by_speed]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1], sizes
    saved = list(tmp_path.rglob("final_model.pt"))
    if saved:  # where the ServerApp's working folder is in this tree
        import torch

        state = torch.load(saved[0])
        assert state and all(torch.isfinite(v).all() for v in state.values())
