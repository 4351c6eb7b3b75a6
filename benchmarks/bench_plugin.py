"""Section ``plugin``: a quickstart-style Flower app with LB-BSP plugged in, under
``flwr run`` on the Simulation Engine.

The app is ``tests/apps/quickstart_lbbsp`` (its own CNN on the embedded digits through
flwr-datasets, ``train_loss``, client-side evaluate; the README's plug-in diff applied), with
emulated slowdowns 1;2;4 on measured times (each silo waits out (k-1) times its measured
compute), on the Simulation Engine's default actor pool (on a 2-core machine: one Ray
actor, so the silos run one after the other and the server's wall time since the send holds
the queue; the claim check observes each reply's own compute interval instead). Every run
starts cold: a fresh SuperLink, Ray and ClientApp processes. Per run:

- whether the batch sizes are ordered like the speeds from round 2 on (the cold first
  round must not mislead the split);
- the median, over rounds 3 on, of the round time (the slowest silo's reported
  ``train-time``) over the oracle split's under the same noise: the split that knows every
  silo's true cost line ``k_i (a B + b)`` (one line fitted on every silo's unemulated compute
  times of the run), run with each silo's measured noise factor of that round
  (:func:`common.telemetry_oracle`);
- the same over the equal split's (FedAvg's split, under the same noise);
- how many claimed times the server replaced (an honest silo's, since every silo is), and
  whether the strategy named the queue (a pool of fewer actors than silos) once.

The goal's protocol (issue 38): 10 cold runs with the machine under 2 CPU burners, started
by the section itself (``--burners``; none in smoke mode) and stopped by pid when it ends.
FedAvg's rounds are its equal split under each round's measured noise (the same runs).

Run: ``python benchmarks/bench_plugin.py [--smoke] [--out DIR] [--runs N] [--rounds R]
[--burners N]``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tomllib
from common import ROOT, machine, parser, telemetry_oracle
from report import write_section

APP = ROOT / "tests" / "apps" / "quickstart_lbbsp"
SLOWDOWNS = (1.0, 2.0, 4.0)
_CONFIG = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
B_INIT, TAU = int(_CONFIG["batch-size"]), int(_CONFIG["local-steps"])
"""The app's own B_init and tau (its pyproject.toml)."""


