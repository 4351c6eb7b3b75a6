"""Deployed round time against the slowest silo's compute, with Flower's 3 s reply polling
and with LBBSPFedAvg's finer ``poll-interval``.

Starts a local deployment (SuperLink + N SuperNodes, TLS, emulated speeds), runs the
quickstart app once per polling setting through ``flwr run``, and reports per round the
wall time of the round (messages pushed -> all replies aggregated), the slowest reported
compute time (emulated: silo i computes t, waits (k_i - 1) t, reports k_i t) and each
ClientApp's start-up time (Flower launches one ClientApp process per message).

    python benchmarks/deploy_round_time.py --out runs/bench-deploy

Writes ``deploy_round_time.json`` and ``deploy_round_time.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, default=3)
    parser.add_argument("--speeds", default="4,2,1", help="emulated capacities")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument(
        "--polls", default="0,0.1", help="poll-interval values; 0 = Flower's own 3 s loop"
    )
    parser.add_argument("--skip", type=int, default=1, help="first rounds left out per run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting, alternated")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-deploy"))
    args = parser.parse_args()

    speeds = [float(s) for s in args.speeds.split(",")]
    slowdowns = slowdowns_from_speeds(speeds)
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
        },
        "runs": {},
    }
    with LocalFederation(
        args.out / "federation",
        num_silos=args.silos,
        slowdowns=slowdowns,
        insecure=args.insecure,
    ) as fed:
        polls = [float(p) for p in args.polls.split(",")]
        for repeat in range(args.repeat):  # alternate the settings against load drift
            for poll in polls:
                label = "flower-3s" if poll <= 0 else f"poll-{poll:g}s"
                telemetry = (args.out / f"{label}-{repeat}.jsonl").resolve()
                telemetry.unlink(missing_ok=True)
                outcome = run_app(
                    fed,
                    APP,
                    run_config={
                        "num-server-rounds": args.rounds,
                        "local-steps": args.local_steps,
                        "batch-size": args.batch_size,
                        "model": args.model,
                        "min-nodes": args.silos,
                        "poll-interval": poll,
                        "telemetry": str(telemetry),
                    },
                    timeout=900,
                    name=f"{label}-{repeat}",
                )
                if outcome.status != "finished:completed":
                    raise SystemExit(
                        f"{label}: run ended {outcome.status}\n{outcome.output[-3000:]}"
                    )
                run = results["runs"].setdefault(
                    label, {"poll_interval": poll if poll > 0 else 3.0, "rounds": []}
                )
                run["rounds"] += _rounds(read_telemetry(telemetry))[args.skip :]
                print(label, repeat, f"{outcome.seconds:.1f} s", flush=True)
        for run in results["runs"].values():
            run["summary"] = _summary(run["rounds"])

    (args.out / "deploy_round_time.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"Deployed round time, {args.silos} silos, emulated speeds {args.speeds}, "
        f"{args.model}, tau={args.local_steps}, rounds {args.skip + 1}-{args.rounds} of "
        f"{args.repeat} runs per setting (shared 2-core machine)",
        "",
        "| replies polled | wall / round (s) | slowest compute (s) | wall - compute (s) "
        "| ClientApp start-up (s) | dispatch (s) | reply delay (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, run in results["runs"].items():
        s = run["summary"]
        lines.append(
            f"| {label} | {s['mean_wall']:.2f} | {s['mean_slowest_compute']:.2f} "
            f"| {s['mean_overhead']:.2f} | {s['mean_max_startup']:.2f} "
            f"| {s['mean_dispatch_delay']:.2f} | {s['mean_reply_delay']:.2f} |"
        )
    (args.out / "deploy_round_time.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
