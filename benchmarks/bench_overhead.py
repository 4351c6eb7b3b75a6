"""Benchmark section ``overhead``: what LB-BSP costs the server.

1. Balancer decision time: a ``BatchSizeBalancer`` with 10, 100, 1,000 and 10,000 silos
   (speeds spread 8x, costs with a fixed part, 5% timing noise) goes through rounds of
   "every silo reports, then allocate"; per allocator, the median over the rounds after
   the first two of the ``allocate`` call (the decision) and of the round's reports (log
   processing, the paper's other overhead).
2. Server-side time per round as a share of the round: an FL federation (LB-BSP and
   FedAvg, 5 silos of emulated capacities 16:8:8:4:4, LeNet-5) runs in this process
   (``fl_lbbsp.runs.inprocess.InProcessGrid``); the strategy's ``configure_train`` +
   ``aggregate_train`` time and the balancer's own time are set against the round time
   (the slowest silo's reported ``train-time``). Figures of the ``fl`` section that name an
   overhead are quoted when ``fl.json`` is in the results folder.

Run: ``python benchmarks/bench_overhead.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import dataset, machine, parser
from report import SectionError, validate_section, write_section

ALLOCATORS = ("linear", "proportional", "iterative")
DEFAULT_ALLOCATOR = "linear"  # BalancingConfig's default, what the strategies use


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full or smoke)."""

    silos: tuple[int, ...]
    rounds: int
    fl_rounds: int
    local_steps: int
    seed: int = 0


FULL = Settings(silos=(10, 100, 1000, 10000), rounds=20, fl_rounds=10, local_steps=20)
SMOKE = Settings(silos=(10, 100, 1000), rounds=4, fl_rounds=3, local_steps=2)


# ----------------------------------------------------------------- balancer decision time
def balancer_times(allocator: str, silos: int, rounds: int, seed: int) -> dict[str, float]:
    """Median seconds of ``allocate`` and of one round of reports, after two rounds."""
    from fl_lbbsp.core import BatchSizeBalancer, SiloReport

    rng = np.random.default_rng(seed)
    balancer = BatchSizeBalancer(
        initial_batch_size=32,
        allocator=allocator,
        max_change_ratio=2.0,  # type: ignore[arg-type]
    )
    ids = [f"silo-{i}" for i in range(silos)]
    per_sample = 1.0 / rng.uniform(50.0, 400.0, silos)
    fixed = rng.uniform(0.0, 0.05, silos)
    sizes = balancer.allocate(ids)
    decide, ingest = [], []
    for _ in range(rounds):
        noise = rng.uniform(0.95, 1.05, silos)
        reports = [
            SiloReport(
                batch_size=sizes[i],
                train_time=float((per_sample[k] * sizes[i] + fixed[k]) * noise[k]),
                cpu_percent=50.0,
                memory_percent=40.0,
            )
            for k, i in enumerate(ids)
        ]
        start = time.perf_counter()
        for silo, report in zip(ids, reports, strict=True):
            balancer.report(silo, report)
        ingest.append(time.perf_counter() - start)
        start = time.perf_counter()
        sizes = balancer.allocate(ids)
        decide.append(time.perf_counter() - start)
    skip = min(2, rounds - 1)
    return {
        "decision": statistics.median(decide[skip:]),
        "reports": statistics.median(ingest[skip:]),
    }


# -------------------------------------------------------------- server time per FL round
def _timed(function: Callable[..., Any], bucket: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - start)

    return wrapper


