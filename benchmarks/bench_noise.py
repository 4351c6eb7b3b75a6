"""Benchmark section ``noise``: the balancer under per-round noise and step changes.

The balancer (``fl_lbbsp.core.BatchSizeBalancer`` with its defaults, what the strategies
use) is driven directly, without Flower: 5 silos whose round time is the emulated cost
line ``t_i(x) = tau * (a_i * x + b_i) * m_i(r) * noise_i(r)``, with ``a_i`` set by the
silo's capacity (spreads 2:1, 4:1, 8:1, geometric between the fastest and the slowest
silo), ``b_i`` zero or a mixed fixed cost, ``m_i(r)`` a capacity schedule (constant, or a
step x1/2 or x1/3 and back on the fastest or the middle silo) and ``noise_i(r)`` seeded
multiplicative jitter, log-normal with sigma 0, 0.1 or 0.3 and mean 1. Every round each
scheme is run under the same noise draws:

* LB-BSP: the balancer's batch sizes, decided from the times it was reported;
* the oracle split: the integer min-max split of the true cost lines of the round (with
  the same floor and noise budget), what a balancer that knew the lines would send;
* FedAvg: the equal split, B_init each.

Figures: round time / oracle (mean round time over the steady rounds, after a warm-up,
over the oracle's), round time / T* (T* of each round's true lines under the same noise
budget, no floor), idle
(``1 - mean_i t_i / max_i t_i``, averaged over the rounds) and, after each step change,
the rounds it takes to get within 5% of the oracle: with r the first round run at the
new capacity, the count of rounds from r to the first round whose noise-free round time
(the true lines without jitter) is within 5% of the oracle's noise-free round time (0:
round r itself already was; 2: rounds r and r+1 were not, r+2 was). One more run uses
real compute under real contention: each silo multiplies numpy matrices (tau steps whose
size grows with its batch size), the measured time scaled by its emulated capacity, while
CPU-burning processes of this script come and go on the same core; the three schemes run
back to back in every round and silo, and the oracle uses the work's cost line profiled
before the burners start.

Run: ``python benchmarks/bench_noise.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import (
    WITHIN,
    ideal_time,
    informed_follows,
    machine,
    mark,
    oracle_goal,
    oracle_split,
    parser,
    rounds_within,
)
from report import goal_met, write_section

from fl_lbbsp.core import (
    BatchSizeBalancer,
    SiloReport,
    idle_fraction,
)
from fl_lbbsp.core.allocation.budget import hinge_times, noise_ratio
from fl_lbbsp.core.balancer import BALANCER_DEFAULTS


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full or smoke)."""

    silos: int = 5
    tau: int = 40
    initial_batch_size: int = 48
    rounds: int = 40
    warmup: int = 5
    seeds: tuple[int, ...] = (0, 1, 2)
    spreads: tuple[float, ...] = (2.0, 4.0, 8.0)
    jitters: tuple[float, ...] = (0.0, 0.1, 0.3)
    fixed: tuple[str, ...] = ("none", "mixed")
    step_rounds: int = 45
    change_at: int = 16
    back_at: int = 31
    factors: tuple[float, ...] = (0.5, 1.0 / 3.0)
    targets: tuple[str, ...] = ("fastest", "middle")
    step_spreads: tuple[float, ...] = (2.0, 4.0, 8.0)
    real_rounds: int = 30
    real_spread: float = 4.0
    real_burners: int = 2
    real_width: int = 256
    real_seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    shared: float = 0.3
    shared_jitter: float = 0.1


FULL = Settings()
SMOKE = Settings(
    rounds=12, warmup=4, seeds=(0,), spreads=(2.0, 8.0), jitters=(0.0, 0.3), step_rounds=16,
    change_at=6, back_at=11, factors=(1.0 / 3.0,), targets=("fastest",), step_spreads=(8.0,),
    real_rounds=3, real_width=32, real_seeds=(0,), real_burners=1,
)  # fmt: skip

PER_SAMPLE = 0.01  # seconds per sample and step of the fastest silo (emulated)


# ----------------------------------------------------------------------- the cost lines
def capacities(spread: float, silos: int) -> np.ndarray:
    """Capacities from ``spread`` (fastest) down to 1 (slowest), geometric."""
    return np.asarray(spread ** np.linspace(1.0, 0.0, silos), dtype=np.float64)


