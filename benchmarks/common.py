"""What every benchmark section script shares: its command line, the data it runs on,
the machine it ran on, writing its section and plots, and the oracle split every FL
benchmark measures a balancer against (shared/DESIGN.md, "The ideal to measure against")."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import platform
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MNIST = ROOT.parent / "shared" / "data" / "mnist"

__all__ = [
    "CONFIDENCE",
    "MNIST",
    "RHO",
    "RESULTS",
    "ROOT",
    "WITHIN",
    "TelemetryOracle",
    "dataset",
    "ideal_time",
    "informed_follows",
    "machine",
    "mark",
    "mean_ci",
    "oracle_goal",
    "oracle_split",
    "parser",
    "quiet_logs",
    "rounds_within",
    "save_figure",
    "seeds_needed",
    "telemetry_oracle",
]

WITHIN = 0.05
"""'Within 5% of the oracle'."""
CONFIDENCE = 0.95
"""The confidence of every interval a section reports."""


def _default_rho() -> float | None:
    from fl_lbbsp.core import BALANCER_DEFAULTS

    rho = BALANCER_DEFAULTS["noise_budget"]
    return None if rho is None else float(rho)


RHO = _default_rho()
"""The noise budget of the oracle split and of T*: the default balancer's (shared/DESIGN.md,
"Speed and accuracy together"), so that "x oracle" means what a balancer could still fix."""


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every section takes: ``--out DIR`` and ``--smoke``."""
    args = argparse.ArgumentParser(description=description)
    args.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)"
    )
    args.add_argument(
        "--smoke", action="store_true", help="a tiny run that only checks the pipeline"
    )
    return args


@contextlib.contextmanager
def quiet_logs(names: Sequence[str] = ("flwr", "fl_lbbsp")) -> Iterator[None]:
    """Only errors from these loggers while the block runs (a study's hundreds of runs),
    their levels restored after it (a section's ``main`` called from a test leaves the
    process's logging as it found it)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def dataset(mnist: Path = MNIST) -> tuple[str, str]:
    """The dataset spec to run on and its description: real MNIST (the 10k test set in
    ``shared/data/mnist``) when present, else the embedded digits."""
    if (mnist / "t10k-images-idx3-ubyte.gz").is_file() or (
        mnist / "t10k-images-idx3-ubyte"
    ).is_file():
        return f"mnist:{mnist}", "real MNIST (the 10,000-image test set, split 8k train / 2k test)"
    return "embedded", (
        f"the embedded digits (scikit-learn, 1,797 images; MNIST not found at {mnist})"
    )


def machine() -> str:
    """One line on the machine: CPUs, Python, platform."""
    return (
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )


def save_figure(figure: Any, out: Path, name: str) -> str:
    """Save a matplotlib figure as ``out/name`` (PNG), close it, return the file name."""
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / name, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return name


# ------------------------------------------------------------------ the oracle split
def oracle_split(
    a: np.ndarray,
    b: np.ndarray,
    total: int,
    floor: int,
    *,
    knee: np.ndarray | None = None,
    rho: float | None = RHO,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The integer min-max split of the true cost curves ``t_i = a_i max(x, k_i) + b_i``
    of ``total`` samples, every silo at least ``floor``, within the noise budget ``rho``
    (the default balancer's; aggregation ``weights``, equal when ``None``): what a
    balancer that knew the curves would send under the same budget."""
    from fl_lbbsp.core.allocation.budget import budgeted_minmax

    lower = np.full(len(a), float(floor))
    return budgeted_minmax(a, b, total, knee=knee, lower=lower, weights=weights, rho=rho).sizes


def ideal_time(
    a: np.ndarray,
    b: np.ndarray,
    total: float,
    *,
    knee: np.ndarray | None = None,
    rho: float | None = RHO,
    weights: np.ndarray | None = None,
) -> float:
    """T*: the real-valued min-max round time of the true cost curves with the total
    fixed, under the same noise budget as the oracle (no other bound); with lines and no
    budget ``(X + sum_i b_i / a_i) / sum_i (1 / a_i)``."""
    from fl_lbbsp.core.allocation.budget import budgeted_ideal_time

    return budgeted_ideal_time(a, b, total, knee=knee, weights=weights, rho=rho)


def oracle_goal(jitter: float | str) -> float:
    """The issue's goal for round time / oracle: 1.05 at jitter (log-sd of the per-round
    noise) <= 10%, else 1.10 (also for real contention, ``jitter`` a string)."""
    return 1.05 if isinstance(jitter, float | int) and jitter <= 0.1 + 1e-12 else 1.10


def mark(ok: bool | None) -> str:
    """``met``, ``missed`` or ``n/a`` (nothing to judge)."""
    return "n/a" if ok is None else ("met" if ok else "missed")