def fl_server_time(scheme: str, settings: Settings, spec: str) -> dict[str, float]:
    """Server-side seconds per round (whole strategy, and the balancer alone) and the
    round time, medians over the rounds after the first two, in process."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord

    from fl_lbbsp.clients.app import SiloSetup, make_client_app, silo_data
    from fl_lbbsp.models import build_model
    from fl_lbbsp.runs.inprocess import InProcessGrid
    from fl_lbbsp.strategies import LBBSPFedAvg

    logging.getLogger("flwr").setLevel(logging.WARNING)
    setup = SiloSetup(
        dataset=spec, partition="labels:2", num_silos=5, seed=settings.seed,
        slowdowns=("1", "2", "2", "4", "4"),
    )  # fmt: skip
    strategy = LBBSPFedAvg(
        initial_batch_size=32, local_steps=settings.local_steps, lr=0.05,
        balance=scheme == "lbbsp", fraction_evaluate=0.0, min_train_nodes=5,
        min_available_nodes=5,
    )  # fmt: skip
    balancer: list[float] = []
    strategy.balancer.report = _timed(strategy.balancer.report, balancer)  # type: ignore[method-assign]
    strategy.balancer.allocate = _timed(strategy.balancer.allocate, balancer)  # type: ignore[method-assign]
    grid = InProcessGrid(make_client_app(setup), num_nodes=5)
    torch.manual_seed(settings.seed)
    data = silo_data(setup, 0)
    model = build_model("lenet5", input_shape=data.input_shape, num_classes=data.num_classes)
    arrays = ArrayRecord(model.state_dict())
    server, balancing, rounds = [], [], []
    for server_round in range(1, settings.fl_rounds + 1):
        balancer.clear()
        start = time.perf_counter()
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        configure = time.perf_counter() - start
        replies = list(grid.send_and_receive(messages))
        start = time.perf_counter()
        aggregated, _ = strategy.aggregate_train(server_round, replies)
        server.append(configure + time.perf_counter() - start)
        balancing.append(sum(balancer))
        times = [r.content["metrics"]["train-time"] for r in replies if r.has_content()]
        rounds.append(float(max(times)))  # type: ignore[arg-type]
        if aggregated is not None:
            arrays = aggregated
    skip = min(2, settings.fl_rounds - 1)
    return {
        "server": statistics.median(server[skip:]),
        "balancer": statistics.median(balancing[skip:]),
        "round": statistics.median(rounds[skip:]),
    }


def fl_section_overheads(out: Path) -> list[list[str]]:
    """Rows quoting the ``fl`` section's figures that name an overhead, if it exists."""
    path = out / "fl.json"
    if not path.is_file():
        return []
    try:
        fl = validate_section(json.loads(path.read_text()), source=path.name)
    except (SectionError, json.JSONDecodeError) as err:
        return [["fl.json", f"unreadable: {err}", ""]]
    rows = []
    for figure in fl.get("figures", []):
        if "overhead" in figure["label"].lower() or "server" in figure["label"].lower():
            value = figure.get("value")
            text = "n/a" if value is None else format(value, figure.get("format", ".4g"))
            rows.append(
                [
                    figure["label"],
                    f"{text} {figure.get('unit', '')}".strip(),
                    figure.get("note", ""),
                ]
            )
    return rows


