"""One summary per run, FL or cluster alike (:func:`summarise`): round or iteration time,
T*, idle fraction, messaging, accuracy and emulated time to a target accuracy; and why a
run produced no model (:func:`run_failure`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...strategies.rounds import natural_key
from .costs import CostLine, Events, run_cost_lines, slowdowns_at, train_events

__all__ = ["run_failure", "summarise"]


def run_failure(events: Events) -> str | None:
    """Why a run produced no model, in one line; ``None`` if any round was aggregated.

    A run whose every round was skipped (every reply rejected, or too few valid ones)
    has nothing to summarise. The line names the reason the silos' replies were
    rejected, e.g. ``"every silo failed in every round: ImportError: ..."``, or the
    most common reasons when they differ.
    """
    train = train_events(events)
    if not train:
        return "no round was run"
    if any(e.get("skipped") is None for e in train):
        return None
    reasons = [
        str(r.get("reason", "")).removeprefix("error reply: ")
        for e in train
        for r in e.get("rejected") or ()
    ]
    replied = [e for e in train if e.get("silos")]
    if reasons and not replied:
        counts: dict[str, int] = {}
        for reason in reasons:
            counts[reason] = counts.get(reason, 0) + 1
        ranked = sorted(counts, key=lambda r: -counts[r])
        if len(ranked) == 1:
            return f"every silo failed in every round: {ranked[0]}"
        others = len(ranked) - 1
        return (
            f"every silo failed in every round, most often with: {ranked[0]} "
            f"({counts[ranked[0]]} of {len(reasons)} replies; {others} other reason"
            f"{'s' if others > 1 else ''} in the telemetry)"
        )
    last = str(train[-1].get("skipped"))
    return f"every round was skipped ({len(train)} of {len(train)}), the last because: {last}"


def summarise(
    events: Events,
    *,
    cost: CostLine | None = None,
    target_accuracy: float | None = None,
    steady_from: int = 4,
) -> dict[str, Any]:
    """Summarise one run's telemetry, FL or cluster (told apart by its config event).

    Every run: its scheme, whether its times are emulated (and the capacities), the final
    accuracy, the emulated time to the target accuracy (the sum of the round times up to
    the first evaluation at or above it; cluster runs: 0 if the initial model reaches it)
    and the final batch sizes. FL runs add the steady round time against the ideal T*, the idle
    fraction, the gap to the proportional split, wall-clock figures and one entry per
    round (``rounds``). Cluster runs add the mean iteration time and idle fraction, the
    real messaging overhead per iteration (server wall time beyond the slowest worker's
    busy time), the iterations to the target and the accuracy per evaluation
    (``accuracy``).

    Parameters
    ----------
    events : sequence of dict
        The run's telemetry (config, train and evaluate events).
    cost : CostLine | None (default: None)
        FL runs: measured compute cost line of this machine, for T* (runs compared with
        each other share one, from :func:`run_cost_lines`); ``None``: this run's own.
        Not used for cluster runs.
    target_accuracy : float | None (default: None)
        Accuracy whose first crossing gives ``time_to_target`` (emulated seconds).
    steady_from : int (default: 4)
        FL runs: first round counted as steady state.

    Raises
    ------
    ValueError
        No round was aggregated (:func:`run_failure` says why).
    """
    config = next(e for e in events if e.get("event") == "config")
    # Skipped rounds (no valid reply) have no round time and change no model.
    train = [e for e in train_events(events) if e.get("round_time") is not None]
    if not train:
        raise ValueError(f"no aggregated round to summarise: {run_failure(events)}")
    accuracy = {e["round"]: e["accuracy"] for e in events if e.get("event") == "evaluate"}
    cluster = _is_cluster(config)
    elapsed = dict(zip([0] + [e["round"] for e in train], _cumulative(train), strict=True))
    # The evaluations that can reach the target: after an aggregated round, and for cluster
    # runs the initial model's too (0 iterations, 0 s).
    reached = [
        r
        for r in sorted(accuracy)
        if r in elapsed
        and (r > 0 or cluster)
        and target_accuracy is not None
        and accuracy[r] >= target_accuracy
    ]
    first = reached[0] if reached else None
    dilation = float(config.get("time_dilation") or 1.0)
    summary = {
        "scheme": config["scheme"],
        "emulated": config.get("speeds") is not None
        or config.get("cost_model") is not None
        or dilation > 1.0,
        "speeds_emulated": config.get("speeds"),
        "final_accuracy": accuracy[max(accuracy)] if accuracy else None,
        "target_accuracy": target_accuracy,
        "time_to_target": None if first is None else elapsed[first],
        "batch_sizes_final": {s: r.get("batch-size") for s, r in train[-1]["silos"].items()},
    }
    if cluster:
        return summary | _cluster_figures(train, accuracy, first)
    if cost is None:
        cost = run_cost_lines({"run": events})[0]
    return summary | _fl_figures(config, train, accuracy, elapsed, cost, steady_from)


def _is_cluster(config: dict[str, Any]) -> bool:
    """A cluster run's config (workers and iterations) rather than an FL run's."""
    return "iterations" in config


def _cumulative(train: list[dict[str, Any]]) -> list[float]:
    """0 and the emulated time elapsed after each aggregated round."""
    return [0.0, *np.cumsum([float(e["round_time"]) for e in train]).tolist()]


def _cluster_figures(
    train: list[dict[str, Any]], accuracy: dict[int, float], first: int | None
) -> dict[str, Any]:
    """A cluster run's iteration time, idle fraction and messaging overhead (real)."""
    iteration = np.array([float(e["round_time"]) for e in train])
    overhead = np.array([e["overhead"] for e in train if e.get("overhead") is not None])
    mean_iteration = float(iteration.mean())
    mean_overhead = float(overhead.mean()) if len(overhead) else None
    return {
        "iterations": len(train),
        "iteration_time_mean": mean_iteration,
        "idle_fraction_mean": float(np.mean([e["idle_fraction"] for e in train])),
        "overhead_mean": mean_overhead,
        "overhead_share": None
        if mean_overhead is None
        else mean_overhead / (mean_iteration + mean_overhead),
        "iterations_to_target": first,
        "accuracy": accuracy,
    }