def rounds_within(
    times: Sequence[float],
    references: Sequence[float],
    changes: Sequence[int],
    *,
    within: float = WITHIN,
) -> list[int | None]:
    """For each change (a 0-based position in ``times``, the first round at the new
    capacity): the rounds from it to the first round whose time is within ``within`` of
    its reference (0: the change round itself was), looking up to the next change or the
    end; ``None`` when no round was."""
    out: list[int | None] = []
    ends = [*changes[1:], len(times)]
    for start, end in zip(changes, ends, strict=True):
        found = None
        for r in range(start, end):
            if times[r] <= (1.0 + within) * references[r]:
                found = r - start
                break
        out.append(found)
    return out


def informed_follows(
    slopes: np.ndarray,
    fixed: np.ndarray,
    noise: np.ndarray,
    changes: Sequence[int],
    target: int,
    total: int,
    floor: int,
    *,
    confirm: int,
    within: float = WITHIN,
) -> list[bool]:
    """For each change: whether an informed balancer follows it within ``confirm``
    rounds, the reference for the goal of following a step change.

    The informed balancer knows every silo's true cost line of every round (``slopes``
    and ``fixed``, one row per round), except the changed silo's (``target``) new level,
    which it takes from the ``confirm`` reports that confirm the change: the geometric
    mean of that silo's noise factors ``noise[r : r + confirm, target]``, the same draws a
    balancer saw. That is the best any balancer that ignores a one-round spike can know at
    round r + confirm. Before then it sends the oracle split of the lines of round r - 1.
    Followed: a round from r to r + confirm whose noise-free round time (its split on the
    true lines of the round) is within ``within`` of the oracle split's.

    Parameters
    ----------
    slopes, fixed : numpy.ndarray
        Per-round true cost lines ``t_i = slopes[r, i] * x + fixed[r, i]``.
    noise : numpy.ndarray
        Per-round multiplicative noise factors of each silo, the same shape.
    changes : sequence of int
        The first round (0-based row) at each new capacity.
    target : int
        The changed silo's column.
    total, floor : int
        The total batch size X and the smallest batch size of the oracle split.
    confirm : int
        Reports that confirm a change (the balancer's ``change_confirm``).
    within : float (default: WITHIN)
        Relative distance to the oracle that counts as followed.
    """
    out = []
    for r in changes:
        slope, fix = slopes[r], fixed[r]
        best = oracle_split(slope, fix, total, floor)
        reference = float((slope * best + fix).max())
        old = max(r - 1, 0)
        split = oracle_split(slopes[old], fixed[old], total, floor)
        ok = float((slope * split + fix).max()) <= (1.0 + within) * reference
        if r + confirm < len(noise):
            level = float(np.exp(np.mean(np.log(noise[r : r + confirm, target]))))
            guess_slope, guess_fixed = slope.copy(), fix.copy()
            guess_slope[target] *= level
            guess_fixed[target] *= level
            x = oracle_split(guess_slope, guess_fixed, total, floor)
            ok = ok or float((slope * x + fix).max()) <= (1.0 + within) * reference
        out.append(ok)
    return out


@dataclass
class TelemetryOracle:
    """One run's rounds beside the oracle split under the same per-round noise.

    ``round_time``: the run's (emulated) round time; ``oracle``: the oracle split's, each
    silo's time at the oracle's batch size times the silo's noise factor of the round;
    ``clean`` and ``oracle_clean``: the same without the noise (the run's batch sizes and
    the oracle's on the true lines); ``equal``: FedAvg's equal split (B_init each) under
    the same noise; ``oracle_idle``: the oracle split's idle fraction under the noise,
    ``1 - mean_i t_i / max_i t_i``; ``noise``: every silo-round's noise factor;
    ``sizes``: the oracle's batch sizes per round; ``slowdowns`` and ``factors``: each
    round's emulated slowdowns k_i and noise factors, silos in id order; ``ideal``: T* of
    each round's true lines under the oracle's noise budget (:func:`ideal_time`)."""

    rounds: list[int] = field(default_factory=list)
    round_time: list[float] = field(default_factory=list)
    oracle: list[float] = field(default_factory=list)
    clean: list[float] = field(default_factory=list)
    oracle_clean: list[float] = field(default_factory=list)
    equal: list[float] = field(default_factory=list)
    oracle_idle: list[float] = field(default_factory=list)
    noise: list[float] = field(default_factory=list)
    sizes: list[list[int]] = field(default_factory=list)
    slowdowns: list[list[float]] = field(default_factory=list)
    factors: list[list[float]] = field(default_factory=list)
    ideal: list[float] = field(default_factory=list)

    def _select(self, values: Sequence[float], start: int, end: int | None) -> list[float]:
        stop = math.inf if end is None else end
        return [v for r, v in zip(self.rounds, values, strict=True) if start <= r < stop]

    def over_oracle(self, start: int = 0, end: int | None = None) -> float | None:
        """Mean round time over the mean oracle's, rounds ``start`` <= r < ``end``."""
        times = self._select(self.round_time, start, end)
        oracle = self._select(self.oracle, start, end)
        return float(np.mean(times) / np.mean(oracle)) if times else None

    def over_equal(self, start: int = 0, end: int | None = None) -> float | None:
        """Mean round time over the mean of the equal split's under the same noise."""
        times = self._select(self.round_time, start, end)
        equal = self._select(self.equal, start, end)
        return float(np.mean(times) / np.mean(equal)) if times else None

    def clean_over_oracle(self, start: int = 0, end: int | None = None) -> float | None:
        """The same without the noise: what the split alone costs against the oracle's."""
        times = self._select(self.clean, start, end)
        oracle = self._select(self.oracle_clean, start, end)
        return float(np.mean(times) / np.mean(oracle)) if times else None

    def noise_level(self) -> float:
        """Log-sd of the silo-rounds' noise factors: the run's jitter."""
        return float(np.std(np.log(self.noise))) if self.noise else 0.0

    def position(self, server_round: int) -> int:
        """Index of the first round at or after ``server_round``."""
        return next((k for k, r in enumerate(self.rounds) if r >= server_round), len(self.rounds))