# ----------------------------------------------------------------------------- section
def section(
    decisions: dict[str, dict[int, dict[str, float]]],
    fl: dict[str, dict[str, float]],
    quoted: list[list[str]],
    settings: Settings,
    data: str,
    smoke: bool,
) -> dict[str, Any]:
    """The ``overhead`` section in the benchmark schema."""
    default = decisions[DEFAULT_ALLOCATOR]
    figures: list[dict[str, Any]] = []
    for n in settings.silos:
        figures.append(
            {
                "label": f"balancer decision time, {n:,} silos ({DEFAULT_ALLOCATOR} allocator)",
                "value": 1000 * default[n]["decision"],
                "format": ".3f",
                "unit": "ms",
                "goal": {"op": "<", "target": 1.0} if n == 1000 else None,
                "note": f"reports of the round: {1000 * default[n]['reports']:.1f} ms "
                f"({1e6 * default[n]['reports'] / n:.0f} µs per silo)",
            }
        )
    lb, fedavg = fl["lbbsp"], fl["fedavg"]
    figures += [
        {
            "label": "LB-BSP balancer time per round / round time (5 silos)",
            "value": lb["balancer"] / (lb["round"] + lb["server"]),
            "format": ".3%",
            "unit": "",
            "goal": {"op": "<", "target": 0.011},
            "note": f"{1000 * lb['balancer']:.2f} ms of reports and allocation against a "
            f"{lb['round']:.2f} s round; the paper (Sec. 5.6): under 1.1% with 96 workers",
        },
        {
            "label": "server-side time per round / round time, LB-BSP (5 silos)",
            "value": lb["server"] / (lb["round"] + lb["server"]),
            "format": ".2%",
            "unit": "",
            "goal": None,
            "note": f"{1000 * lb['server']:.1f} ms: configure_train + aggregate_train (FedAvg "
            "aggregation, balancer, telemetry)",
        },
        {
            "label": "server-side time per round, LB-BSP - FedAvg",
            "value": 1000 * (lb["server"] - fedavg["server"]),
            "format": ".2f",
            "unit": "ms",
            "goal": None,
            "note": f"FedAvg {1000 * fedavg['server']:.1f} ms per round (the same strategy with "
            "balancing off); single rounds vary by more than this on a shared machine",
        },
    ]
    rows = [
        [
            allocator,
            f"{n:,}",
            f"{1000 * decisions[allocator][n]['decision']:.3f}",
            f"{1000 * decisions[allocator][n]['reports']:.2f}",
            f"{1e6 * decisions[allocator][n]['reports'] / n:.1f}",
        ]
        for allocator in ALLOCATORS
        for n in settings.silos
    ]
    tables = [
        {
            "title": "Balancer time per round (median), every allocator",
            "columns": [
                "allocator",
                "silos",
                "decision: allocate (ms)",
                "reports of the round (ms)",
                "per report (µs)",
            ],
            "rows": rows,
        },
        {
            "title": "FL round, in process (median per round)",
            "columns": ["scheme", "round time (s)", "server-side (ms)", "balancer (ms)"],
            "rows": [
                [
                    name,
                    f"{r['round']:.3f}",
                    f"{1000 * r['server']:.2f}",
                    f"{1000 * r['balancer']:.3f}",
                ]
                for name, r in (("LB-BSP", lb), ("FedAvg", fedavg))
            ],
        },
    ]
    if quoted:
        tables.append(
            {
                "title": "Overhead figures of the FL section",
                "columns": ["figure", "value", "note"],
                "rows": quoted,
            }  # fmt: skip
        )
    setting = (
        f"{'SMOKE RUN (tiny, not a measurement). ' if smoke else ''}"
        f"Balancer: `BatchSizeBalancer(initial_batch_size=32, max_change_ratio=2)` with "
        f"{', '.join(f'{n:,}' for n in settings.silos)} silos whose per-sample costs spread 8x, "
        "with a fixed part of up to 50 ms and 5% noise; each of "
        f"{settings.rounds} rounds reports every silo (CPU, memory) and then allocates; medians "
        "over the rounds after the first two. The decision is the `allocate` call; the "
        "reports (the paper's log processing) include the linear allocator's per-silo cost "
        f"fit, made as each report arrives. FL: 5 silos on {data} (2 labels each), LeNet-5, "
        f"tau={settings.local_steps}, B_init=32, capacities 16:8:8:4:4 emulated (the silos "
        f"wait out their slowdown), {settings.fl_rounds} rounds of LB-BSP and of FedAvg "
        "through an in-process grid (messages serialised as on the wire, not sent); "
        "server-side time is the strategy's `configure_train` + `aggregate_train`, the round "
        "time the slowest silo's reported `train-time`; medians after round 2. "
        f"Machine: {machine()}."
    )
    notes = [
        "The default allocator is `linear` (what `LBBSPFedAvg` and `LBBSPCluster` use); "
        "`proportional` is Alg. 1, `iterative` Alg. 2.",
        "Each silo's cost fit is cached with its report, so `allocate` gathers one row per "
        "silo and solves the min-max with numpy: O(n log n).",
    ]
    if not quoted:
        notes.append("No fl.json in the results folder: no FL-section overheads quoted.")
    return {
        "section": "overhead",
        "title": "Overhead: balancer decision time and server-side time per round",
        "setting": setting,
        "figures": figures,
        "tables": tables,
        "plots": [],
        "notes": notes,
    }


def main() -> int:
    """Measure, write ``overhead.json``."""
    args = parser(__doc__.splitlines()[0]).parse_args()
    settings = SMOKE if args.smoke else FULL
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.ERROR)
    decisions: dict[str, dict[int, dict[str, float]]] = {}
    for allocator in ALLOCATORS:
        decisions[allocator] = {}
        for n in settings.silos:
            decisions[allocator][n] = balancer_times(allocator, n, settings.rounds, settings.seed)
            print(
                f"{allocator:>12} {n:>6} silos: allocate "
                f"{1000 * decisions[allocator][n]['decision']:8.3f} ms, reports "
                f"{1000 * decisions[allocator][n]['reports']:8.2f} ms",
                flush=True,
            )
    spec, data = dataset()
    fl = {scheme: fl_server_time(scheme, settings, spec) for scheme in ("lbbsp", "fedavg")}
    for scheme, r in fl.items():
        print(f"{scheme}: round {r['round']:.3f} s, server {1000 * r['server']:.2f} ms, "
              f"balancer {1000 * r['balancer']:.3f} ms")  # fmt: skip
    path = write_section(
        section(decisions, fl, fl_section_overheads(args.out), settings, data, args.smoke),
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
