"""The ``ddp`` section's arithmetic: each run's figures, the pairs' ratios, the figures
with their goals and the table of every pair (``bench_ddp.py`` runs, this summarises).

Pure functions over the runs' logs, tested without launching anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    """One cluster: its ranks, what makes them unequal, and what LB-BSP is held against."""

    key: str
    label: str
    ranks: int
    slowdowns: tuple[float, ...] = ()
    burner: bool = False
    flower: bool = False
    cost_model: str | None = None
    bound: bool = False
    repeats: int | None = None
    lbbsp_args: tuple[str, ...] = ()
    """Options added to LB-BSP's runs (the example's, e.g. ``("--backoff", "1")``)."""

    @property
    def emulated(self) -> bool:
        return any(k != 1.0 for k in self.slowdowns) or self.cost_model is not None

    @property
    def reference(self) -> str:
        """The scheme of LB-BSP's pairs: the stock script, or where it cannot emulate the
        slowdowns, the example's equal split."""
        return "ddp" if self.emulated else "stock"

    @property
    def schemes(self) -> tuple[str, ...]:
        return ("lbbsp", self.reference, *(("bound",) if self.bound else ()))


__all__ = [
    "NAMES",
    "SHORT",
    "case_figures",
    "ideal_time",
    "median_run",
    "order_balanced",
    "pair_ratios",
    "pair_rows",
    "smallest_batch",
    "summarise_ddp",
    "summarise_flower",
]

NAMES = {
    "stock": "stock DDP (textbook script)",
    "lbbsp": "LB-BSP (DDP)",
    "ddp": "equal split (the example's --mode ddp)",
    "bound": "stock DDP on equal ranks (the split's bound)",
    "flower": "Flower cluster mode",
}
SHORT = {"stock": "stock DDP", "ddp": "the equal split"}
"""The references' names in the figures' labels."""
EQUAL_GOAL = 0.98
BURNER_GOAL = 1.3
BOUND_GOAL = 0.9
EXCHANGE_GOAL = 0.01


def ideal_time(
    reports: dict[str, list[tuple[int, float]]], total: int, floor: int = 0
) -> float | None:
    """T* = (X + sum b_i / a_i) / sum 1 / a_i from each rank's fitted cost t_i = a_i B + b_i
    (least squares over its (batch size, seconds per iteration) reports; b_i = 0 when its
    batch sizes spread by less than 10%), DESIGN.md "The ideal to measure against".

    ``floor`` > 0: the ideal when no batch may be smaller (the balancer's smallest batch
    size, ``min_batch_fraction`` of B_init): ranks whose ideal batch falls below it get the
    floor, the others split the rest, and T* is the slowest of them all.
    """
    a, b = [], []
    for pairs in reports.values():
        xs = np.array([p[0] for p in pairs], dtype=np.float64)
        ts = np.array([p[1] for p in pairs], dtype=np.float64)
        if len(xs) == 0:
            return None
        if len(set(xs.tolist())) >= 2 and np.ptp(xs) >= 0.1 * xs.mean():
            slope, intercept = np.polyfit(xs, ts, 1)
            if slope > 0 and intercept >= 0:
                a.append(float(slope))
                b.append(float(intercept))
                continue
        a.append(float(np.mean(ts / xs)))
        b.append(0.0)
    slopes, intercepts = np.array(a), np.array(b)
    fixed = np.zeros(len(slopes), dtype=bool)
    while True:
        free = ~fixed
        if not free.any():
            return float(np.max(slopes * floor + intercepts))
        inverse = 1.0 / slopes[free]
        rest = total - floor * int(fixed.sum())
        t_star = float((rest + np.sum(intercepts[free] * inverse)) / np.sum(inverse))
        below = free & ((t_star - intercepts) / slopes < floor)
        if not below.any():
            pinned = slopes[fixed] * floor + intercepts[fixed]
            return max([t_star, *pinned.tolist()])
        fixed |= below


def smallest_batch(initial_batch_size: int) -> int:
    """The default balancer's smallest batch size for B_init (``min_batch_fraction``)."""
    from fl_lbbsp.core.balancer import BatchSizeBalancer

    return BatchSizeBalancer(initial_batch_size=initial_batch_size).floor


