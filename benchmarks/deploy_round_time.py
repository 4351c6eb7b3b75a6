"""Deployed round overhead (wall time minus the slowest silo's emulated compute), before and
after the warm silo worker, and the deployed LB-BSP/FedAvg wall-clock ratio against the
emulated one.

Part 1 starts a local deployment (SuperLink + N SuperNodes, TLS, SuperNode
authentication, signed replies: ``silo_registry="auto"``, emulated speeds) once per
setting and run, alternating the settings against load drift, runs the quickstart app
through ``flwr run`` and reports per round the wall time of the round (messages pushed ->
all replies aggregated), the slowest reported compute time (emulated: silo i computes t,
waits until k_i t has passed, reports k_i t), ClientApp start-up, dispatch and reply
delay. Settings:

- ``before``: no warm worker, Flower's SuperExec task poll (1 s): every ClientApp
  process imports torch and loads the data and the model;
- ``after``: a warm worker per silo (:mod:`fl_lbbsp.clients.warm`) and a 0.2 s task poll.

Part 2 (``--ratio-rounds`` > 0) runs LB-BSP and FedAvg on the ``after`` deployment with
an emulated cost model (``--cost-model``: every silo reports, and waits out,
``tau k (m B + b)``), so that each round computes >= 5 s, and compares the deployed
wall-clock ratio LB-BSP/FedAvg with the emulated one (sum of the slowest silo's
emulated compute per round).

    python benchmarks/deploy_round_time.py --out runs/bench-deploy

Writes ``deploy_round_time.json`` and ``deploy_round_time.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from fl_lbbsp.runs.deploy import LocalFederation, run_app, slowdowns_from_speeds
from fl_lbbsp.telemetry import read_telemetry

APP = Path(__file__).resolve().parent.parent / "examples" / "quickstart"


def _rounds(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    rows = []
    for e in events:
        if e.get("event") != "train":
            continue
        silos = e["silos"].values()
        rows.append(
            {
                "round": e["round"],
                "wall": e["wall_time"],
                "slowest_compute": e["round_time"],
                "max_startup": max(s.get("startup-time", 0.0) for s in silos),
                # what the slowest ClientApp process spent: start-up plus (emulated) compute
                "slowest_process": max(s.get("startup-time", 0.0) + s["train-time"] for s in silos),
                "batch_sizes": {k: v["batch-size"] for k, v in e["silos"].items()},
                # last reply created -> replies in the strategy (transfer + polling)
                "reply_delay": e["reply_delay"],
                # message sent -> ClientApp process started (SuperNode pull loop,
                # SuperExec task poll, process spawn), for the silo that replied last
                "dispatch_delay": _dispatch_delay(e),
            }
        )
    return rows


def _dispatch_delay(event: dict[str, Any]) -> float:
    last = max(event["silos"].values(), key=lambda s: s["replied-at"])
    started = last["replied-at"] - last["train-time"] - last.get("startup-time", 0.0)
    return float(started - event["sent_at"])


def _summary(steady: list[dict[str, Any]]) -> dict[str, float]:
    wall = statistics.mean(r["wall"] for r in steady)
    compute = statistics.mean(r["slowest_compute"] for r in steady)
    startup = statistics.mean(r["max_startup"] for r in steady)
    process = statistics.mean(r["slowest_process"] for r in steady)
    return {
        "rounds": len(steady),
        "mean_wall": wall,
        "mean_slowest_compute": compute,
        "mean_max_startup": startup,
        "mean_overhead": wall - compute,
        # push, SuperNode pull loop (3 s when idle), SuperExec task poll, reply pull
        "mean_messaging": wall - process,
        "mean_reply_delay": statistics.mean(r["reply_delay"] for r in steady),
        "mean_dispatch_delay": statistics.mean(r["dispatch_delay"] for r in steady),
    }


SETTINGS: dict[str, dict[str, Any]] = {
    "before": {"warm_workers": False, "task_poll_interval": None},
    "after": {"warm_workers": True, "task_poll_interval": 0.2},
}


def _load() -> float:
    return os.getloadavg()[0]


def _run(
    fed: LocalFederation, args: argparse.Namespace, name: str, config: dict[str, Any]
) -> tuple[list[dict[str, Any]], float, float]:
    telemetry = (args.out / f"{name}.jsonl").resolve()
    telemetry.unlink(missing_ok=True)
    load_before = _load()
    outcome = run_app(
        fed,
        APP,
        run_config={
            "local-steps": args.local_steps,
            "batch-size": args.batch_size,
            "model": args.model,
            "min-nodes": args.silos,
            "poll-interval": args.poll_interval,
            "telemetry": str(telemetry),
            **config,
        },
        timeout=1800,
        name=name,
    )
    if outcome.status != "finished:completed":
        raise SystemExit(f"{name}: run ended {outcome.status}\n{outcome.output[-3000:]}")
    rows = _rounds(read_telemetry(telemetry))[args.skip :]
    print(name, f"{outcome.seconds:.1f} s, load {load_before:.1f}-{_load():.1f}", flush=True)
    return rows, load_before, _load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, default=3)
    parser.add_argument("--speeds", default="4,2,1", help="emulated capacities")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="reply polling (s)")
    parser.add_argument("--settings", default="before,after", help=f"of {sorted(SETTINGS)}")
    parser.add_argument("--skip", type=int, default=1, help="first rounds left out per run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting, alternated")
    parser.add_argument(
        "--ratio-rounds", type=int, default=6, help="rounds per scheme of part 2 (0: skip it)"
    )
    parser.add_argument(
        "--cost-model",
        default="0.0025,0.005",
        help="part 2: emulated 'm,b' of the fastest silo (s per sample, s per step)",
    )
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-deploy"))
    args = parser.parse_args()

    speeds = [float(s) for s in args.speeds.split(",")]
    slowdowns = slowdowns_from_speeds(speeds)
    settings = [s for s in args.settings.split(",") if s]
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "setup": {
            "silos": args.silos,
            "speeds": speeds,
            "emulated": True,
            "rounds": args.rounds,
            "local_steps": args.local_steps,
            "batch_size": args.batch_size,
            "model": args.model,
            "tls": not args.insecure,
            "signed_replies": True,
            "poll_interval": args.poll_interval,
            "cpus": os.cpu_count(),
        },
        "runs": {},
        "ratio": {},
    }

    def federation(setting: str, name: str) -> LocalFederation:
        return LocalFederation(
            args.out / f"federation-{name}",
            num_silos=args.silos,
            slowdowns=slowdowns,
            insecure=args.insecure,
            silo_registry="auto",
            **SETTINGS[setting],
        )

    for repeat in range(args.repeat):  # alternate the settings against load drift
        for setting in settings:
            name = f"{setting}-{repeat}"
            with federation(setting, name) as fed:
                rows, l0, l1 = _run(fed, args, name, {"num-server-rounds": args.rounds})
            run = results["runs"].setdefault(setting, {**SETTINGS[setting], "rounds": []})
            run["rounds"] += rows
            run.setdefault("load", []).append([l0, l1])
    for run in results["runs"].values():
        run["summary"] = _summary(run["rounds"])

    if args.ratio_rounds > 0:
        with federation("after", "ratio") as fed:
            for scheme in ("lbbsp", "fedavg"):
                rows, l0, l1 = _run(
                    fed,
                    args,
                    f"ratio-{scheme}",
                    {
                        "num-server-rounds": args.ratio_rounds,
                        "scheme": scheme,
                        "cost-model": args.cost_model,
                    },
                )
                results["ratio"][scheme] = {
                    "rounds": rows,
                    "load": [l0, l1],
                    "summary": _summary(rows),
                }

    (args.out / "deploy_round_time.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"Deployed round time, {args.silos} silos, emulated speeds {args.speeds}, "
        f"{args.model}, tau={args.local_steps}, TLS, signed replies, reply polling "
        f"{args.poll_interval:g} s, rounds {args.skip + 1}-{args.rounds} of {args.repeat} "
        f"runs per setting ({os.cpu_count()}-core machine, other jobs running)",
        "",
        "| setting | wall / round (s) | slowest compute (s, emulated) | overhead: wall - compute "
        "(s) | ClientApp start-up (s) | dispatch (s) | reply delay (s) | load average |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, run in results["runs"].items():
        s = run["summary"]
        loads = [x for pair in run["load"] for x in pair]
        lines.append(
            f"| {label} | {s['mean_wall']:.2f} | {s['mean_slowest_compute']:.2f} "
            f"| {s['mean_overhead']:.2f} | {s['mean_max_startup']:.2f} "
            f"| {s['mean_dispatch_delay']:.2f} | {s['mean_reply_delay']:.2f} "
            f"| {min(loads):.1f}-{max(loads):.1f} |"
        )
    if results["ratio"]:
        lb, fa = results["ratio"]["lbbsp"]["summary"], results["ratio"]["fedavg"]["summary"]
        emulated = lb["mean_slowest_compute"] / fa["mean_slowest_compute"]
        deployed = lb["mean_wall"] / fa["mean_wall"]
        results["ratio"]["emulated_ratio"] = emulated
        results["ratio"]["deployed_ratio"] = deployed
        (args.out / "deploy_round_time.json").write_text(json.dumps(results, indent=2))
        lines += [
            "",
            f"LB-BSP vs FedAvg deployed ('after'), emulated cost model m,b = {args.cost_model} "
            f"(fastest silo), rounds {args.skip + 1}-{args.ratio_rounds}:",
            "",
            "| scheme | wall / round (s) | slowest compute (s, emulated) | overhead (s) "
            "| load average |",
            "|---|---|---|---|---|",
        ]
        for scheme in ("lbbsp", "fedavg"):
            r = results["ratio"][scheme]
            s = r["summary"]
            lines.append(
                f"| {scheme} | {s['mean_wall']:.2f} | {s['mean_slowest_compute']:.2f} "
                f"| {s['mean_overhead']:.2f} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
            )
        lines += [
            "",
            f"LB-BSP/FedAvg: emulated {emulated:.3f}, deployed wall-clock {deployed:.3f} "
            f"({100 * (deployed / emulated - 1):+.1f}%)",
        ]
    (args.out / "deploy_round_time.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
