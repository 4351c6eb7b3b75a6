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
3. Aggregation at scale: 10, 100 and 1,000 silos each reply with a LeNet-5-sized update
   (61,706 float32, the 32x32 model of ``fl_lbbsp.models``); on the same reply Messages,
   built once, the server time of one round (``configure_train`` + ``aggregate_train``)
   of Flower's own ``flwr.serverapp.strategy.FedAvg``, of ``LBBSPFedAvg`` with telemetry
   off and on, and of the in-place ``fl_lbbsp.core.WeightedMean`` alone (on the updates
   decoded beforehand, and decoding them with ``Array.numpy()`` as Flower does). They run
   interleaved, in a rotating order, for several repetitions; each ratio is the median
   over the repetitions of a time divided by Flower's FedAvg time in the same repetition.
   ``LBBSPFedAvg`` is driven only through Flower's Strategy API, so the figures follow
   whatever aggregation path the strategy has.

Run: ``python benchmarks/bench_overhead.py [--smoke] [--out DIR] [--balancer-only]``
(``--balancer-only``: parts 1 and 2, printed, nothing written).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
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
    aggregation_silos: tuple[int, ...]
    aggregation_repeats: int
    seed: int = 0


FULL = Settings(
    silos=(10, 100, 1000, 10000), rounds=20, fl_rounds=10, local_steps=20,
    aggregation_silos=(10, 100, 1000), aggregation_repeats=7,
)  # fmt: skip
SMOKE = Settings(
    silos=(10, 100, 1000), rounds=4, fl_rounds=3, local_steps=2,
    aggregation_silos=(10, 100), aggregation_repeats=1,
)  # fmt: skip

# The server-side aggregations compared at scale, Flower's FedAvg first (the reference).
AGGREGATIONS = ("flower", "lbbsp", "lbbsp-telemetry", "weighted-mean", "weighted-mean-decode")
AGGREGATION_LABELS = {
    "flower": "Flower FedAvg",
    "lbbsp": "LB-BSP",
    "lbbsp-telemetry": "LB-BSP, telemetry on",
    "weighted-mean": "WeightedMean alone",
    "weighted-mean-decode": "WeightedMean + Array.numpy()",
}
AGGREGATION_GOAL_SILOS = 1000  # issue 15: at 1,000 silos LB-BSP's server time is lower
# What balancing may add to a server's round: its work per round (the reports and the
# allocation) at most this share of the round Flower's own FedAvg takes on the same replies.
BALANCER_SHARE_GOAL = 0.05


# ----------------------------------------------------------------- balancer decision time
def balancer_times(allocator: str, silos: int, rounds: int, seed: int) -> dict[str, float]:
    """Median seconds of ``allocate`` and of one round of reports, after two rounds."""
    from fl_lbbsp.core import BatchSizeBalancer, SiloReport
    from fl_lbbsp.core.settings import BalancingKnobs

    rng = np.random.default_rng(seed)
    balancer = BatchSizeBalancer(
        initial_batch_size=32, knobs=BalancingKnobs(allocator=allocator, max_change_ratio=2.0)
    )
    ids = [f"silo-{i}" for i in range(silos)]
    per_sample = 1.0 / rng.uniform(50.0, 400.0, silos)
    fixed = rng.uniform(0.0, 0.05, silos)
    sizes = balancer.allocate(ids)
    decide, ingest = [], []
    for _ in range(rounds):
        noise = rng.uniform(0.95, 1.05, silos)
        reports = {
            i: SiloReport(
                batch_size=sizes[i],
                train_time=float((per_sample[k] * sizes[i] + fixed[k]) * noise[k]),
                cpu_percent=50.0,
                memory_percent=40.0,
            )
            for k, i in enumerate(ids)
        }
        start = time.perf_counter()
        balancer.report_round(reports)
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
    strategy.balancer.report_round = _timed(strategy.balancer.report_round, balancer)  # type: ignore[method-assign]
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


# ------------------------------------------------------- aggregation at 10 to 1,000 silos
def lenet5_reference() -> dict[str, np.ndarray]:
    """The global model of the comparison: LeNet-5 on 32x32 grey images (61,706
    float32), as named and shaped by ``fl_lbbsp.models``."""
    import torch

    from fl_lbbsp.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet5", input_shape=(1, 32, 32), num_classes=10)
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