def summarise_ddp(log: dict[str, Any], skip: int) -> dict[str, Any]:
    """Throughput over the iterations after ``skip`` (their samples over their wall time),
    steady iteration time, the slowest rank's compute, T*, the accuracy trajectory, the
    exchange's cost and the load of one run (the stock script's or the example's log)."""
    its = log["iterations"]
    later = its[skip:] or its
    summary = log["summary"]
    wall = float(sum(it["wall"] for it in later))
    reports: dict[str, list[tuple[int, float]]] = {}
    for rebalance in log["rebalances"]:
        for rank, (size, seconds, count) in rebalance["reports"].items():
            reports.setdefault(rank, []).append((size, seconds / count))
    total = sum(its[0]["sizes"])
    floor = smallest_batch(int(log["config"]["batch_size"]))
    per_rank = log.get("rank_compute")
    measured = per_rank is not None and all(t is not None for ts in per_rank for t in ts)
    slowest = np.max(np.array(per_rank, dtype=np.float64), axis=0) if measured else None
    iteration_time = wall / len(later)
    overhead = float(summary.get("balancer_overhead_per_iteration", 0.0))
    samples = sum(sum(it["sizes"]) for it in later)
    median = float(np.median([it["wall"] for it in later]))
    return {
        "throughput": samples / wall,
        "steady_throughput": samples / len(later) / median,
        "iteration_time": iteration_time,
        "compute_time": None if slowest is None else float(np.mean(slowest[skip:])),
        "t_star": ideal_time(reports, total) if reports else None,
        "t_star_floor": ideal_time(reports, total, floor) if reports else None,
        "evaluations": [(e["iteration"], e["time"], e["accuracy"]) for e in log["evaluations"]],
        "final_accuracy": log["evaluations"][-1]["accuracy"],
        "final_sizes": summary["final_sizes"],
        "overhead": overhead,
        "exchange_share": overhead / iteration_time,
        "training_time": summary["training_time"],
        "moves": sum(1 for r in log["rebalances"] if (r.get("gate") or {}).get("move")),
        "unequal_iterations": sum(1 for it in later if len(set(it["sizes"])) > 1),
        "load": log.get("load"),
    }


