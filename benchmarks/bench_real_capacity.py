"""Real capacities and links: LB-BSP against FedAvg on a local deployment whose silos are
really slower (CPU quotas) or behind a really slow link (a rate-limited proxy), wall clock.

Each setting starts one ``deploy-local`` federation (TLS, SuperNode authentication, signed
replies, warm workers, 3 silos, LeNet-5 on the MNIST set, ``labels:2`` unless
``--partition`` says otherwise), with
:class:`~fl_lbbsp.runs.deploy.LocalFederation`'s ``cpu_quotas`` (a CPU group per silo)
and ``link_mbps`` (a proxy per limited silo), and runs the quickstart app on it, LB-BSP and
FedAvg in alternated pairs (LB-BSP first in even pairs, FedAvg first in odd ones), so
that the machine's load drifts over both alike. Nothing is emulated: no ``--speeds``, no
cost model; silos compute in parallel, each within its quota.

Per run, from the app's telemetry: each round's wall time (instructions sent -> all
replies in), the cumulative wall clock from the start of round 2 (round 1 is the cold
start, the same equal split for both schemes) to the end of each round, the accuracy of
the server's evaluation after each round, each silo's batch size, train-time and gap
(observed minus claimed time: its transfer and Flower's messaging).

The oracle: each silo's cost line ``t_i = a_i x + b_i`` (train-time of the round against
its batch size) fitted to every round of the setting's runs after the first (both
schemes), plus its median gap ``g_i``; the oracle split is the integer min-max split of
those curves (``b_i + g_i``: the transfer is a fixed per-round cost) under the default
noise budget (:func:`common.oracle_split`), and T* its real-valued bound
(:func:`common.ideal_time`). LB-BSP's steady round (median over rounds >= 3) is
compared with the oracle's predicted round, FedAvg's with T* (the per-round bound).

    python benchmarks/bench_real_capacity.py [--pairs 6] [--settings quota,link]
    python benchmarks/bench_real_capacity.py --smoke --out runs/demo-real   # make demo-real

Needs root and CPU groups (``fl_lbbsp.runs.deploy.cpu_groups.cpu_groups_problem``);
without them it writes nothing and says why.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    MNIST,
    RESULTS,
    dataset,
    ideal_time,
    machine,
    mean_ci,
    oracle_split,
    parser,
)
from report import write_section  # noqa: E402

from fl_lbbsp.clients.silo_setup import SiloSetup, silo_data, test_data  # noqa: E402
from fl_lbbsp.core.silo.costfit import fit_linear_cost  # noqa: E402
from fl_lbbsp.runs.deploy import LocalFederation, run_app  # noqa: E402
from fl_lbbsp.runs.deploy.cpu_groups import cpu_groups_problem  # noqa: E402
from fl_lbbsp.telemetry import read_telemetry  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "examples" / "quickstart"
SCHEMES = ("lbbsp", "fedavg")
GOALS = {  # issue 40
    "quota": {"time_to_target": 1.8},
    "link": {"time_to_target": 1.3},
    "oracle": 1.15,
    "accuracy_points": 0.5,
}


def settings(args: Any) -> dict[str, dict[str, Any]]:
    """The two settings: quotas only, and equal quotas with one silo behind a slow link."""
    return {
        "quota": {"cpu_quotas": args.quotas, "link_mbps": None},
        "link": {
            "cpu_quotas": [args.link_quota] * 3,
            "link_mbps": [None, None, args.link_rate],
        },
    }


def _load() -> float:
    return os.getloadavg()[0]


def run_rows(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's rounds, accuracies and cumulative wall clock from its telemetry."""
    trains = [e for e in events if e.get("event") == "train"]
    accuracy = {
        int(e["round"]): float(e["accuracy"]) for e in events if e.get("event") == "evaluate"
    }
    rounds = []
    start = None
    for e in trains:
        r = int(e["round"])
        if r == 2:
            start = float(e["sent_at"])
        silos = {
            silo: {
                "batch-size": s.get("batch-size"),
                "train-time": s.get("train-time"),
                "gap": _gap(s, float(e["sent_at"])),
                "transfer-time": s.get("transfer-time"),
                "num-examples": s.get("num-examples"),
            }
            for silo, s in e["silos"].items()
        }
        end = float(e["sent_at"]) + float(e["wall_time"])
        rounds.append({
            "round": r,
            "wall": float(e["wall_time"]),
            "elapsed": None if start is None else end - start,
            "accuracy": accuracy.get(r),
            "silos": silos,
        })  # fmt: skip
    return {"rounds": rounds}