def _flower_run() -> Any:
    """The tests' ``flwr run`` harness (tests/flower_run.py)."""
    spec = importlib.util.spec_from_file_location("flower_run", ROOT / "tests" / "flower_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_app(rounds: int, folder: Path) -> tuple[list[dict[str, Any]], str]:
    """One cold ``flwr run --stream`` of the app; its telemetry events and its output.

    Raises
    ------
    RuntimeError
        The run did not finish with a model (the output's tail says why).
    """
    telemetry = folder / "telemetry.jsonl"
    slowdowns = ";".join(f"{k:g}" for k in SLOWDOWNS)
    overrides = f"slowdowns='{slowdowns}' telemetry-path='{telemetry}'"
    done = _flower_run().run_app(
        APP,
        folder,
        overrides=f"num-server-rounds={rounds} {overrides}",
        declare='slowdowns = ""\ntelemetry-path = ""\n',
        timeout=1200,
    )
    output = done.stdout + done.stderr
    lines = telemetry.read_text().splitlines() if telemetry.exists() else []
    train = [e for e in map(json.loads, lines) if e.get("event") == "train"]
    if done.returncode != 0 or len(train) != rounds or "raised an exception" in output:
        raise RuntimeError(f"the run failed:\n{output[-3000:]}")
    return train, output


def judge(train: list[dict[str, Any]], output: str = "") -> dict[str, Any]:
    """Ordering from round 2, the median round time / oracle and / the equal split's
    from round 3, the claims replaced and whether the queue was named (in ``output``)."""
    ordered = True
    missing = [e["round"] for e in train if len(e["silos"]) < len(SLOWDOWNS)]
    if missing:  # a silo left out of a round (a missed deadline: the run's output says)
        print(f"silos missing in rounds {missing}:\n{output[-3000:]}", flush=True)
        train = [e for e in train if e["round"] not in missing]
        ordered = False
    for event in train[1:]:
        silos = event["silos"]
        sizes = [silos[str(p)]["batch-size"] for p in range(len(SLOWDOWNS))]
        steps = zip(sizes, sizes[1:], strict=False)
        ordered &= all(x >= y for x, y in steps) and sizes[0] > sizes[-1]
    warm = [e for e in train if e["round"] >= 2]
    xs = [float(r["batch-size"]) for e in warm for r in e["silos"].values()]
    ts = [float(r["compute-time"]) for e in warm for r in e["silos"].values()]
    a, b = np.polyfit(xs, ts, 1)
    a, b = max(float(a), 1e-9), max(float(b), 0.0)
    config = {"event": "config", "local_steps": TAU, "batch_size": B_INIT, "silos": 3}
    oracle = telemetry_oracle([config, *train], a, b, floor=1)
    rows = list(zip(oracle.rounds, oracle.round_time, oracle.oracle, oracle.equal, strict=True))
    return {
        "ordered_from_round_2": bool(ordered),
        "median_round_time_over_oracle": statistics.median(t / o for r, t, o, _ in rows if r >= 3),
        "median_round_time_over_equal": statistics.median(t / q for r, t, _, q in rows if r >= 3),
        "sizes": [[e["silos"][str(p)]["batch-size"] for p in range(3)] for e in train],
        "line": [a, b],
        "claims_replaced": output.count("claimed times of silo"),
        "queue_named": output.count("computed at a time"),
        "median_wall_from_round_3": statistics.median(
            float(e["wall_time"]) for e in train if e["round"] >= 3 and e.get("wall_time")
        ),
    }


@contextlib.contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` processes that each burn a CPU core while the block runs, stopped by pid
    after it (as ``.ci/with-cpu-burners``)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    flags = parser(__doc__.splitlines()[0])
    flags.add_argument("--runs", type=int, default=10, help="cold runs (default: 10)")
    flags.add_argument("--rounds", type=int, default=8, help="rounds a run (default: 8)")
    flags.add_argument("--burners", type=int, default=2, help="CPU burners (default: 2)")
    args = flags.parse_args(argv)
    runs = 2 if args.smoke else args.runs
    rounds = 4 if args.smoke else args.rounds
    burning = 0 if args.smoke else args.burners
    results = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    loads = []
    with burners(burning):
        for k in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                result = judge(*run_app(rounds, Path(tmp)))
            loads.append(os.getloadavg()[0])
            print(f"run {k + 1}/{runs}: {result}", flush=True)
            results.append(result)
    load_after = os.getloadavg()
    ordered = sum(r["ordered_from_round_2"] for r in results)
    medians = [r["median_round_time_over_oracle"] for r in results]
    equal = [r["median_round_time_over_equal"] for r in results]
    section = {
        "section": "plugin",
        "title": "Plug-in: a quickstart-style Flower app under flwr run, cold starts included",
        "setting": (
            f"`tests/apps/quickstart_lbbsp` (the README's plug-in diff on a quickstart-pytorch "
            f"style app: own CNN, embedded digits through flwr-datasets' IidPartitioner) under "
            f"`flwr run --stream` on the Simulation Engine with its default actor pool (one "
            f"Ray actor on this machine: the silos run one after the other), 3 SuperNodes, "
            f"emulated slowdowns 1;2;4 on measured times (each silo waits out (k-1) times its "
            f"measured compute; no cost model), B_init={B_INIT}, "
            f"tau={TAU}, {rounds} rounds, {runs} cold runs (a fresh SuperLink each), "
            f"{burning} CPU burners running beside them (the section's own). Emulated "
            "silos compute on one intra-op thread of torch (the emulation's, every silo, "
            "k = 1 included). FedAvg: the equal split under each round's measured noise. "
            "Oracle: "
            "the split knowing each silo's true line k_i (a B + b), a and b fitted on the run's "
            "unemulated compute times, under each silo's measured noise of the round. "
            f"Machine: {machine()}, load average {load_before[0]:.1f} before and "
            f"{load_after[0]:.1f} after (after each run: "
            f"{', '.join(f'{v:.1f}' for v in loads)}); {time.perf_counter() - started:.0f} s."
        ),
        "figures": [
            {
                "label": "runs whose batch sizes follow the speeds from round 2",
                "value": float(ordered),
                "format": ".0f",
                "unit": f"of {runs}",
                "goal": {"op": ">=", "target": float(runs)},
                "note": "sizes per round of each run in the JSON",
            },
            {
                "label": "median round time / oracle from round 3, worst run",
                "value": max(medians),
                "format": ".3f",
                "unit": "",
                "goal": {"op": "<=", "target": 1.15},
                "note": f"median of the runs {statistics.median(medians):.3f}",
            },
            {
                "label": "median round time / the equal split's from round 3, worst run",
                "value": max(equal),
                "format": ".3f",
                "unit": "",
                "goal": {"op": "<", "target": 1.0},
                "note": (
                    f"FedAvg's split under the same noise; median of the runs "
                    f"{statistics.median(equal):.3f}"
                ),
            },
            {
                "label": "honest claimed times the server replaced, all runs",
                "value": float(sum(r["claims_replaced"] for r in results)),
                "format": ".0f",
                "unit": "",
                "goal": {"op": "<=", "target": 0.0},
                "note": (
                    "the check observes each reply's own compute interval; runs that named "
                    f"the queue (pool smaller than the silos): "
                    f"{sum(r['queue_named'] > 0 for r in results)} of {runs}"
                ),
            },
        ],
        "tables": [
            {
                "columns": ["run", "ordered from round 2", "round time / oracle (median, r>=3)",
                            "round time / equal split (median, r>=3)",
                            "wall s per round (median, r>=3)",
                            "batch sizes per round (k = 1, 2, 4)"],
                "rows": [
                    [k + 1, "yes" if r["ordered_from_round_2"] else "no",
                     round(r["median_round_time_over_oracle"], 3),
                     round(r["median_round_time_over_equal"], 3),
                     round(r["median_wall_from_round_3"], 2),
                     " ".join("/".join(map(str, s)) for s in r["sizes"])]
                    for k, r in enumerate(results)
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