def train_replies(
    reference: dict[str, np.ndarray], node_ids: list[int], *, batch_size: int, seed: int
) -> list[Any]:
    """One train reply per node, as a silo sends it: its own update of the reference's
    names, shapes and dtypes, and the contract's metrics (``batch_size`` as sent in
    round 1, a dataset size between 100 and 1,000)."""
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        Metadata,
        MetricRecord,
        RecordDict,
    )

    from fl_lbbsp.contract import RecordKeys

    keys = RecordKeys()
    rng = np.random.default_rng(seed)
    replies = []
    for node in node_ids:
        arrays = ArrayRecord(
            {
                name: Array((value + 0.01 * rng.standard_normal(value.shape)).astype(value.dtype))
                for name, value in reference.items()
            }
        )
        metrics = MetricRecord(
            {
                keys.num_examples: int(rng.integers(100, 1001)),
                keys.train_time: float(rng.uniform(1.0, 8.0)),
                keys.batch_size: batch_size,
                keys.samples_processed: batch_size * 10,
                keys.cpu_percent: 50.0,
                keys.memory_percent: 40.0,
                keys.max_batch_size: 0,
            }
        )
        content = RecordDict(
            {
                "arrays": arrays,
                "metrics": metrics,
                keys.silo_record: ConfigRecord({keys.silo_id: f"silo-{node}"}),
            }
        )
        metadata = Metadata(
            run_id=1, message_id="", src_node_id=node, dst_node_id=1,
            reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
            message_type=MessageType.TRAIN,
        )  # fmt: skip
        replies.append(Message(content=content, metadata=metadata))
    return replies


@dataclass(frozen=True)
class Replies:
    """One round's train replies, and the same updates decoded once (untimed)."""

    messages: list[Any]
    updates: list[list[np.ndarray]]
    weights: list[float]


def decoded(messages: list[Any], names: list[str]) -> Replies:
    """``messages`` with their arrays decoded (in ``names`` order) and their weights."""
    updates, weights = [], []
    for msg in messages:
        arrays = msg.content.array_records["arrays"]
        updates.append([arrays[name].numpy() for name in names])
        weights.append(float(msg.content.metric_records["metrics"]["num-examples"]))
    return Replies(messages=messages, updates=updates, weights=weights)


def timed_round(
    name: str, reference: dict[str, np.ndarray], replies: Replies, grid: Any, telemetry: Path
) -> tuple[float, list[np.ndarray]]:
    """Server seconds of one round of aggregation ``name``, and the new global arrays in
    the reference's order.

    A strategy is built fresh (untimed), so every timed round is a round 1 of its own:
    ``configure_train`` on the reference model and all of ``grid``'s nodes, then
    ``aggregate_train`` on the reply Messages. ``weighted-mean`` times ``WeightedMean``
    alone (``begin``, one ``add`` per reply weighted by its ``num-examples``, ``result``)
    on the updates decoded beforehand; ``weighted-mean-decode`` also decodes each reply's
    arrays with Flower's ``Array.numpy()`` and reads its weight, as Flower's FedAvg does.
    """
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from fl_lbbsp.core import WeightedMean
    from fl_lbbsp.strategies import LBBSPFedAvg

    names = list(reference)
    if name == "weighted-mean":
        start = time.perf_counter()
        mean = WeightedMean()
        mean.begin([reference[n] for n in names])
        for update, weight in zip(replies.updates, replies.weights, strict=True):
            mean.add(update, weight=weight)
        return time.perf_counter() - start, mean.result()
    if name == "weighted-mean-decode":
        start = time.perf_counter()
        mean = WeightedMean()
        mean.begin([reference[n] for n in names])
        for msg in replies.messages:
            arrays = msg.content.array_records["arrays"]
            weight = msg.content.metric_records["metrics"]["num-examples"]
            mean.add([arrays[n].numpy() for n in names], weight=weight)
        return time.perf_counter() - start, mean.result()
    nodes = len(list(grid.get_node_ids()))
    if name == "flower":
        strategy: Any = FedAvg(min_train_nodes=nodes, min_available_nodes=nodes)
    else:
        strategy = LBBSPFedAvg(
            initial_batch_size=32, local_steps=10, lr=0.05, min_train_nodes=nodes,
            min_available_nodes=nodes,
            telemetry_path=telemetry if name == "lbbsp-telemetry" else None,
            robust_aggregation="mean",  # FedAvg's mean, checked against Flower's below
        )  # fmt: skip
    record = ArrayRecord({n: Array(value) for n, value in reference.items()})
    start = time.perf_counter()
    list(strategy.configure_train(1, record, ConfigRecord(), grid))
    aggregated, _ = strategy.aggregate_train(1, replies.messages)
    seconds = time.perf_counter() - start
    if aggregated is None:
        raise RuntimeError(f"{name} aggregated nothing: were the replies rejected?")
    return seconds, [aggregated[n].numpy() for n in names]