def telemetry_oracle(
    events: Sequence[dict[str, Any]], a: float, b: float, *, floor: int
) -> TelemetryOracle:
    """The oracle split of a run of measured (not emulated) noise, from its telemetry.

    Every silo computes on this machine, so silo i, emulated ``k_i`` times slower, has
    the true cost line ``k_i (a x + b)`` for tau steps at batch size x (the one line fitted
    on every scheme's compute times of a comparison). Its noise factor in round r is
    ``t_i(r) / (k_i (a B_i + b))``, with ``t_i(r)`` its reported time at the batch size
    ``B_i`` it ran (for a silo that ran other than tau steps, scaled to tau steps). The
    oracle's round time is ``max_i k_i (a x*_i + b) noise_i(r)``, with ``x*`` the min-max
    split of the true lines (:func:`oracle_split`, the total ``n B_init``, every silo at
    least ``floor``, within the default noise budget); the equal split's (FedAvg's) is
    ``max_i k_i (a B_init + b) noise_i(r)``. Silos a scheme dropped (``dropped``: partial
    aggregation) count for the oracle, which aggregates every silo; skipped rounds are
    left out.
    """
    config = next(e for e in events if e.get("event") == "config")
    tau = float(config["local_steps"])
    b_init = int(config["batch_size"])
    total = b_init * int(config["silos"])
    out = TelemetryOracle()
    for event in events:
        if event.get("event") != "train" or event.get("round_time") is None:
            continue
        kept = event["silos"]
        silos = {**kept, **(event.get("dropped") or {})}
        ids = sorted(silos, key=lambda s: (len(s), s))
        k, expected, times = (np.zeros(len(ids)) for _ in range(3))
        for j, silo in enumerate(ids):
            row = silos[silo]
            x = float(row.get("step-batch-size", row["batch-size"]))
            steps = float(row.get("samples-processed") or x * tau) / x
            times[j] = float(row["train-time"])
            k[j] = float(row.get("slowdown") or times[j] / float(row["compute-time"]))
            expected[j] = k[j] * (a * x + b) * steps / tau
        noise = times / expected
        best = oracle_split(k * a, k * b, total, floor)
        at_best = k * (a * best + b)
        out.rounds.append(int(event["round"]))
        out.round_time.append(float(event["round_time"]))
        out.oracle.append(float(np.max(at_best * noise)))
        out.clean.append(float(max(e for s, e in zip(ids, expected, strict=True) if s in kept)))
        out.oracle_clean.append(float(np.max(at_best)))
        out.equal.append(float(np.max(k * (a * b_init + b) * noise)))
        out.oracle_idle.append(float(1.0 - np.mean(at_best * noise) / np.max(at_best * noise)))
        out.noise.extend(float(v) for v in noise)
        out.sizes.append([int(v) for v in best])
        out.slowdowns.append([float(v) for v in k])
        out.factors.append([float(v) for v in noise])
        out.ideal.append(ideal_time(k * a, k * b, total))
    return out


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Mean of ``values`` and its two-sided ``confidence`` interval from Student's t
    distribution with n - 1 degrees of freedom: ``mean -+ t * sd / sqrt(n)``.

    With one value the interval is unbounded (``-inf``, ``inf``); with no spread it is
    the mean itself.

    Raises
    ------
    ValueError
        No values, or a confidence outside (0, 1).
    """
    if not values:
        raise ValueError("mean_ci of no values")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(values)
    mean = statistics.fmean(values)
    if n == 1:
        return mean, -math.inf, math.inf
    from scipy import stats  # scikit-learn's dependency

    half = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * statistics.stdev(values)
    half /= math.sqrt(n)
    return mean, mean - half, mean + half


def seeds_needed(sd: float, margin: float, confidence: float = CONFIDENCE) -> int | None:
    """Fewest seeds whose CI half-width ``t(n - 1) * sd / sqrt(n)`` is at most ``margin``:
    how many seeds a true difference of 0 needs for its lower bound to stay above
    ``-margin`` (``None`` beyond 10,000 seeds)."""
    if sd <= 0.0:
        return 2
    from scipy import stats

    for n in range(2, 10_001):
        if float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n) <= margin:
            return n
    return None
