"""Section ``setup``: how long a newcomer's ``make demo`` runs, and whether it shows the gain.

Times ``make demo`` on this checkout with its ``.venv`` already installed: the Makefile's
install step (pip finds everything satisfied) and the run of ``fl-lbbsp compare`` it makes.
``make install`` is timed alone first, so the run's time is the difference. The demo's own
report (its ``--json``) gives LB-BSP's and FedAvg's steady round time over T* and the
time-to-target speed-up: the gain the newcomer is shown. The first install of a fresh clone
(downloading torch and Flower) is not timed here: it depends on the network and the wheel
cache, not on this project.

Run: ``python benchmarks/bench_setup.py [--smoke] [--out DIR] [--repeats N]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, machine, parser
from report import write_section

GOAL_RUN_S = 90.0  # issue 28: the demo's run, after the install, on a quiet machine
GOAL_SPEEDUP = 1.5


def timed_make(target: str, *variables: str) -> float:
    """Seconds ``make <target>`` took in the repository root.

    Raises
    ------
    RuntimeError
        If make failed (its output's tail says why).
    """
    started = time.perf_counter()
    done = subprocess.run(
        ["make", "--no-print-directory", target, *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"make {target} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds


def demo_figures(report: dict[str, Any]) -> dict[str, float]:
    """The gain a demo report (``fl-lbbsp compare --json``) shows: both schemes' steady
    round time over T*, LB-BSP's time-to-target speed-up over FedAvg and its final accuracy
    minus FedAvg's.

    Raises
    ------
    ValueError
        If a scheme never reached the target (no speed-up to show).
    """
    fedavg, lbbsp = report["schemes"]["fedavg"], report["schemes"]["lbbsp"]
    if fedavg["time_to_target"] is None or lbbsp["time_to_target"] is None:
        raise ValueError("a scheme of the demo never reached the target accuracy")
    return {
        "fedavg_over_ideal": fedavg["round_time_over_ideal"],
        "lbbsp_over_ideal": lbbsp["round_time_over_ideal"],
        "speedup": fedavg["time_to_target"] / lbbsp["time_to_target"],
        "accuracy_diff": lbbsp["final_accuracy"] - fedavg["final_accuracy"],
    }


def demo_once(folder: Path) -> dict[str, Any]:
    """One ``make install`` and one ``make demo`` into ``folder``: their seconds and the demo's
    figures (:func:`demo_figures`)."""
    install = timed_make("install")
    demo = timed_make("demo", f"OUT={folder}")
    report = json.loads((folder / "report.json").read_text())
    return {
        "install_s": install,
        "demo_s": demo,
        "run_s": demo - install,
        **demo_figures(report),
    }


def main(argv: list[str] | None = None) -> int:
    flags = parser(__doc__.splitlines()[0])
    flags.add_argument("--repeats", type=int, default=3, help="make demo runs (default: 3)")
    args = flags.parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    load_before = os.getloadavg()
    started = time.perf_counter()
    runs = []
    for k in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(demo_once(Path(tmp)))
        print(f"make demo {k + 1}/{repeats}: {runs[-1]}", flush=True)
    load_after = os.getloadavg()
    run_s = statistics.median(r["run_s"] for r in runs)
    last = runs[-1]
    section = {
        "section": "setup",
        "title": "Setup: make demo's run on an installed checkout",
        "setting": (
            f"`make demo` ({repeats} times) on this checkout with `.venv` installed, each "
            "after a timed `make install` (nothing left to download); the run is the "
            "difference. The demo: `fl-lbbsp compare` on 5 silos of capacities 16:8:8:4:4, "
            "embedded digits, labels:2, MLP, 20 rounds, tau 40, B_init 48, silos in process, "
            "times from the cost model 1e-4,5e-4 (deterministic: the figures below do not "
            f"depend on the load). Machine: {machine()}, load average {load_before[0]:.1f} "
            f"before and {load_after[0]:.1f} after; {time.perf_counter() - started:.0f} s."
        ),
        "figures": [
            {
                "label": "make demo's run after the install, median",
                "value": run_s,
                "format": ".0f",
                "unit": "s",
                "goal": {"op": "<=", "target": GOAL_RUN_S},
                "note": "runs: " + ", ".join(f"{r['run_s']:.0f} s" for r in runs)
                + "; the install step: "
                + ", ".join(f"{r['install_s']:.0f} s" for r in runs),
            },
            {
                "label": "the demo's time-to-target speed-up of LB-BSP over FedAvg",
                "value": last["speedup"],
                "format": ".2f",
                "unit": "x",
                "goal": {"op": ">=", "target": GOAL_SPEEDUP},
                "note": f"final accuracy LB-BSP - FedAvg {100 * last['accuracy_diff']:+.1f} "
                "points",
            },
            {
                "label": "the demo's steady round time / T*, LB-BSP (FedAvg)",
                "value": last["lbbsp_over_ideal"],
                "format": ".3f",
                "unit": "",
                "goal": None,
                "note": f"FedAvg {last['fedavg_over_ideal']:.3f}",
            },
        ],
        "tables": [
            {
                "columns": ["run", "make install (s)", "make demo (s)", "run (s)",
                            "speed-up", "LB-BSP / T*", "FedAvg / T*"],
                "rows": [
                    [k + 1, round(r["install_s"], 1), round(r["demo_s"], 1),
                     round(r["run_s"], 1), round(r["speedup"], 2),
                     round(r["lbbsp_over_ideal"], 3), round(r["fedavg_over_ideal"], 3)]
                    for k, r in enumerate(runs)
                ],
            }
        ],
        "plots": [],
        "notes": [],
    }  # fmt: skip
    write_section(section, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