def aggregation_times(
    silos: int, repeats: int, seed: int, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Server seconds per round of every aggregation on the same ``silos`` replies.

    The aggregations run interleaved, ``repeats`` times, in an order rotated each time;
    every round's aggregate is checked against Flower's (the same weighted mean up to
    float32 rounding), so a strategy that rejected the replies cannot look fast.

    Returns
    -------
    dict
        Per aggregation: ``seconds`` (every repetition), ``median`` (seconds) and
        ``ratio`` (median over the repetitions of its seconds / Flower's in the same one).
    """
    import gc

    from flwr.clientapp import ClientApp

    from fl_lbbsp.runs.inprocess import InProcessGrid

    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)  # Flower logs every round at INFO
    try:
        grid = InProcessGrid(ClientApp(), num_nodes=silos)  # only lists its nodes here
        reference = lenet5_reference()
        messages = train_replies(reference, list(grid.get_node_ids()), batch_size=32, seed=seed)
        replies = decoded(messages, list(reference))
        seconds: dict[str, list[float]] = {name: [] for name in AGGREGATIONS}
        for repeat in range(repeats):
            shift = repeat % len(AGGREGATIONS)
            results = {}
            for name in AGGREGATIONS[shift:] + AGGREGATIONS[:shift]:
                telemetry = workdir / f"telemetry-{silos}-{repeat}.jsonl"
                gc.collect()
                took, results[name] = timed_round(name, reference, replies, grid, telemetry)
                seconds[name].append(took)
                telemetry.unlink(missing_ok=True)
            for name, arrays in results.items():
                for got, want in zip(arrays, results["flower"], strict=True):
                    if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
                        raise RuntimeError(f"{name}'s aggregate differs from Flower FedAvg's")
    finally:
        flwr_log.setLevel(level)
    return summarise_times(seconds)


def summarise_times(seconds: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per aggregation: its ``seconds``, their ``median`` and ``ratio``, the median of
    its seconds over Flower's in the same repetition (paired, so a busy spell of the
    machine slows both sides of a ratio)."""
    flower = seconds["flower"]
    return {
        name: {
            "seconds": values,
            "median": statistics.median(values),
            "ratio": statistics.median(t / f for t, f in zip(values, flower, strict=True)),
        }
        for name, values in seconds.items()
    }


def _load() -> str:
    """``, load average 3.1 / 2.5 / 2.0`` where the platform tells it, else nothing."""
    try:
        loads = os.getloadavg()
    except (AttributeError, OSError):
        return ""
    return ", load average " + " / ".join(f"{x:.1f}" for x in loads) + " when written"


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
def aggregation_figures(
    aggregation: dict[int, dict[str, dict[str, Any]]], repeats: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Figures and the table of the comparison at scale: per silo count, LB-BSP's server
    time per round over Flower FedAvg's (the goal at 1,000 silos: below 1), and at the
    largest count the other aggregations' ratios."""
    figures: list[dict[str, Any]] = []
    for n, times in aggregation.items():
        flower, lbbsp = times["flower"], times["lbbsp"]
        figures.append(
            {
                "label": f"server time per round at {n:,} silos, LB-BSP / Flower FedAvg",
                "value": lbbsp["ratio"],
                "format": ".2f",
                "unit": "x",
                "goal": {"op": "<", "target": 1.0} if n == AGGREGATION_GOAL_SILOS else None,
                "note": f"{lbbsp['median']:.3f} s against {flower['median']:.3f} s: "
                "configure_train + aggregate_train on the same replies, LeNet-5-sized "
                f"updates; median of {repeats} paired ratio(s)",
            }
        )
    largest = max(aggregation)
    times = aggregation[largest]
    for name, note in (
        ("lbbsp-telemetry", "LBBSPFedAvg writing its per-round telemetry (JSON lines)"),
        ("weighted-mean", "begin + one in-place add per reply + result, on arrays decoded "
         "beforehand: the aggregation a streaming server adds to the screening it does"),
        ("weighted-mean-decode", "the same, decoding each reply's arrays with Flower's "
         "Array.numpy() as Flower's FedAvg does"),
    ):  # fmt: skip
        figures.append(
            {
                "label": f"server time per round at {largest:,} silos, "
                f"{AGGREGATION_LABELS[name]} / Flower FedAvg",
                "value": times[name]["ratio"],
                "format": ".2f",
                "unit": "x",
                "goal": None,
                "note": f"{times[name]['median']:.3f} s; {note}",
            }
        )
    columns = ["silos", f"{AGGREGATION_LABELS['flower']} (s)"]
    for name in AGGREGATIONS[1:]:
        columns += [f"{AGGREGATION_LABELS[name]} (s)", "/ Flower"]
    rows = []
    for n, times in aggregation.items():
        row = [f"{n:,}", f"{times['flower']['median']:.4f}"]
        for name in AGGREGATIONS[1:]:
            row += [f"{times[name]['median']:.4f}", f"{times[name]['ratio']:.2f}"]
        rows.append(row)
    table = {
        "title": f"Server time per round against Flower FedAvg on the same replies (median "
        f"of {repeats}, interleaved; ratios are medians of paired ratios)",
        "columns": columns,
        "rows": rows,
    }
    return figures, table


def section(
    decisions: dict[str, dict[int, dict[str, float]]],
    fl: dict[str, dict[str, float]],
    quoted: list[list[str]],
    settings: Settings,
    data: str,
    smoke: bool,
    aggregation: dict[int, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The ``overhead`` section in the benchmark schema (``aggregation``: the comparison
    at scale, :func:`aggregation_times` per silo count)."""
    default = decisions[DEFAULT_ALLOCATOR]
    figures: list[dict[str, Any]] = []
    for n in settings.silos:
        figures.append(
            {
                "label": f"balancer decision time, {n:,} silos ({DEFAULT_ALLOCATOR} allocator)",
                "value": 1000 * default[n]["decision"],
                "format": ".3f",
                "unit": "ms",
                "goal": None,
                "note": f"reports of the round: {1000 * default[n]['reports']:.1f} ms "
                f"({1e6 * default[n]['reports'] / n:.0f} µs per silo)",
            }
        )
    for n in sorted(set(settings.silos) & set(aggregation or {})):
        assert aggregation is not None
        work = default[n]["decision"] + default[n]["reports"]
        flower = aggregation[n]["flower"]["median"]
        figures.append(
            {
                "label": f"balancer work per round / Flower FedAvg's server round, {n:,} silos",
                "value": work / flower,
                "format": ".2%",
                "unit": "",
                "goal": {"op": "<=", "target": BALANCER_SHARE_GOAL}
                if n == AGGREGATION_GOAL_SILOS
                else None,
                "note": f"{1000 * work:.1f} ms (the round's reports + allocate, "
                f"{DEFAULT_ALLOCATOR} allocator) against {1000 * flower:.1f} ms of Flower "
                "FedAvg's configure_train + aggregate_train on LeNet-5-sized replies, "
                "both measured in this run",
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
    if aggregation:
        scale_figures, scale_table = aggregation_figures(aggregation, settings.aggregation_repeats)
        figures += scale_figures
        tables.append(scale_table)
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
        f"At scale: {', '.join(f'{n:,}' for n in settings.aggregation_silos)} silos each "
        "reply with their own LeNet-5-sized update (61,706 float32, the 32x32 model) and the "
        "contract's metrics, built once as Flower Messages; one round (a fresh strategy "
        "each time, `configure_train` + `aggregate_train`) of Flower's "
        "`flwr.serverapp.strategy.FedAvg`, of `LBBSPFedAvg` (telemetry off, then on) and "
        "of `fl_lbbsp.core.WeightedMean` alone (on the arrays decoded beforehand, and "
        "decoding them with `Array.numpy()`), on the same replies, interleaved in a "
        f"rotating order, {settings.aggregation_repeats} time(s); every aggregate is "
        "checked against Flower's. "
        f"Machine: {machine()}{_load()}."
    )
    notes = [
        "What balancing costs a server is its work per round (every report, then the "
        "allocation) against the round the server spends anyway on Flower's FedAvg "
        "aggregation of the same silos' updates; cross-silo federations have 10 to 100 silos, "
        "where both are a few milliseconds.",
        "The default allocator is `linear` (what `LBBSPFedAvg` and `LBBSPCluster` use); "
        "`proportional` is Alg. 1, `iterative` Alg. 2.",
        "Each silo's cost fit is cached with its report, so `allocate` gathers one row per "
        "silo and solves the min-max with numpy: O(n log n).",
    ]
    if aggregation:
        notes.append(
            "At scale, the ratios to Flower FedAvg are what to read: each is the median over "
            "the repetitions of a time divided by Flower's in the same repetition, so a busy "
            "spell of this shared machine slows both sides; the seconds move with the load."
        )
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
    flags = parser(__doc__.splitlines()[0])
    flags.add_argument(
        "--balancer-only", action="store_true",
        help="measure only the balancer's decision time (part 1) and the 5-silo FL run's "
        "balancer share (part 2), print them and write nothing",
    )  # fmt: skip
    args = flags.parse_args()
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
    if args.balancer_only:
        return 0
    aggregation = {}
    with tempfile.TemporaryDirectory() as workdir:
        for n in settings.aggregation_silos:
            aggregation[n] = aggregation_times(
                n, settings.aggregation_repeats, settings.seed, Path(workdir)
            )
            print(
                f"{n:>5} silos: Flower FedAvg {aggregation[n]['flower']['median']:.4f} s; "
                + ", ".join(
                    f"{AGGREGATION_LABELS[name]} {aggregation[n][name]['median']:.4f} s "
                    f"({aggregation[n][name]['ratio']:.2f}x)"
                    for name in AGGREGATIONS[1:]
                ),
                flush=True,
            )
    path = write_section(
        section(
            decisions, fl, fl_section_overheads(args.out), settings, data, args.smoke,
            aggregation,
        ),
        args.out,
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
