"""The hold gate: keep the ranks' batch sizes unless moving them is predicted to gain more
than the ranks' measured noise.

On equal ranks the compute times still differ from window to window (co-tenants, the
scheduler, ranks sharing cores): a balancer that follows them moves samples after the
noise, and the rank it loads then is the slowest of the next window. The gate judges each
window of the exchange of times before the balancer's allocation is applied:

- predicted gain: with batch sizes proportional to the ranks' speeds over the window
  (time per sample), every rank would finish at ``T = X / sum_r B_r / t_r``; the gain is
  ``G = 1 - T / max_r t_r``, the share of the iteration the slowest rank would give back;
- measured noise: how much a rank's time per sample, relative to the ranks' mean, moves
  from one window to the next (a robust spread: the median of the successive differences,
  so that a lasting change of speed, one difference, does not count as noise), and, while
  few windows are known, the standard error of the window's means from each rank's spread
  of per-iteration times;
- the sizes move when ``G`` exceeds ``tolerance`` and ``sigmas`` times the noise in two
  windows in a row, the slowest rank of the second behind the ranks' mean in the first
  too (a lasting lead, not one spike); then two windows at the new sizes come before
  the next move.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.1 (batch sizes proportional to the predicted speeds,
so that the workers finish together).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HoldGate",
    "Verdict",
    "WindowStats",
    "WindowTally",
    "auto_every",
    "predicted_gain",
    "review_proposal",
]

MAD_TO_SD = 1.4826
"""Scale of a median absolute deviation to a normal standard deviation."""


@dataclass(frozen=True)
class WindowStats:
    """One rank's figures over a window of the exchange.

    Parameters
    ----------
    batch_size : int
        Its batch size in the window.
    time : float
        Seconds of compute summed over the window's iterations.
    square : float
        Sum of the squared per-iteration seconds (for the spread within the window).
    iterations : int
        Iterations in the window.
    """

    batch_size: int
    time: float
    square: float
    iterations: int

    @property
    def mean(self) -> float:
        """Mean seconds per iteration (0 for an empty window)."""
        return self.time / self.iterations if self.iterations else 0.0

    def relative_error(self) -> float | None:
        """Standard error of the window's mean over the mean itself, ``None`` when fewer
        than 2 iterations (no spread) or no time."""
        count, mean = self.iterations, self.mean
        if count < 2 or mean <= 0 or not math.isfinite(self.square):
            return None
        variance = max(self.square - count * mean * mean, 0.0) / (count - 1)
        return math.sqrt(variance / count) / mean


@dataclass
class WindowTally:
    """This rank's window while it runs: what :class:`WindowStats` and the exchange's row
    are made of.

    Parameters
    ----------
    time, square : float (default: 0.0)
        Seconds of compute summed over the window's iterations, and their squares.
    samples, iterations : int (default: 0)
        Samples processed and iterations.
    wall : float (default: 0.0)
        Wall seconds between the window's steps.
    """

    time: float = 0.0
    square: float = 0.0
    samples: int = 0
    iterations: int = 0
    wall: float = 0.0

    def add(self, seconds: float, samples: int, wall: float) -> None:
        """Count an iteration of ``seconds`` of compute, ``samples``, ``wall`` seconds."""
        self.wall += wall
        self.time += seconds
        self.square += seconds * seconds
        self.samples += samples
        self.iterations += 1


def auto_every(
    cost: float, wall: float, count: float, share: float, largest: int, current: int
) -> int:
    """The smallest k that keeps an exchange costing ``cost`` seconds within ``share`` of
    the wall time of k iterations (``wall`` over ``count`` iterations), at most
    ``largest``; ``current`` while cost or wall is unknown (not positive)."""
    if cost <= 0 or wall <= 0:
        return current
    per_iteration = wall / max(count, 1)
    return max(1, min(largest, math.ceil(cost / (share * per_iteration))))


def predicted_gain(windows: Sequence[WindowStats], sizes: Sequence[int]) -> float | None:
    """The share of the window's slowest mean iteration that ``sizes`` would give back,
    each rank's time per sample taken as the window's: ``1 - max_r (t_r B'_r / B_r) /
    max_r t_r`` (negative: predicted slower than the sizes in force); ``None`` when a
    window has no time or no batch."""
    means = [w.mean for w in windows]
    if len(sizes) != len(windows) or not all(
        w.batch_size > 0 and math.isfinite(m) and m > 0 for w, m in zip(windows, means, strict=True)
    ):
        return None
    slowest = max(means)
    proposed = max(m * b / w.batch_size for w, m, b in zip(windows, means, sizes, strict=True))
    return 1.0 - proposed / slowest


def review_proposal(
    verdict: Verdict, windows: Sequence[WindowStats], sizes: Sequence[int]
) -> Verdict:
    """The gate's verdict on the balancer's allocation ``sizes`` once the gate let a move
    through: held (reason ``"proposal no faster"``) when the window that moved the gate
    predicts those sizes no faster than the sizes in force (:func:`predicted_gain` <= 0),
    as when the balancer's cost lines, fitted to noisy windows at two sizes, overreact;
    else ``verdict`` as it is."""
    if not verdict.move:
        return verdict
    gain = predicted_gain(windows, sizes)
    if gain is None or gain > 0.0:
        return verdict
    return Verdict(False, verdict.gain, verdict.noise, verdict.slowest, "proposal no faster")


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one window.

    Parameters
    ----------
    move : bool
        Whether the new allocation is to be applied.
    gain : float
        Predicted gain G (share of the slowest rank's time) of a split proportional to
        the window's speeds.
    noise : float | None
        The noise the gain was held against (relative), ``None`` when unknown.
    slowest : int
        Index of the slowest rank in the window.
    reason : str
        Why (for the logs): ``"within tolerance"``, ``"within noise"``,
        ``"unconfirmed"``, ``"confirmed"``, ``"beyond tolerance"`` (no noise test),
        ``"noise unknown"`` (a window of one iteration, too few windows yet),
        ``"no times"`` or, set by :func:`review_proposal`, ``"proposal no faster"``.
    equal : bool (default: False)
        Whether the window shows the ranks equal: its gain within the tolerance, or within
        one standard deviation of the noise measured between windows (the window is
        what equal ranks give); not when the gain is only within the move's margin of
        the noise (``sigmas`` times it), nor before the noise between windows is known.
        The exchange backs off only on such windows (:class:`~.cadence.Cadence`).
    """

    move: bool
    gain: float
    noise: float | None
    slowest: int
    reason: str
    equal: bool = False


class HoldGate:
    """Decide, window after window, whether the ranks' batch sizes may move.

    Pure logic, the same on every rank: fed the same gathered windows, every rank reaches
    the same verdict.

    Parameters
    ----------
    tolerance : float (default: 0.02)
        Hold while the predicted gain is at most this share of the iteration, whatever
        the noise. 0 with ``sigmas`` ``None``: every window moves.
    sigmas : float | None (default: 2.0)
        Hold while the gain is within this many times the measured noise. ``None``:
        only ``tolerance`` holds.
    history : int (default: 16)
        Windows of relative times kept for the noise between windows.
    min_history : int (default: 4)
        Windows needed before the noise between windows is used (before: the standard
        error within the window).

    Raises
    ------
    ValueError
        On a tolerance outside [0, 1), negative or infinite sigmas, or a history shorter
        than 3 or than ``min_history``.
    """

    def __init__(
        self,
        *,
        tolerance: float = 0.02,
        sigmas: float | None = 2.0,
        history: int = 16,
        min_history: int = 4,
    ) -> None:
        if not (isinstance(tolerance, float | int) and 0 <= tolerance < 1):
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        if sigmas is not None and not (isinstance(sigmas, float | int) and 0 <= sigmas < math.inf):
            raise ValueError(f"sigmas must be a finite number >= 0, got {sigmas!r}")
        if isinstance(min_history, bool) or not isinstance(min_history, int) or min_history < 3:
            raise ValueError(f"min_history must be an integer >= 3, got {min_history!r}")
        if isinstance(history, bool) or not isinstance(history, int) or history < min_history:
            raise ValueError(f"history must be an integer >= min_history, got {history!r}")
        self.tolerance = float(tolerance)
        self.sigmas = None if sigmas is None else float(sigmas)
        self.history = history
        self.min_history = min_history
        self._relative: deque[tuple[float, ...]] = deque(maxlen=history)
        self._last_means: tuple[float, ...] | None = None
        self._over = False

    def reset(self) -> None:
        """Forget the windows seen (another world of ranks, a resumed job)."""
        self._relative.clear()
        self._last_means = None
        self._over = False

    def noise(self) -> float | None:
        """The noise between windows: a rank's relative time per sample, its successive
        differences' median absolute value scaled to a standard deviation (of one
        window, hence the 1/sqrt(2)), pooled over the ranks (root mean square); ``None``
        before ``min_history`` windows."""
        if len(self._relative) < self.min_history:
            return None
        windows = list(self._relative)
        spreads = []
        for r in range(len(windows[0])):
            steps = sorted(abs(b[r] - a[r]) for a, b in zip(windows, windows[1:], strict=False))
            middle = len(steps) // 2
            median = steps[middle] if len(steps) % 2 else 0.5 * (steps[middle - 1] + steps[middle])
            spreads.append(MAD_TO_SD * median / math.sqrt(2.0))
        return math.sqrt(sum(s * s for s in spreads) / len(spreads))

    def judge(self, windows: Sequence[WindowStats]) -> Verdict:
        """Record a window of every rank and say whether the sizes may move.

        Parameters
        ----------
        windows : sequence of WindowStats
            Every rank's window, in rank order (the same on every rank).
        """
        means = [w.mean for w in windows]
        usable = all(
            w.iterations > 0 and w.batch_size > 0 and math.isfinite(m) and m > 0
            for w, m in zip(windows, means, strict=True)
        )
        if not usable:
            self._over = False
            return Verdict(True, 0.0, None, 0, "no times")
        slowest = max(range(len(means)), key=means.__getitem__)
        total = sum(w.batch_size for w in windows)
        balanced = total / sum(w.batch_size / m for w, m in zip(windows, means, strict=True))
        gain = max(0.0, 1.0 - balanced / means[slowest])
        noise = self._noise_with(windows, means)
        previous, self._last_means = self._last_means, tuple(means)
        over, self._over = self._over, False
        if len(windows) < 2 or gain <= self.tolerance:
            return Verdict(False, gain, noise, slowest, "within tolerance", equal=True)
        if self.sigmas is None:
            return Verdict(True, gain, None, slowest, "beyond tolerance")
        if noise is None:
            return Verdict(True, gain, None, slowest, "noise unknown")
        if gain <= self.sigmas * noise:
            # equal ranks give gains within one sigma of the noise between windows in
            # about two windows of three; a gain between one sigma and the move's margin
            # is a lead not yet told from the noise: k stays short to tell it soon
            equal = self.noise() is not None and gain <= noise
            return Verdict(False, gain, noise, slowest, "within noise", equal=equal)
        # Beyond the noise: move if the window before was too, with this rank behind
        # then as well (a lasting lead, not one spike).
        lasting = (
            over
            and previous is not None
            and len(previous) == len(means)
            and previous[slowest] > sum(previous) / len(previous)
        )
        if lasting:
            return Verdict(True, gain, noise, slowest, "confirmed")
        self._over = True
        return Verdict(False, gain, noise, slowest, "unconfirmed")

    def _noise_with(self, windows: Sequence[WindowStats], means: Sequence[float]) -> float | None:
        """Record the window's relative times per sample; the larger of the noise between
        windows and the window's own standard error (either when the other is unknown)."""
        per_sample = [m / w.batch_size for w, m in zip(windows, means, strict=True)]
        logs = [math.log(p) for p in per_sample]
        centre = sum(logs) / len(logs)
        self._relative.append(tuple(x - centre for x in logs))
        errors = [w.relative_error() for w in windows]
        within = (
            None
            if any(e is None for e in errors)
            else math.sqrt(sum(e * e for e in errors if e is not None) / len(errors))
        )
        between = self.noise()
        known = [x for x in (within, between) if x is not None]
        return max(known) if known else None