def _gap(silo: dict[str, Any], sent_at: float) -> float | None:
    """Seconds the server waited for a silo's reply beyond its claimed compute: its
    start-up, its transfers, the messaging (``waited-time``; a run's telemetry from before
    the server recorded it: the reply's creation on the silo, the same clock on one
    machine, which leaves out the reply's own upload)."""
    claimed = silo.get("claimed-time")
    if claimed is None:
        return None
    if "waited-time" in silo:
        return float(silo["waited-time"]) - float(claimed)
    if "replied-at" in silo:
        return float(silo["replied-at"]) - sent_at - float(claimed)
    return None


def time_to(rounds: list[dict[str, Any]], target: float) -> float | None:
    """Wall clock from the start of round 2 to the end of the first round whose accuracy
    reaches ``target`` (``None``: never)."""
    for r in rounds:
        if r["round"] >= 2 and r["accuracy"] is not None and r["accuracy"] >= target:
            return float(r["elapsed"])
    return None


def final_accuracy(rounds: list[dict[str, Any]], last: int = 2) -> float:
    """Mean accuracy of the last ``last`` evaluated rounds (the plateau as far as reached)."""
    values = [r["accuracy"] for r in rounds if r["accuracy"] is not None][-last:]
    return float(np.mean(values))


def cost_curves(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each silo's cost line (train-time against batch size, rounds >= 2 of every run),
    median gap and dataset size."""
    points: dict[str, list[tuple[float, float, float | None]]] = {}
    sizes: dict[str, float] = {}
    for run in runs:
        for r in run["rounds"]:
            if r["round"] < 2:
                continue
            for silo, s in r["silos"].items():
                if s["batch-size"] and s["train-time"]:
                    points.setdefault(silo, []).append((s["batch-size"], s["train-time"], s["gap"]))
                if s["num-examples"]:
                    sizes[silo] = float(s["num-examples"])
    curves = {}
    for silo, pts in sorted(points.items()):
        x, t = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        line = fit_linear_cost(x, t, min_relative_spread=0.1)
        a, b = line if line is not None else (float(np.median(t / x)), 0.0)
        gaps = [p[2] for p in pts if p[2] is not None]
        curves[silo] = {
            "a": a,
            "b": b,
            "gap": float(np.median(gaps)) if gaps else 0.0,
            "num-examples": sizes.get(silo, 1.0),
            "points": len(pts),
        }
    return curves


def oracle(curves: dict[str, dict[str, float]], total: int) -> dict[str, Any]:
    """The oracle split of the measured curves (gaps as fixed costs), its predicted round,
    T*, and the equal split's predicted round."""
    silos = sorted(curves)
    a = np.array([curves[s]["a"] for s in silos])
    b = np.array([curves[s]["b"] + curves[s]["gap"] for s in silos])
    w = np.array([curves[s]["num-examples"] for s in silos])
    split = oracle_split(a, b, total, 1, weights=w / w.sum())
    equal = np.full(len(silos), total / len(silos))
    return {
        "split": dict(zip(silos, split.tolist(), strict=True)),
        "round": float(np.max(a * split + b)),
        "t_star": float(ideal_time(a, b, float(total), weights=w / w.sum())),
        "equal_round": float(np.max(a * equal + b)),
    }


def accuracy_ceiling(data: str, partition: str, num_silos: int, seed: int) -> dict[str, Any]:
    """The most a model trained on these silos can score on the server's test set: the
    share of its images whose class some silo holds (a class no silo holds is never
    learnt; with 3 silos, ``labels:2`` covers 6 of MNIST's 10 classes)."""
    setup = {"dataset": data, "partition": partition, "seed": seed, "model": "lenet5"}
    silos = SiloSetup(num_silos=num_silos, **setup)
    held = {int(c) for silo in range(num_silos) for c in np.unique(silo_data(silos, silo).y)}
    test = test_data(SiloSetup(num_silos=1, **setup)).y
    return {"classes": sorted(held), "share": float(np.isin(test, sorted(held)).mean())}


def steady(rounds: list[dict[str, Any]], first: int = 3) -> float:
    """Median wall time of the rounds from ``first`` on."""
    return float(statistics.median(r["wall"] for r in rounds if r["round"] >= first))


def run_setting(name: str, config: dict[str, Any], args: Any, data: str) -> dict[str, Any]:
    """The alternated pairs of one setting on one federation."""
    work = (args.work / name).resolve()
    runs: list[dict[str, Any]] = []
    with LocalFederation(
        work, num_silos=3, silo_registry="auto", cpu_weight=args.weight, **config
    ) as fed:
        for pair in range(args.pairs):
            order = SCHEMES if pair % 2 == 0 else SCHEMES[::-1]
            for scheme in order:
                tag = f"{name}-{pair}-{scheme}"
                telemetry = work / f"{tag}.jsonl"
                telemetry.unlink(missing_ok=True)
                load0, began = _load(), time.monotonic()
                outcome = run_app(
                    fed, APP, timeout=3600, name=tag,
                    run_config={
                        "num-server-rounds": args.rounds, "scheme": scheme,
                        "local-steps": args.local_steps, "batch-size": args.batch_size,
                        "dataset": data, "partition": args.partition, "model": "lenet5",
                        "min-nodes": 3, "telemetry": str(telemetry), "seed": pair,
                    },
                )  # fmt: skip
                if outcome.status != "finished:completed":
                    raise SystemExit(f"{tag}: {outcome.status}\n{outcome.output[-3000:]}")
                run = run_rows(read_telemetry(telemetry))
                run.update(scheme=scheme, pair=pair, load=[load0, _load()],
                           seconds=time.monotonic() - began)  # fmt: skip
                runs.append(run)
                print(f"{tag}: {run['seconds']:.0f} s, load {load0:.1f}-{_load():.1f}", flush=True)
    return {"config": config, "runs": runs}


def summarise(name: str, result: dict[str, Any], args: Any) -> dict[str, Any]:
    """Per pair and overall figures of one setting."""
    runs = result["runs"]
    fedavg_final = [final_accuracy(r["rounds"]) for r in runs if r["scheme"] == "fedavg"]
    target = args.target * float(np.mean(fedavg_final))
    curves = cost_curves(runs)
    best = oracle(curves, 3 * args.batch_size)
    pairs = []
    for p in range(args.pairs):
        lb, fa = (next(r for r in runs if r["pair"] == p and r["scheme"] == s) for s in SCHEMES)
        t_lb, t_fa = time_to(lb["rounds"], target), time_to(fa["rounds"], target)
        pairs.append({
            "pair": p,
            "first": "lbbsp" if p % 2 == 0 else "fedavg",
            "lbbsp_steady": steady(lb["rounds"]),
            "fedavg_steady": steady(fa["rounds"]),
            "lbbsp_time_to_target": t_lb,
            "fedavg_time_to_target": t_fa,
            "speed_up": None if not (t_lb and t_fa) else t_fa / t_lb,
            "lbbsp_final": final_accuracy(lb["rounds"]),
            "fedavg_final": final_accuracy(fa["rounds"]),
            "load": [lb["load"], fa["load"]],
        })  # fmt: skip
    ups = [p["speed_up"] for p in pairs if p["speed_up"] is not None]
    diffs = [100 * (p["lbbsp_final"] - p["fedavg_final"]) for p in pairs]
    lb_steady = float(np.median([p["lbbsp_steady"] for p in pairs]))
    fa_steady = float(np.median([p["fedavg_steady"] for p in pairs]))
    # the wall round beyond the slowest silo's compute and gap: aggregation, polling
    return {
        "target": target,
        "curves": curves,
        "oracle": best,
        "pairs": pairs,
        "speed_up": float(np.median(ups)) if len(ups) == len(pairs) else None,
        "lbbsp_steady": lb_steady,
        "fedavg_steady": fa_steady,
        "lbbsp_over_oracle": lb_steady / best["round"],
        "fedavg_over_t_star": fa_steady / best["t_star"],
        "accuracy_points": float(np.mean(diffs)),
        **paired_intervals(diffs, ups if len(ups) == len(pairs) else []),
    }


def paired_intervals(diffs: list[float], speed_ups: list[float]) -> dict[str, Any]:
    """95% intervals over the pairs (Student's t): of the accuracy difference in points
    (``accuracy_interval``), and of the speed-up's geometric mean, from its logarithms
    (``speed_up_interval``; ``None`` without a speed-up in every pair). A pair's two runs
    share the seed, the data and the machine's spell, so their difference is the unit."""
    logs = mean_ci([float(np.log(u)) for u in speed_ups]) if speed_ups else None
    return {
        "accuracy_interval": list(mean_ci(diffs)[1:]),
        "speed_up_interval": None if logs is None else [float(np.exp(x)) for x in logs],
    }


def section(
    results: dict[str, Any],
    args: Any,
    data: str,
    loads: list[float],
    ceiling: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``real-capacity`` section of REPORT.md (``ceiling``: :func:`accuracy_ceiling`
    of each pair's seed)."""
    figures, rows, notes = [], [], []
    shares = [c["share"] for c in ceiling]
    reach = f"{100 * min(shares):.1f}%" + (
        "" if max(shares) == min(shares) else f"-{100 * max(shares):.1f}%"
    )
    for name, s in results.items():
        goal = GOALS[name]["time_to_target"]
        what = (
            "quotas " + "/".join(f"{q:g}" for q in args.quotas)
            if name == "quota"
            else (
                f"quotas {args.link_quota:g}/{args.link_quota:g}/{args.link_quota:g}, silo-2 "
                f"behind {args.link_rate:g} Mbit/s"
            )
        )
        figures += [
            {"label": f"{what}: wall-clock time to target, FedAvg / LB-BSP (median pair)",
             "value": s["speed_up"], "format": ".2f", "unit": "x",
             "goal": {"op": ">=", "target": goal},
             "note": f"target {100 * s['target']:.1f}% ({args.target:g} x FedAvg's final)"
                     + _speed_up_interval(s.get("speed_up_interval"))},
            {"label": f"{what}: LB-BSP steady wall-clock round / oracle",
             "value": s["lbbsp_over_oracle"], "format": ".2f", "unit": "x",
             "goal": {"op": "<=", "target": GOALS["oracle"]},
             "note": f"{s['lbbsp_steady']:.1f} s against the oracle's "
                     f"{s['oracle']['round']:.1f} s"},
            {"label": f"{what}: per-round bound, FedAvg steady round / T*",
             "value": s["fedavg_over_t_star"], "format": ".2f", "unit": "x", "goal": None,
             "note": f"{s['fedavg_steady']:.1f} s against T* {s['oracle']['t_star']:.1f} s"},
            {"label": f"{what}: final accuracy, LB-BSP minus FedAvg",
             "value": s["accuracy_points"], "format": "+.2f", "unit": " points",
             "goal": {"op": ">=", "target": -GOALS["accuracy_points"]},
             "note": f"mean of the last 2 evaluations after {args.rounds} rounds"
                     + _accuracy_interval(s.get("accuracy_interval"), len(s["pairs"]))
                     + f"; the ceiling is {reach}"},
        ]  # fmt: skip
        for p in s["pairs"]:
            rows.append([
                what, p["pair"], p["first"],
                f"{p['lbbsp_steady']:.1f}", f"{p['fedavg_steady']:.1f}",
                _s(p["lbbsp_time_to_target"]), _s(p["fedavg_time_to_target"]),
                "n/a" if p["speed_up"] is None else f"{p['speed_up']:.2f}",
                f"{100 * p['lbbsp_final']:.1f}", f"{100 * p['fedavg_final']:.1f}",
                _range(p["load"][0] + p["load"][1]),
            ])  # fmt: skip
        curve = ", ".join(
            f"{silo}: {c['a'] * 1000:.1f} ms/sample + {c['b']:.2f} s, gap {c['gap']:.2f} s"
            for silo, c in s["curves"].items()
        )
        split = ", ".join(f"{silo} {x}" for silo, x in s["oracle"]["split"].items())
        notes.append(f"{what}: measured cost lines per round {curve}; oracle split {split}.")
    setting = (
        f"Wall clock on a real local deployment (`deploy-local`: TLS, SuperNode authentication, "
        f"signed replies, warm workers), 3 silos, LeNet-5 on {data}, partitioned "
        f"`{args.partition}` (the silos hold classes "
        f"{', '.join(str(c) for c in ceiling[0]['classes'])}: {reach} of the server's test "
        "images, the most any model trained on them can score), "
        f"{args.rounds} rounds, tau {args.local_steps}, B_init {args.batch_size} "
        f"(X = {3 * args.batch_size}), {args.pairs} alternated LB-BSP/FedAvg pairs per setting. "
        "Capacities are real: each silo's SuperNode, ClientApps and warm worker run in a "
        f"CPU group with a CFS quota (and a CPU weight of {args.weight:g} ordinary processes "
        "against the machine's other work); the slow link is a rate-limited TCP proxy on loopback. "
        "Nothing is emulated. Silos compute in parallel. The machine is shared "
        f"({machine()}): 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the "
        "runs, so a quota is an upper bound on a silo's capacity that other load can undercut."
    )
    return {
        "section": "real-capacity",
        "title": "Real capacities and links (CPU quotas, a slow link), wall clock",
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": "every pair",
                "columns": [
                    "setting",
                    "pair",
                    "first",
                    "LB-BSP round s",
                    "FedAvg round s",
                    "LB-BSP to target s",
                    "FedAvg to target s",
                    "speed-up",
                    "LB-BSP final %",
                    "FedAvg final %",
                    "load",
                ],
                "rows": rows,
            }
        ],  # fmt: skip
        "plots": [],
        "notes": notes,
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _speed_up_interval(interval: list[float] | None) -> str:
    if interval is None or not all(0 < x < float("inf") for x in interval):
        return ""  # one pair has no interval
    geo, low, high = interval
    return f"; geometric mean {geo:.2f}x, 95% interval {low:.2f}-{high:.2f}x over the pairs"


def _accuracy_interval(interval: list[float] | None, pairs: int) -> str:
    if interval is None or not all(abs(x) < float("inf") for x in interval):
        return ""  # one pair has no interval
    low, high = interval
    return f"; 95% interval {low:+.2f} to {high:+.2f} over the {pairs} pairs"


def _range(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"


def main() -> int:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--pairs", type=int, default=6)
    cli.add_argument("--rounds", type=int, default=8)
    cli.add_argument("--local-steps", type=int, default=300)
    cli.add_argument("--batch-size", type=int, default=64)
    cli.add_argument("--settings", default="quota,link")
    cli.add_argument("--partition", default="labels:2", help="the silos' partition (issue 40)")
    cli.add_argument("--quotas", type=lambda t: [float(q) for q in t.split(",")],
                     default=[1.0, 0.5, 0.25])  # fmt: skip
    cli.add_argument("--link-quota", type=float, default=0.5)
    cli.add_argument("--link-rate", type=float, default=1.0, help="Mbit/s of silo-2's link")
    cli.add_argument(
        "--weight", type=float, default=2.0,
        help="each silo's CPU weight against the machine's other work, in processes",
    )  # fmt: skip
    cli.add_argument("--target", type=float, default=0.95, help="x FedAvg's final accuracy")
    cli.add_argument("--work", type=Path, default=Path("runs/bench-real"))
    cli.add_argument(
        "--mnist", type=Path, default=MNIST,
        help="folder of the MNIST IDX files (default: shared/data/mnist beside the checkout; "
        "without them the embedded digits)",
    )  # fmt: skip
    args = cli.parse_args()
    if args.smoke:
        args.pairs, args.rounds, args.local_steps, args.settings = 1, 4, 60, "quota"
    signal.signal(signal.SIGTERM, _interrupt)  # a kill by pid tears the federation down too
    problem = cpu_groups_problem()
    if problem is not None:
        print(f"real-capacity: skipped, CPU groups cannot be made here: {problem}")
        return 0
    data, described = dataset(args.mnist)
    ceiling = [accuracy_ceiling(data, args.partition, 3, seed) for seed in range(args.pairs)]
    wanted = [s for s in args.settings.split(",") if s]
    loads = [_load()]
    raw, results = {}, {}
    for name in wanted:
        raw[name] = run_setting(name, settings(args)[name], args, data)
        loads += [x for run in raw[name]["runs"] for x in run["load"]]
        results[name] = summarise(name, raw[name], args)
    data = described
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "real-capacity-raw.json").write_text(json.dumps({"raw": raw, "summary": results}))
    out = args.out if not args.smoke or args.out != RESULTS else args.work
    path = write_section(section(results, args, data, loads, ceiling), out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
