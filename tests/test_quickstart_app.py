"""A Flower app written the way Flower's quickstart-pytorch is written (tests/apps: its
own CNN, data through flwr-datasets, ``train_loss``, client-side evaluate), switched to
LB-BSP with only the README's plug-in changes, run under ``flwr run``."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.telemetry import read_telemetry

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
BEFORE, AFTER = APPS / "quickstart_fedavg", APPS / "quickstart_lbbsp"
KEYS = RecordKeys()
SLOWDOWNS = (1.0, 2.0, 4.0)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_the_quickstart_app_with_lbbsp_plugged_in_runs_under_flwr_run(tmp_path: Path) -> None:
    # Prepare: a private Flower home and a copy of the app; emulated slowdowns 1;2;4 and
    # the telemetry file declared in the copy's run config (the test's own instruments:
    # Flower refuses --run-config keys the app does not declare); nothing else changes
    flwr = Path(sys.executable).parent / "flwr"
    if _port_taken(9091) or _port_taken(9092):
        pytest.skip("another SuperLink holds Flower's ServerAppIo/Fleet ports")
    app = tmp_path / "app"
    shutil.copytree(AFTER, app, ignore=shutil.ignore_patterns("__pycache__"))
    telemetry = tmp_path / "telemetry.jsonl"
    project = app / "pyproject.toml"
    declared = 'slowdowns = ""\ntelemetry-path = ""\n'
    project.write_text(
        project.read_text().replace(
            "[tool.flwr.app.config]\n", "[tool.flwr.app.config]\n" + declared
        )
    )
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(flwr.parent), os.environ.get("PATH", "")]),
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([str(app), os.environ.get("PYTHONPATH", "")]),
    }
    slowdowns = ";".join(f"{k:g}" for k in SLOWDOWNS)
    overrides = f"num-server-rounds=4 slowdowns='{slowdowns}' telemetry-path='{telemetry}'"
    command = [str(flwr), "run", str(app), "--stream", "--run-config", overrides]

    # Execute: generous limit, a 2-core machine starts Ray and 3 ClientApps per round
    try:
        done = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=800,
            check=False,
        )  # fmt: skip
    finally:  # stop the SuperLink flwr started in the background for this home, by pid
        home = str(tmp_path / "flwr-home")
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(home in part for part in proc.info["cmdline"] or ()):
                for child in proc.children(recursive=True):
                    child.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGTERM)
    output = done.stdout + done.stderr

    # Assert: rc 0, every reply accepted, one decision line per round in the stream, a
    # finite non-empty model saved, batch sizes ordered like the speeds from round 2
    assert done.returncode == 0, output[-4000:]
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
