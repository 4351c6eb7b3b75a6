"""The cost fits over a table of windows: each row alone, the robust level and median by
their definitions, and a round's reports checked as columns."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_lbbsp.core import SiloReport
from fl_lbbsp.core.silo.costfit import (
    find_knee,
    fit_robust_cost,
    fit_windows,
    masked_levels,
    masked_medians,
)
from fl_lbbsp.core.silo.reports import report_columns


def _windows(seed: int, rows: int = 400, width: int = 20) -> dict[str, np.ndarray]:
    """Random windows: batch sizes on a few levels, spread wide, constant, jittered;
    hinge costs with and without knees, noise-free and noisy times."""
    rng = np.random.default_rng(seed)
    x, t = np.zeros((rows, width)), np.zeros((rows, width))
    n = rng.integers(1, width + 1, rows)
    for r in range(rows):
        kind = rng.integers(0, 4)
        if kind == 0:
            xs = rng.choice([16.0, 32.0, 48.0, 64.0], n[r])
        elif kind == 1:
            xs = rng.integers(10, 100, n[r]).astype(float)
        elif kind == 2:
            xs = np.full(n[r], 32.0)
        else:
            xs = np.round(32 * np.exp(rng.normal(0, 0.3, n[r]))) + 1
        a, b = 1 / rng.uniform(50, 400), rng.uniform(0, 0.1)
        k = rng.uniform(0, 50) if rng.random() < 0.4 else 0.0
        jitter = rng.choice([0.0, 0.02, 0.1])
        x[r, : n[r]] = xs
        t[r, : n[r]] = (a * np.maximum(xs, k) + b) * np.exp(rng.normal(0, jitter, n[r]))
    return {
        "x": x,
        "t": t,
        "n": n,
        "knee": np.where(rng.random(rows) < 0.3, rng.uniform(0, 60, rows), 0.0),
        "noise": np.where(rng.random(rows) < 0.5, rng.uniform(0, 0.2, rows), np.nan),
        "shape": rng.uniform(0, 30, rows),
        "known": rng.random(rows) < 0.5,
    }


def _trimmed_geometric_mean(values: list[float]) -> float:
    """The robust level by its definition: the geometric mean of the sorted values with
    int(0.2 * n) cut at each end."""
    v = sorted(values)
    cut = int(0.2 * len(v))
    kept = v[cut : len(v) - cut]
    return math.exp(sum(math.log(x) for x in kept) / len(kept))


@pytest.mark.parametrize(("seed", "spread"), [(0, 0.1), (1, 0.1), (2, 0.0)])
def test_a_windows_fit_does_not_depend_on_the_other_windows_of_the_table(
    seed: int, spread: float
) -> None:
    # Prepare (a spread of 0, which the settings allow: equal batch sizes are still
    # replicates, and the anchor's own reports are near it)
    w = _windows(seed, rows=60)

    # Execute: every row in one table, and each row as a table of its own
    fits = fit_windows(
        w["x"], w["t"], w["n"], knee=w["knee"], noise=w["noise"], prior_shape=w["shape"],
        prior_known=w["known"], min_relative_spread=spread,
    )  # fmt: skip
    alone = []
    for r in range(60):
        xs, ts = w["x"][r, : w["n"][r]], w["t"][r, : w["n"][r]]
        noise = None if math.isnan(w["noise"][r]) else float(w["noise"][r])
        knee = find_knee(xs, ts, knee=float(w["knee"][r]), noise=noise, min_relative_spread=spread)
        alone.append(fit_robust_cost(
            xs, ts, prior_shape=float(w["shape"][r]), prior_noise=noise,
            prior_known=bool(w["known"][r]), min_relative_spread=spread, knee=knee,
        ))  # fmt: skip

    # Assert: the same lines up to the last bits of a sum
    for r, fit in enumerate(alone):
        got = fits.at(r)
        assert got.spread == fit.spread
        for name in ("slope", "intercept", "anchor", "level", "noise", "knee"):
            assert math.isclose(getattr(got, name), getattr(fit, name), rel_tol=1e-9) or (
                math.isnan(getattr(got, name)) and math.isnan(getattr(fit, name))
            ), (r, name)
        assert got.weight == pytest.approx(fit.weight, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("count", [1, 2, 4, 5, 9, 20])
def test_masked_levels_and_medians_are_their_definitions(count: int) -> None:
    # Prepare: a row of `count` values among padding
    rng = np.random.default_rng(count)
    values = rng.lognormal(0.0, 0.5, (3, 20))
    mask = np.arange(20) < count

    # Execute
    levels = masked_levels(values, np.broadcast_to(mask, values.shape))
    medians = masked_medians(values, np.broadcast_to(mask, values.shape))

    # Assert
    for r in range(3):
        kept = values[r, :count].tolist()
        assert levels[r] == pytest.approx(_trimmed_geometric_mean(kept), rel=1e-12)
        assert medians[r] == pytest.approx(float(np.median(kept)), rel=1e-15)


def _bad(**fields: object) -> SiloReport:
    return SiloReport(**{"batch_size": 32, "train_time": 1.0, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_bad(batch_size=0), "batch size must be a positive integer, got 0"),
        (_bad(batch_size=True), "batch size must be a positive integer, got True"),
        (_bad(batch_size=32.5), "batch size must be a positive integer, got 32.5"),
        (_bad(batch_size="32"), "batch size must be a positive integer, got '32'"),
        (_bad(batch_size=10**400), "batch size must be a positive integer"),
        (_bad(train_time=math.nan), "train time must be finite and positive, got nan"),
        (_bad(train_time=-1.0), "train time must be finite and positive, got -1.0"),
        (_bad(samples=0), "samples processed must be a positive integer, got 0"),
        (_bad(samples=math.nan), "samples processed must be a positive integer, got nan"),
        (_bad(max_batch_size=-4), "max batch size must be a positive integer, got -4"),
        (_bad(fixed_time=-0.5), "fixed time must be finite and non-negative, got -0.5"),
        (_bad(train_time=1e-320), "speed 32 samples in 1e-320 s is not finite"),
    ],
)
def test_a_rounds_reports_are_checked_at_once_and_one_alone_alike(
    bad: SiloReport, message: str
) -> None:
    # Prepare: a bad report among good ones (one of numpy types)
    good = [
        SiloReport(batch_size=32, train_time=0.5, samples=64, fixed_time=0.1),
        SiloReport(batch_size=np.int64(16), train_time=np.float64(0.25), max_batch_size=64),  # type: ignore[arg-type]
    ]

    # Execute
    columns, errors = report_columns([good[0], bad, good[1]])

    # Assert: the bad one's error names its first bad field, as validate says it alone;
    # the good ones' fields are read
    assert list(errors) == [1] and str(errors[1]).startswith(message)
    with pytest.raises(ValueError, match="^" + message.split(",")[0]):
        bad.validate()
    assert columns.position.tolist() == [0, 2]
    assert columns.batch_size.tolist() == [32.0, 16.0]
    assert columns.samples[0] == 64.0 and math.isnan(columns.samples[1])
    assert math.isnan(columns.max_batch_size[0]) and columns.max_batch_size[1] == 64.0