def cost_lines(
    spread: float, fixed: str, settings: Settings, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step cost line of each silo: ``a_i = PER_SAMPLE * spread / capacity_i`` and
    ``b_i`` (``"none"``: 0; ``"mixed"``: ``u_i * a_i * B_init``, u_i uniform in [0.2, 1],
    so the fixed part is 17-50% of the silo's time at B_init)."""
    a = PER_SAMPLE * spread / capacities(spread, settings.silos)
    if fixed == "none":
        return a, np.zeros_like(a)
    if fixed == "mixed":
        return a, rng.uniform(0.2, 1.0, settings.silos) * a * settings.initial_batch_size
    raise ValueError(f"unknown fixed cost {fixed!r}")


def jitter(sigma: float, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Log-normal multiplicative noise with mean 1 and log-sd ``sigma``."""
    return np.asarray(np.exp(sigma * rng.standard_normal(shape) - sigma**2 / 2))


def step_schedule(
    settings: Settings, target: int, factor: float, rounds: int
) -> tuple[np.ndarray, list[int]]:
    """Time multipliers ``m[r, i]`` (capacity x factor from ``change_at`` to ``back_at``,
    1-based rounds) and the rounds (0-based) at which the capacity changes."""
    m = np.ones((rounds, settings.silos))
    m[settings.change_at - 1 : settings.back_at - 1, target] = 1.0 / factor
    return m, [settings.change_at - 1, settings.back_at - 1]


# --------------------------------------------------------------------------- one run
@dataclass
class Run:
    """Per-round round times of each scheme (with noise, and LB-BSP's and the oracle's
    without), T*, idle fractions and LB-BSP's batch sizes."""

    lbbsp: list[float] = field(default_factory=list)
    oracle: list[float] = field(default_factory=list)
    fedavg: list[float] = field(default_factory=list)
    lbbsp_clean: list[float] = field(default_factory=list)
    oracle_clean: list[float] = field(default_factory=list)
    ideal: list[float] = field(default_factory=list)
    ideal_free: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)
    noise_ratio: list[float] = field(default_factory=list)
    fedavg_idle: list[float] = field(default_factory=list)
    sizes: list[list[int]] = field(default_factory=list)

    def ratios(self, start: int) -> dict[str, float]:
        """Mean-round-time ratios and idle over the rounds from ``start`` (0-based)."""
        lb, orc, fed = (np.mean(v[start:]) for v in (self.lbbsp, self.oracle, self.fedavg))
        ideal = float(np.mean(self.ideal[start:]))
        return {
            "oracle": float(lb / orc),
            "ideal": float(lb / ideal),
            "ideal_free": float(lb / np.mean(self.ideal_free[start:])),
            "noise_ratio": float(np.mean(self.noise_ratio[start:])),
            "idle": float(np.mean(self.idle[start:])),
            "fedavg_oracle": float(fed / orc),
            "fedavg_ideal": float(fed / ideal),
            "fedavg_idle": float(np.mean(self.fedavg_idle[start:])),
            "over_fedavg": float(np.mean(self.lbbsp) / np.mean(self.fedavg)),
            "within": float(
                np.mean(
                    np.asarray(self.lbbsp_clean[start:])
                    <= (1.0 + WITHIN) * np.asarray(self.oracle_clean[start:])
                )
            ),
        }


def simulate(
    a: np.ndarray,
    b: np.ndarray,
    noise: np.ndarray,
    multipliers: np.ndarray,
    settings: Settings,
    *,
    balancer: BatchSizeBalancer | None = None,
    knee: np.ndarray | None = None,
) -> Run:
    """Drive a balancer for ``len(noise)`` rounds on the emulated curves (pure: no clock).

    Parameters
    ----------
    a, b : numpy.ndarray
        Per-step cost line of each silo (seconds per sample, seconds).
    noise : numpy.ndarray
        Multiplicative noise, one row per round.
    multipliers : numpy.ndarray
        Time multipliers ``m[r, i]`` of the capacity schedule, one row per round.
    settings : Settings
        tau, B_init, the number of silos.
    balancer : BatchSizeBalancer | None (default: None)
        The balancer to drive; ``None``: one with the defaults.
    knee : numpy.ndarray | None (default: None)
        Batch size up to which each silo's time is flat (a GPU's: ``a * max(x, k) + b``);
        ``None``: lines.
    """
    n, tau, b_init = settings.silos, settings.tau, settings.initial_batch_size
    balancer = balancer or BatchSizeBalancer(initial_batch_size=b_init)
    ids = [f"silo-{i}" for i in range(n)]
    total = n * b_init
    equal = np.full(n, b_init)
    run = Run()
    rho = balancer.noise_budget
    for r in range(len(noise)):
        slope, fixed = tau * a * multipliers[r], tau * b * multipliers[r]
        sizes = balancer.allocate(ids)
        x = np.array([sizes[i] for i in ids], dtype=np.float64)
        best = oracle_split(slope, fixed, total, balancer.floor, knee=knee, rho=rho)
        clean = hinge_times(slope, fixed, knee, x)
        times = clean * noise[r]
        fed = hinge_times(slope, fixed, knee, equal) * noise[r]
        at_best = hinge_times(slope, fixed, knee, best)
        run.lbbsp.append(float(times.max()))
        run.oracle.append(float((at_best * noise[r]).max()))
        run.fedavg.append(float(fed.max()))
        run.lbbsp_clean.append(float(clean.max()))
        run.oracle_clean.append(float(at_best.max()))
        run.ideal.append(ideal_time(slope, fixed, total, knee=knee, rho=rho))
        run.ideal_free.append(ideal_time(slope, fixed, total, knee=knee, rho=None))
        run.noise_ratio.append(noise_ratio(x))
        run.idle.append(idle_fraction(times))
        run.fedavg_idle.append(idle_fraction(fed))
        run.sizes.append([int(v) for v in x])
        balancer.report_round(
            {
                silo: SiloReport(
                    batch_size=int(x[k]), train_time=float(times[k]), samples=int(x[k]) * tau
                )
                for k, silo in enumerate(ids)
            }
        )
    return run


def rounds_to_oracle(
    run: Run, changes: Sequence[int], *, within: float = WITHIN
) -> list[int | None]:
    """For each change round r (0-based, the first round at the new capacity): rounds from
    r to the first round whose noise-free round time is within ``within`` of the
    oracle's (``None``: none before the next change or the end)."""
    return rounds_within(run.lbbsp_clean, run.oracle_clean, changes, within=within)


# ------------------------------------------------------------------------ the cells
def static_cells(settings: Settings) -> list[dict[str, Any]]:
    """Constant capacities: spread x fixed cost x jitter, each over the seeds."""
    cells = []
    for spread in settings.spreads:
        for fixed in settings.fixed:
            for sigma in settings.jitters:
                per_seed = []
                for seed in settings.seeds:
                    rng = np.random.default_rng(
                        [seed, int(spread * 10), len(fixed), int(sigma * 100)]
                    )
                    a, b = cost_lines(spread, fixed, settings, rng)
                    noise = jitter(sigma, (settings.rounds, settings.silos), rng)
                    m = np.ones_like(noise)
                    per_seed.append(simulate(a, b, noise, m, settings).ratios(settings.warmup))
                cells.append(
                    _summarise({"spread": spread, "fixed": fixed, "jitter": sigma}, per_seed)
                )
    return cells


def shared_cells(settings: Settings) -> list[dict[str, Any]]:
    """Constant capacities under a machine-wide slowdown: every silo's round time times a
    factor shared by all silos of the round (log-normal, log-sd ``settings.shared``: a
    busy machine or a shared cluster), on top of their own jitter
    (``settings.shared_jitter``). The shared factor leaves the oracle split unchanged.
    Each cell is also run on the same draws without the shared factor (``within_alone``,
    ``oracle_alone``), so that what the shared slowdown costs the balancer shows."""
    cells = []
    for spread in settings.spreads:
        for fixed in settings.fixed:
            per_seed, alone = [], []
            for seed in settings.seeds:
                rng = np.random.default_rng([seed, int(spread * 10), len(fixed), 13])
                a, b = cost_lines(spread, fixed, settings, rng)
                own = jitter(settings.shared_jitter, (settings.rounds, settings.silos), rng)
                shared = jitter(settings.shared, (settings.rounds, 1), rng)
                m = np.ones_like(own)
                per_seed.append(simulate(a, b, own * shared, m, settings).ratios(settings.warmup))
                alone.append(simulate(a, b, own, m, settings).ratios(settings.warmup))
            cell = _summarise(
                {
                    "spread": spread,
                    "fixed": fixed,
                    "jitter": settings.shared_jitter,
                    "shared": settings.shared,
                },
                per_seed,
            )
            cell["within_alone"] = float(np.mean([r["within"] for r in alone]))
            cell["oracle_alone"] = float(np.mean([r["oracle"] for r in alone]))
            cells.append(cell)
    return cells


def step_cells(settings: Settings) -> list[dict[str, Any]]:
    """Step changes: spread x target x factor x jitter x fixed cost, each over the seeds."""
    cells = []
    grid = itertools.product(
        settings.step_spreads, settings.targets, settings.factors, settings.jitters, settings.fixed
    )
    for spread, target, factor, sigma, fixed in grid:
        index = 0 if target == "fastest" else settings.silos // 2
        per_seed, counts, informed = [], [], []
        floor = BatchSizeBalancer(initial_batch_size=settings.initial_batch_size).floor
        for seed in settings.seeds:
            key = [seed, int(spread * 10), index, int(100 / factor), int(sigma * 100), len(fixed)]
            rng = np.random.default_rng([*key, 7])
            a, b = cost_lines(spread, fixed, settings, rng)
            noise = jitter(sigma, (settings.step_rounds, settings.silos), rng)
            m, changes = step_schedule(settings, index, factor, settings.step_rounds)
            run = simulate(a, b, noise, m, settings)
            per_seed.append(run.ratios(settings.warmup))
            counts.append(rounds_to_oracle(run, changes))
            informed.extend(
                informed_follows(
                    settings.tau * a * m,
                    settings.tau * b * m,
                    noise,
                    changes,
                    index,
                    settings.silos * settings.initial_batch_size,
                    floor,
                    confirm=BALANCER_DEFAULTS["change_confirm"],
                )
            )
        key_of = {"spread": spread, "target": target, "factor": factor, "jitter": sigma}
        cell = _summarise({**key_of, "fixed": fixed}, per_seed)
        down = [c[0] for c in counts]
        back = [c[1] for c in counts]
        cell["down"], cell["back"] = _worst(down), _worst(back)
        cell["rounds"] = _worst(down + back)
        cell["events"] = down + back
        cell["informed"] = informed
        cells.append(cell)
    return cells


def _worst(counts: Sequence[int | None]) -> int | None:
    """The largest count; ``None`` if any change was never followed."""
    return None if any(c is None for c in counts) else max(c for c in counts if c is not None)


def _summarise(key: dict[str, Any], per_seed: list[dict[str, float]]) -> dict[str, Any]:
    """Mean over the seeds of each ratio, and the worst seed's LB-BSP / oracle."""
    cell: dict[str, Any] = dict(key)
    for name in per_seed[0]:
        cell[name] = float(np.mean([s[name] for s in per_seed]))
    cell["oracle_worst"] = float(max(s["oracle"] for s in per_seed))
    cell["over_fedavg_worst"] = float(max(s["over_fedavg"] for s in per_seed))
    return cell


# ---------------------------------------------------------------- real contention run
def _work(x: int, steps: int, data: np.ndarray, weights: np.ndarray) -> float:
    """Seconds of ``steps`` matrix products of a ``x``-row block (real compute)."""
    tick = time.perf_counter()
    for _ in range(steps):
        (data[:x] @ weights).sum()
    return time.perf_counter() - tick


def profile_line(
    sizes: Sequence[int], steps: int, data: np.ndarray, weights: np.ndarray, repeats: int = 5
) -> tuple[float, float]:
    """The work's cost line ``t = a x + b`` for ``steps`` steps: least squares over the
    median of ``repeats`` timings at each size."""
    xs = np.asarray(sizes, dtype=np.float64)
    ts = np.array(
        [np.median([_work(int(x), steps, data, weights) for _ in range(repeats)]) for x in xs]
    )
    slope, intercept = np.polyfit(xs, ts, 1)
    return float(max(slope, 1e-12)), float(max(intercept, 0.0))


def real_run(settings: Settings, seed: int) -> dict[str, float]:
    """LB-BSP, the oracle split and FedAvg on real compute under real contention."""
    from bench_predictors import Burners, contention, contention_schedule
    from bench_predictors import Settings as TraceSettings

    n, tau, b_init = settings.silos, settings.tau, settings.initial_batch_size
    total = n * b_init
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((total, settings.real_width))
    weights = rng.standard_normal((settings.real_width, settings.real_width))
    slowdown = settings.real_spread / capacities(settings.real_spread, n)
    saved = _pin()
    core = None if saved is None else next(iter(os.sched_getaffinity(0)))
    balancer = BatchSizeBalancer(initial_batch_size=b_init)
    floor = balancer.floor
    try:
        a0, b0 = profile_line(np.linspace(floor, total // 2, 6).astype(int), tau, data, weights)
        slope, fixed = slowdown * a0, slowdown * b0
        best = oracle_split(slope, fixed, total, floor)
        equal = np.full(n, b_init)
        ideal = ideal_time(slope, fixed, total)
        quiet = float(np.max(slope * best + fixed))
        # The schedule in rounds of wall time (all three schemes' work, unslowed): a
        # co-tenant stays 5-30 rounds, spikes as long as 0.2-1 silo's work arrive every
        # 3 rounds on average.
        wall = 3.0 * (a0 * total + n * b0)
        work = wall / (3 * n)
        trace = TraceSettings(
            duration=2.0 * wall * settings.real_rounds, batch_size=1,
            burners=settings.real_burners, period=(5 * wall, 30 * wall),
            spike_rate=1.0 / (3 * wall), spike_length=(0.2 * work, work), narx={}, window=1,
            seed=seed,
        )  # fmt: skip
        changes = contention_schedule(trace, rng)
        burners = Burners(settings.real_burners, cpus=None if core is None else [core], limit=600.0)
        lb, orc, fed, idle, fed_idle = [], [], [], [], []
        ids = [f"silo-{i}" for i in range(n)]
        try:
            with contention(burners, changes):
                for r in range(settings.real_rounds):
                    sizes = balancer.allocate(ids)
                    x = [sizes[i] for i in ids]
                    times = np.zeros((3, n))
                    for k in range(n):
                        plan = [(0, x[k]), (1, int(best[k])), (2, int(equal[k]))]
                        for which, size in plan[r % 3 :] + plan[: r % 3]:  # rotate the order
                            times[which, k] = slowdown[k] * _work(size, tau, data, weights)
                    balancer.report_round(
                        {
                            silo: SiloReport(
                                batch_size=x[k], train_time=float(times[0, k]), samples=x[k] * tau
                            )
                            for k, silo in enumerate(ids)
                        }
                    )
                    lb.append(times[0].max())
                    orc.append(times[1].max())
                    fed.append(times[2].max())
                    idle.append(idle_fraction(times[0]))
                    fed_idle.append(idle_fraction(times[2]))
        finally:
            burners.close()
    finally:
        if saved is not None:
            os.sched_setaffinity(0, saved)
    start = min(settings.warmup, len(lb) - 1)
    return {
        "oracle": float(np.mean(lb[start:]) / np.mean(orc[start:])),
        "ideal": float(np.mean(lb[start:]) / ideal),
        "idle": float(np.mean(idle[start:])),
        "fedavg_oracle": float(np.mean(fed[start:]) / np.mean(orc[start:])),
        "fedavg_ideal": float(np.mean(fed[start:]) / ideal),
        "fedavg_idle": float(np.mean(fed_idle[start:])),
        "over_fedavg": float(np.mean(lb) / np.mean(fed)),
        "noise": float(np.std(np.log(np.asarray(orc) / quiet))),
    }


def _pin() -> set[int] | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(saved)})
    return saved


def _one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS on one thread (a multi-threaded BLAS on a shared 2-core box times its
    own thread scheduling, not the work)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(1)


def real_cells(settings: Settings) -> list[dict[str, Any]]:
    """The real-contention run over its seeds."""
    with _one_blas_thread():
        per_seed = [real_run(settings, seed) for seed in settings.real_seeds]
    cell = _summarise({"spread": settings.real_spread, "jitter": "real"}, per_seed)
    cell["noise"] = float(np.mean([s["noise"] for s in per_seed]))
    return [cell]


# --------------------------------------------------------------------------- section
def _figure(
    label: str,
    value: float | None,
    goal: dict[str, Any] | None,
    note: str,
    fmt: str = ".3f",
    unit: str = "",
) -> dict[str, Any]:
    return {"label": label, "value": value, "format": fmt, "unit": unit, "goal": goal, "note": note}


def section(
    static: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    real: list[dict[str, Any]],
    settings: Settings,
    smoke: bool,
    seconds: float,
    load: tuple[float, float] | None = None,
    shared: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The section JSON (schema of benchmarks/report.py); ``load``: the 1-minute load
    average at the start and the end of the run (the real-contention run shares the
    machine with whatever else runs)."""
    low = [c for c in static if c["jitter"] <= 0.1 + 1e-12]
    high = [c for c in static if c["jitter"] > 0.1 + 1e-12]
    figures = []

    def worst(cells: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
        return max(cells, key=lambda c: c[key]) if cells else None

    for cells, target, label in ((low, 1.05, "<= 10%"), (high, 1.10, "30%")):
        w = worst(cells, "oracle")
        figures.append(
            _figure(
                f"LB-BSP round time / oracle, worst cell at jitter {label}",
                None if w is None else w["oracle"],
                {"op": "<=", "target": target},
                "no cell"
                if w is None
                else (
                    f"mean of {len(settings.seeds)} seeds in the worst of {len(cells)} cells "
                    f"(spread {w['spread']:g}:1, fixed cost {w['fixed']}, "
                    f"jitter {w['jitter']:.0%}); "
                    f"worst single seed {w['oracle_worst']:.3f}"
                ),
            )
        )
    shared = shared or []
    if shared:
        w = max(shared, key=lambda c: c["oracle"])
        figures.append(
            _figure(
                "LB-BSP round time / oracle, worst cell with a machine-wide slowdown",
                w["oracle"],
                {"op": "<=", "target": oracle_goal(settings.shared_jitter)},
                f"a factor of log-sd {settings.shared:.0%} shared by every silo of a round, on "
                f"{settings.shared_jitter:.0%} jitter of each silo's own; "
                f"mean of {len(settings.seeds)} seeds in the worst of {len(shared)} cells "
                f"(spread {w['spread']:g}:1, fixed cost {w['fixed']}); worst single seed "
                f"{w['oracle_worst']:.3f}; on the same draws without the shared factor "
                f"{w['oracle_alone']:.3f}. A factor shared by every silo of a round leaves "
                "the best split unchanged, so the goal is the one of the silos' own jitter.",
            )
        )
        figures.append(
            _figure(
                "steady rounds within 5% of the oracle (noise-free), machine-wide slowdown cells",
                float(np.mean([c["within"] for c in shared])),
                None,
                "the same draws without the shared factor: "
                f"{np.mean([c['within_alone'] for c in shared]):.1%} (the balancer takes "
                "the slowdown its silos share out of a round's reports, `common_noise`)",
                fmt=".1%",
            )
        )
    every = static + shared + steps + real
    w = worst(every, "over_fedavg")
    figures.append(
        _figure(
            "LB-BSP round time / FedAvg's, worst cell",
            None if w is None else w["over_fedavg"],
            {"op": "<=", "target": 1.0},
            f"mean round time over all rounds (warm-up included), mean of the seeds, worst of all "
            f"{len(every)} cells (static, machine-wide, step, real); worst single run "
            f"{max(c['over_fedavg_worst'] for c in every):.3f}",
        )
    )
    for cells, label, goal in (
        (
            [c for c in steps if c["jitter"] <= 0.1 + 1e-12],
            "jitter <= 10%",
            {"op": "<=", "target": 2},
        ),
        ([c for c in steps if c["jitter"] > 0.1 + 1e-12], "jitter 30%", None),
    ):
        if not cells:
            continue
        counts = [c["rounds"] for c in cells]
        value = None if any(v is None for v in counts) else float(max(counts))
        followed = sum(v is not None and v <= 2 for v in counts)
        events = [e for c in cells for e in c["events"]]
        quick = sum(e is not None and e <= 2 for e in events)
        figures.append(
            _figure(
                "rounds to within 5% of the oracle after a step change, worst step cell at "
                + label,
                value,
                goal,
                f"worst over {len(cells)} cells x {len(settings.seeds)} seeds x 2 changes "
                f"(down and back); {followed} of {len(cells)} cells within 2 rounds; "
                f"{quick} of {len(events)} changes followed within 2 rounds"
                + ("" if goal else "; no goal: see the notes"),
                fmt="d",
            )
        )
        informed = [e for c in cells for e in c.get("informed", [])]
        best = sum(informed) / len(informed) if informed else None
        figures.append(
            _figure(
                f"share of step changes followed within 2 rounds, {label}",
                quick / len(events) if events else None,
                None if goal is None else {"op": ">=", "target": 1.0},
                f"{quick} of {len(events)} changes (down and back, every seed); the figure "
                "above is n/a when some change was not followed within the run"
                + (
                    ""
                    if best is None
                    else f"; an informed balancer (every true line, the changed silo's new "
                    f"level from the 2 reports that confirm the change) follows "
                    f"{sum(informed)} of {len(informed)} ({best:.3f}): the goal of every "
                    "change asks more than those 2 reports can tell"
                ),
                fmt=".3f",
            )
        )
        if best:
            figures.append(
                _figure(
                    f"share of step changes followed within 2 rounds, LB-BSP / informed "
                    f"balancer, {label}",
                    quick / len(events) / best,
                    None,
                    "the informed balancer: the best any balancer that confirms a change "
                    "from 2 reports can know at round r + 2 (the same noise draws)",
                    fmt=".3f",
                )
            )
    if real:
        c = real[0]
        figures.append(
            _figure(
                "real contention: LB-BSP round time / oracle",
                c["oracle"],
                {"op": "<=", "target": 1.10},
                f"mean of {len(settings.real_seeds)} seeds (worst {c['oracle_worst']:.3f}); "
                f"round time / T* {c['ideal']:.3f}, idle {c['idle']:.1%}; FedAvg / oracle "
                f"{c['fedavg_oracle']:.3f}; contention noise (log-sd of the oracle's round "
                f"time) {c['noise']:.2f}",
            )
        )
    for level in sorted({c["jitter"] for c in static}):
        cells = [c for c in static if c["jitter"] == level]
        figures.append(
            _figure(
                f"steady rounds within 5% of the oracle (noise-free), static cells at jitter "
                f"{level:.0%}",
                float(np.mean([c["within"] for c in cells])),
                None,
                "share of the steady rounds whose noise-free round time is within 5% of the "
                "oracle's: the chance that any one round after a change is, once the change "
                "is followed (the estimates of the silos' levels carry the jitter of the "
                "reports they rest on)",
                fmt=".1%",
            )
        )
    figures.append(
        _figure(
            "LB-BSP round time / T*, mean over the static cells",
            float(np.mean([c["ideal"] for c in static])),
            None,
            f"FedAvg: {np.mean([c['fedavg_ideal'] for c in static]):.3f}; how far noise "
            "takes every scheme from the ideal (T* under the same noise budget; over T* "
            f"without a budget: {np.mean([c['ideal_free'] for c in static]):.3f}, update "
            f"noise vs FedAvg {np.mean([c['noise_ratio'] for c in static]):.2f})",
        )
    )
    figures.append(
        _figure(
            "LB-BSP idle fraction, mean over the static cells",
            float(np.mean([c["idle"] for c in static])),
            None,
            f"FedAvg: {np.mean([c['fedavg_idle'] for c in static]):.1%}",
            fmt=".1%",
        )
    )
    static_rows = [
        [
            f"{c['spread']:g}:1", c["fixed"], f"{c['jitter']:.0%}", f"{c['oracle']:.3f}",
            f"{c['oracle_worst']:.3f}", f"{c['ideal']:.3f}", f"{c['idle']:.1%}",
            f"{c['fedavg_oracle']:.3f}", f"{c['fedavg_ideal']:.3f}", f"{c['fedavg_idle']:.1%}",
            mark(c["oracle"] <= oracle_goal(c["jitter"]) and c["over_fedavg"] <= 1.0),
        ]
        for c in static
    ]  # fmt: skip
    step_rows = [
        [
            f"{c['spread']:g}:1", c["target"], f"x1/{round(1 / c['factor'])}", f"{c['jitter']:.0%}",
            c["fixed"], _count(c["down"]), _count(c["back"]), f"{c['oracle']:.3f}",
            f"{c['fedavg_oracle']:.3f}",
            mark(c["rounds"] is not None and c["rounds"] <= 2 and c["over_fedavg"] <= 1.0)
            if c["jitter"] <= 0.1 + 1e-12 else "no goal",
        ]
        for c in steps
    ]  # fmt: skip
    shared_rows = [
        [
            f"{c['spread']:g}:1", c["fixed"], f"{c['oracle']:.3f}", f"{c['oracle_worst']:.3f}",
            f"{c['oracle_alone']:.3f}", f"{c['within']:.1%}", f"{c['within_alone']:.1%}",
            f"{c['fedavg_oracle']:.3f}",
            mark(c["oracle"] <= oracle_goal(c["jitter"]) and c["over_fedavg"] <= 1.0),
        ]
        for c in shared
    ]  # fmt: skip
    real_rows = [
        [
            f"{c['spread']:g}:1", f"{c['noise']:.2f}", f"{c['oracle']:.3f}", f"{c['ideal']:.3f}",
            f"{c['idle']:.1%}", f"{c['fedavg_oracle']:.3f}", f"{c['fedavg_ideal']:.3f}",
            f"{c['fedavg_idle']:.1%}", mark(c["oracle"] <= 1.10 and c["over_fedavg"] <= 1.0),
        ]
        for c in real
    ]  # fmt: skip
    defaults = ", ".join(
        f"{k}={v!r}" for k, v in BALANCER_DEFAULTS.items() if not k.endswith("_options")
    )
    setting = (
        f"{settings.silos} silos, tau = {settings.tau}, B_init = {settings.initial_batch_size} "
        f"(X = {settings.silos * settings.initial_batch_size}), the balancer with its defaults "
        f"(`{defaults}`), driven directly (no Flower). Emulated: silo i's round takes "
        f"tau * (a_i x + b_i) * m_i(r) * noise_i(r) seconds (nothing is run or waited for), "
        f"capacities geometric between the spread and 1, a_i = {PER_SAMPLE} s * spread / "
        f"capacity_i, b_i = 0 (fixed cost none) or u_i * a_i * B_init with u_i uniform in "
        f"[0.2, 1] per silo and seed (mixed); noise log-normal with mean 1 and log-sd 0, 0.1 "
        f"or 0.3 (seeded, the same draws for every scheme). Static cells: {settings.rounds} "
        f"rounds, figures over the rounds after a warm-up of {settings.warmup}. Step cells: "
        f"{settings.step_rounds} rounds, the target silo's capacity x1/2 or x1/3 from round "
        f"{settings.change_at} and back at round {settings.back_at}. Oracle: the integer "
        f"min-max split of each round's true lines with the same floor and noise budget "
        f"(rho = {BALANCER_DEFAULTS['noise_budget']:.3g}, the default balancer's); T*: the "
        f"ideal of each round's true lines under that budget. Seeds {list(settings.seeds)}. "
        f"Machine-wide slowdown cells: the "
        f"static cells' lines and rounds, each silo's own jitter {settings.shared_jitter:.0%} "
        f"times a factor shared by every silo of the round (log-normal, log-sd "
        f"{settings.shared:.0%}), and the same draws without it beside. Real contention: "
        f"{settings.real_rounds} rounds of real numpy matrix products (tau steps of a "
        f"(B x {settings.real_width}) @ ({settings.real_width} x {settings.real_width}) "
        f"product, numpy on one BLAS thread), the measured time multiplied by an emulated "
        f"slowdown (spread "
        f"{settings.real_spread:g}:1), pinned to one core with {settings.real_burners} "
        f"CPU-burning processes of this script switched on and off on a seeded schedule on "
        f"that core (a co-tenant of 1-{settings.real_burners} burners stays 5-30 rounds, off "
        f"periods as long, spikes of all burners lasting 0.2-1 silo's work every 3 rounds on "
        f"average); the three schemes run back to back in every round and silo (rotating "
        f"order), so they share the contention but not its exact draws; the oracle uses the "
        f"work's line profiled before the burners start; seeds {list(settings.real_seeds)}. "
        f"Machine: {machine()}; {seconds:.0f} s in all"
        + (
            f", 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end."
            if load
            else "."
        )  # fmt: skip
        + (" Smoke run: tiny settings, the figures mean nothing." if smoke else "")
    )
    notes = [
        "Round time / oracle is the mean round time over the steady rounds over the oracle "
        "split's under the same noise: what the balancer could still fix. Round time / T* "
        "adds what noise (the max over the silos' jitter) costs every scheme; T* and the "
        "oracle honour the same noise budget as the balancer (issue 29).",
        "Rounds to within 5% of the oracle after a change: with r the first round run at the "
        "new capacity, the number of rounds from r to the first round whose noise-free round "
        "time is within 5% of the oracle's noise-free round time. With change_confirm = 2 a "
        "change is seen in the reports of rounds r and r+1 and followed in round r+2, so 2 is "
        "the best a balancer that ignores a one-round spike can do.",
        "At 30% jitter a step of x1/2 is about 2.3 sigma of one round's noise: no detector "
        "confirms it within 2 rounds without also taking one-round spikes for changes, so the "
        "step cells at 30% carry no goal; the robust fit's window follows them within its "
        f"length ({BALANCER_DEFAULTS['history']} reports).",
        "With jitter, a change is confirmed from 2 reports, so the changed silo's new level "
        "rests on them (at 10% jitter about 7% off) and the other silos' on their windows: "
        "the first rounds after a change land within 5% of the oracle only as often as the "
        "estimates allow (see the share of steady rounds within 5% beside the step figures); "
        "the goal of <= 2 rounds in every step cell asks for more than 2 reports of 10% "
        "jitter can tell.",
        "Goals: round time / oracle <= 1.05 at jitter <= 10% and <= 1.10 at 30% (and the real "
        "run) in every cell; LB-BSP never slower than FedAvg in any cell; rounds to within 5% "
        "of the oracle after a step change <= 2 in every step cell at jitter <= 10%.",
    ]
    return {
        "section": "noise",
        "title": "Noise: the balancer against the oracle split under jitter and step changes",
        "setting": setting,
        "figures": figures,
        "tables": [
            {
                "title": "Static capacities (mean of the seeds)",
                "columns": [
                    "spread",
                    "fixed cost",
                    "jitter",
                    "LB-BSP / oracle",
                    "worst seed",
                    "LB-BSP / T*",
                    "LB-BSP idle",
                    "FedAvg / oracle",
                    "FedAvg / T*",
                    "FedAvg idle",
                    "goals",
                ],
                "rows": static_rows,
            },
            {
                "title": "Step changes (rounds to within 5% of the oracle: worst seed)",
                "columns": [
                    "spread",
                    "silo",
                    "capacity",
                    "jitter",
                    "fixed cost",
                    "rounds (down)",
                    "rounds (back)",
                    "LB-BSP / oracle",
                    "FedAvg / oracle",
                    "goals",
                ],
                "rows": step_rows,
            },
            {
                "title": f"Machine-wide slowdown (log-sd {settings.shared:.0%}, shared by every "
                f"silo of a round) on {settings.shared_jitter:.0%} jitter (mean of the seeds)",
                "columns": [
                    "spread",
                    "fixed cost",
                    "LB-BSP / oracle",
                    "worst seed",
                    "without the shared factor",
                    "rounds within 5%",
                    "without the shared factor, within 5%",
                    "FedAvg / oracle",
                    "goals",
                ],
                "rows": shared_rows,
            },
            {
                "title": "Real compute under real contention (mean of the seeds)",
                "columns": [
                    "spread",
                    "noise (log-sd)",
                    "LB-BSP / oracle",
                    "LB-BSP / T*",
                    "LB-BSP idle",
                    "FedAvg / oracle",
                    "FedAvg / T*",
                    "FedAvg idle",
                    "goals",
                ],
                "rows": real_rows,
            },
        ],  # fmt: skip
        "plots": [],
        "notes": notes,
    }


def _count(value: int | None) -> str:
    return "never" if value is None else str(value)


def print_section(data: dict[str, Any]) -> None:
    """The figures with their goals, then the tables, as plain text."""
    for figure in data["figures"]:
        goal = figure["goal"]
        met = goal_met(figure["value"], goal)
        value = "n/a" if figure["value"] is None else format(figure["value"], ".3f")
        target = "-" if goal is None else f"{goal['op']} {goal['target']}"
        print(f"{figure['label']:<90} {value:>8}  goal {target:<8} {mark(met) if goal else ''}")
    for table in data["tables"]:
        print(f"\n{table['title']}")
        widths = [
            max([len(str(c)), *(len(str(r[k])) for r in table["rows"])])
            for k, c in enumerate(table["columns"])
        ]
        print("  ".join(str(c).ljust(w) for c, w in zip(table["columns"], widths, strict=True)))
        for row in table["rows"]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def run(settings: Settings, *, real: bool = True) -> tuple[list[dict[str, Any]], ...]:
    """Every cell of the section: static, step, real, machine-wide slowdown."""
    return (
        static_cells(settings),
        step_cells(settings),
        real_cells(settings) if real else [],
        shared_cells(settings),
    )


def main(
    argv: Sequence[str] | None = None, *, report: Callable[[dict[str, Any]], None] = print_section
) -> int:
    """Run the cells, print the figures and tables, write ``noise.json``."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--no-real", action="store_true", help="skip the real-contention run")
    args = cli.parse_args(argv)
    settings = SMOKE if args.smoke else FULL
    start, load = time.perf_counter(), os.getloadavg()[0]
    static, steps, real, shared = run(settings, real=not args.no_real)
    data = section(
        static, steps, real, settings, args.smoke, time.perf_counter() - start,
        (load, os.getloadavg()[0]), shared,
    )  # fmt: skip
    path = write_section(data, args.out)
    report(data)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