def summarise_flower(events: list[dict[str, Any]], skip: int, floor: int = 0) -> dict[str, Any]:
    """The same figures for the Flower cluster mode: an iteration is the emulated round
    time (slowest worker) plus the real messaging overhead."""
    train = [e for e in events if e.get("event") == "train" and e.get("round_time")]
    times = np.array([e["round_time"] + (e.get("overhead") or 0.0) for e in train])
    elapsed = np.cumsum(times)
    accuracy = sorted((e["round"], e["accuracy"]) for e in events if e.get("event") == "evaluate")
    samples = sum(e["total_batch_size"] for e in train)
    later = train[skip:] or train
    reports: dict[str, list[tuple[int, float]]] = {}
    for e in later:
        for silo, r in e["silos"].items():
            reports.setdefault(silo, []).append((int(r["batch-size"]), float(r["train-time"])))
    rounds = np.array([e["round_time"] for e in train])
    return {
        "throughput": samples / float(elapsed[-1]),
        "iteration_time": float(np.mean(times[skip:] if len(times) > skip else times)),
        "compute_time": float(np.mean(rounds[skip:] if len(rounds) > skip else rounds)),
        "t_star": ideal_time(reports, int(train[-1]["total_batch_size"])),
        "t_star_floor": ideal_time(reports, int(train[-1]["total_batch_size"]), floor),
        "evaluations": [
            (r, float(elapsed[min(r, len(elapsed)) - 1]), a) for r, a in accuracy if r >= 1
        ],  # fmt: skip
        "final_accuracy": accuracy[-1][1],
        "final_sizes": [train[-1]["silos"][s]["batch-size"] for s in sorted(train[-1]["silos"])],
        "overhead": float(np.mean([e.get("overhead") or 0.0 for e in later])),
        "training_time": float(elapsed[-1]),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput among a scheme's repeats (its figures stay those of one
    run), with every repeat's throughput, position in its pair, final sizes, exchange
    share and load kept, in repeat order."""
    ordered = sorted(runs, key=lambda s: float(s["throughput"]))
    kept = {
        "throughputs": [s["throughput"] for s in runs],
        "steadies": [s.get("steady_throughput") for s in runs],
        "positions": [s.get("position") for s in runs],
        "sizes_per_run": [s["final_sizes"] for s in runs],
        "unequal_per_run": [s.get("unequal_iterations") for s in runs],
        "shares": [s.get("exchange_share") for s in runs],
        "loads": [s.get("load") for s in runs],
    }
    return {**ordered[(len(ordered) - 1) // 2], **kept}


def pair_ratios(
    lb: dict[str, Any], other: dict[str, Any], *, key: str = "throughputs"
) -> list[float]:
    """LB-BSP's throughput over the other scheme's, repeat by repeat (the runs of a pair
    share the load of their minutes); ``key="steadies"``: the same of the median
    iteration's (samples per iteration over the median iteration's wall time)."""
    single = "throughput" if key == "throughputs" else "steady_throughput"
    mine = lb.get(key, [lb.get(single)])
    theirs = other.get(key, [other.get(single)])
    return [a / b for a, b in zip(mine, theirs, strict=True) if a and b]


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _spread(ratios: list[float], positions: list[int | None] | None = None) -> str:
    """The pairs' spread; with LB-BSP's position in each pair (0: first), the median of
    the pairs where it ran first and of those where it ran second, apart."""
    if len(ratios) < 2:
        return f"{len(ratios)} pair"
    slower = sum(r < 1.0 for r in ratios)
    order = ""
    if positions is not None and len(positions) == len(ratios):
        first = [r for r, p in zip(ratios, positions, strict=True) if p == 0]
        later = [r for r, p in zip(ratios, positions, strict=True) if p is not None and p > 0]
        if first and later:
            order = (f"; LB-BSP first: median {np.median(first):.3f} ({len(first)} pairs), "
                     f"second: {np.median(later):.3f} ({len(later)})")  # fmt: skip
    return (f"median of {len(ratios)} alternated pairs, range {min(ratios):.3f}-"
            f"{max(ratios):.3f}, LB-BSP slower in {slower}; per pair: "
            + ", ".join(f"{r:.3f}" for r in ratios) + order)  # fmt: skip


def order_balanced(ratios: list[float], positions: list[int | None]) -> float | None:
    """The geometric mean of the median ratio of the pairs where LB-BSP ran first and of
    those where it ran second (a cross-over design's estimate: what running second in a
    pair gains or costs, the same for both scripts, cancels); ``None`` without pairs of
    both orders."""
    if len(positions) != len(ratios):
        return None
    first = [r for r, p in zip(ratios, positions, strict=True) if p == 0]
    later = [r for r, p in zip(ratios, positions, strict=True) if p is not None and p > 0]
    if not first or not later:
        return None
    return float(np.sqrt(np.median(first) * np.median(later)))


def _figure(
    label: str, value: float | None, fmt: str, goal: dict[str, Any] | None = None, **extra: str
) -> dict[str, Any]:
    return {"label": label, "value": value, "format": fmt, "unit": extra.get("unit", ""),
            "goal": goal, "note": extra.get("note", "")}  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def case_figures(case: Case, runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures of one case, with the goals: LB-BSP / stock >= 0.98 on equal ranks and
    >= 1.3 beside the burner, the exchange <= 1% of an iteration on equal ranks, LB-BSP >=
    90% of the split's bound in the emulated case."""
    lb, ref = runs["lbbsp"], runs[case.reference]
    equal = not (case.emulated or case.burner)
    goal = EQUAL_GOAL if equal else BURNER_GOAL if case.burner else None
    ratios = pair_ratios(lb, ref)
    steady = pair_ratios(lb, ref, key="steadies")
    positions = lb.get("positions")
    shares = [s for s in lb.get("shares", [lb["exchange_share"]]) if s is not None]
    figures = [
        _figure(f"{case.label}: LB-BSP throughput / {SHORT[case.reference]}'s",
                _median(ratios), ".3f", None if goal is None else {"op": ">=", "target": goal},
                unit="x", note=_spread(ratios, positions)),
        _figure(f"{case.label}: the same, order-balanced",
                order_balanced(ratios, positions or []), ".3f", unit="x",
                note="the geometric mean of the medians of the pairs where LB-BSP ran first "
                "and where it ran second: what the second run of a pair gains or loses, "
                "the same whichever script it is, cancels"),
        _figure(f"{case.label}: the same, median iterations",
                _median(steady), ".3f", unit="x",
                note="each run's samples per iteration over its median iteration's wall time, "
                "less sensitive to the load's bursts than the throughput; "
                + _spread(steady, positions)),
        _figure(f"{case.label}: LB-BSP exchange cost / iteration time",
                _median(shares), ".4f",
                {"op": "<=", "target": EXCHANGE_GOAL} if equal else None,
                note=f"median over LB-BSP's runs; {lb['overhead'] * 1e6:.0f} us per iteration "
                f"in the median run, {lb['iteration_time'] * 1e3:.1f} ms iterations"),
    ]  # fmt: skip
    if "bound" in runs:
        bound = pair_ratios(lb, runs["bound"])
        figures += [
            _figure(f"{case.label}: LB-BSP throughput / the split's bound",
                    _median(bound), ".3f", {"op": ">=", "target": BOUND_GOAL}, unit="x",
                    note="the bound: the stock script on as many equal ranks in the same "
                    "rotation; " + _spread(bound, positions)),
            _figure(f"{case.label}: the most any split could gain over the equal split",
                    _median(pair_ratios(runs["bound"], ref)), ".2f", unit="x",
                    note="the bound's throughput over the equal split's (emulated), pair by "
                    "pair"),
        ]  # fmt: skip
    if not (case.emulated or case.burner):
        return figures
    figures += [
        _figure(f"{case.label}: LB-BSP iteration time / T*",
                _ratio(lb["compute_time"], lb["t_star"]), ".3f",
                {"op": "<=", "target": 1.05} if case.emulated else None,
                note="the slowest rank's compute time per iteration (what balancing controls) "
                "over T* from each rank's fitted cost line; the paper: within 5% of the ideal"),
        _figure(f"{case.label}: LB-BSP iteration time / T* at the smallest batch",
                _ratio(lb["compute_time"], lb["t_star_floor"]), ".3f",
                note="the same over the ideal when no batch is below the balancer's smallest "
                "batch size (min_batch_fraction of B_init)"),
        _figure(f"{case.label}: LB-BSP final accuracy - {SHORT[case.reference]}'s",
                100 * (lb["final_accuracy"] - ref["final_accuracy"]), "+.2f",
                {"op": ">=", "target": -0.5} if case.emulated else None, unit="points",
                note="the same global batch every iteration: the same gradient up to "
                "floating-point order"),
    ]  # fmt: skip
    if case.emulated:
        figures.append(
            _figure(f"{case.label}: time-to-accuracy speed-up of LB-BSP over the equal split",
                    _ratio(ref["time_to_target"], lb["time_to_target"]), ".2f",
                    {"op": ">=", "target": 1.8}, unit="x",
                    note=f"wall training time to {ref['target']:.4f} test accuracy (95% of "
                    "the equal split's final)")
        )  # fmt: skip
    if "flower" in runs:
        fl = runs["flower"]
        figures.append(
            _figure(f"{case.label}: Flower cluster mode iteration time / LB-BSP on DDP's",
                    _ratio(fl["iteration_time"], lb["iteration_time"]), ".2f", unit="x",
                    note=f"Flower: {fl['overhead']:.3f} s of messaging per iteration")
        )  # fmt: skip
    return figures


def pair_rows(case: Case, runs: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per pair of the case (and per reference: the equal split, the bound)."""
    lb = runs["lbbsp"]
    rows = []
    for scheme in (s for s in case.schemes if s != "lbbsp"):
        other = runs[scheme]
        steady = pair_ratios(lb, other, key="steadies")
        for k, (mine, theirs) in enumerate(
            zip(lb["throughputs"], other["throughputs"], strict=True)
        ):
            first = lb["positions"][k] is not None and lb["positions"][k] == 0
            load = lb["loads"][k]
            share = lb["shares"][k]
            unequal = lb.get("unequal_per_run", [None] * (k + 1))[k]
            rows.append([
                case.label, NAMES[scheme], str(k + 1),
                "LB-BSP first" if first else "LB-BSP later",
                f"{mine:.0f}", f"{theirs:.0f}", f"{mine / theirs:.3f}",
                f"{steady[k]:.3f}" if k < len(steady) else "-",
                " ".join(map(str, lb["sizes_per_run"][k])),
                "-" if unequal is None else str(unequal),
                "-" if share is None else f"{share:.4f}",
                "-" if not load else f"{load[0]:.1f}-{load[1]:.1f}",
            ])  # fmt: skip
    return rows