def _fl_figures(
    config: dict[str, Any],
    train: list[dict[str, Any]],
    accuracy: dict[int, float],
    elapsed: dict[int, float],
    cost: CostLine,
    steady_from: int,
) -> dict[str, Any]:
    """An FL run's steady round time against T*, idle fraction, share deviation, wall
    clock and per-round series."""
    total = int(config["batch_size"]) * int(config["silos"])
    steady = [e for e in train if e["round"] >= steady_from] or train
    # T* of each round: capacities may change over the rounds (slowdown schedules).
    ideals = np.array([cost.ideal(slowdowns_at(config, e["round"]), total) for e in steady])
    times = np.array([float(e["round_time"]) for e in steady])
    round_steady = float(np.mean(times))
    walls = [float(e["wall_time"]) for e in steady if e.get("wall_time") is not None]
    wall_steady = float(np.mean(walls)) if walls else None
    rounds = [
        {
            "round": event["round"],
            "round_time": event["round_time"],
            "ideal_round_time": cost.ideal(slowdowns_at(config, event["round"]), total),
            "idle_fraction": event["idle_fraction"],
            "wall_time": event["wall_time"],
            "overhead": event.get("overhead"),
            "elapsed_emulated": elapsed[event["round"]],
            "accuracy": accuracy.get(event["round"]),
            "batch_sizes": {s: r.get("batch-size") for s, r in event["silos"].items()},
            "train_times": {s: r.get("train-time") for s, r in event["silos"].items()},
        }
        for event in train
    ]
    return {
        "share_deviation_steady": _share_deviation(steady),
        "time_dilation": float(config.get("time_dilation") or 1.0),
        "wall_round_time_steady": wall_steady,
        "wall_over_emulated": None if wall_steady is None else wall_steady / round_steady,
        "total_wall_time": float(sum(float(e.get("wall_time") or 0.0) for e in train)),
        "emulate_wait": config.get("emulate_wait", True),
        "cost_model": config.get("cost_model"),
        "round_time_steady": round_steady,
        "ideal_round_time": float(np.mean(ideals)),
        "round_time_over_ideal": float(np.mean(times / ideals)),
        "round_time_steady_median": float(np.median(times)),
        "round_time_median_over_ideal": float(np.median(times / ideals)),
        "idle_fraction_steady": float(np.mean([e["idle_fraction"] for e in steady])),
        "best_accuracy": max(accuracy.values()) if accuracy else None,
        "total_time_emulated": elapsed[train[-1]["round"]],
        "cost_line": {"a": cost.a, "b": cost.b},
        "rounds": rounds,
    }


def _share_deviation(steady: list[dict[str, Any]]) -> float | None:
    """Largest relative gap between a silo's mean steady batch size and its proportional
    share ``X * v_i / sum_j v_j``, with ``v_i`` its mean reported speed over those rounds."""
    silos = sorted({s for e in steady for s in e["silos"]}, key=natural_key)
    sizes, speeds = [], []
    for silo in silos:
        rows = [e["silos"][silo] for e in steady if silo in e["silos"]]
        rows = [r for r in rows if r.get("train-time") and r.get("batch-size")]
        if not rows:
            return None
        sizes.append(np.mean([r["batch-size"] for r in rows]))
        speeds.append(np.mean([r["batch-size"] / r["train-time"] for r in rows]))
    x, v = np.asarray(sizes), np.asarray(speeds)
    share = x.sum() * v / v.sum()
    return float(np.max(np.abs(x - share) / share))
