"""The cost fits over a table of windows against the fit of one window at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_lbbsp.core import SiloReport
from fl_lbbsp.core.silo.costfit import find_knee, fit_robust_cost, robust_level
from fl_lbbsp.core.silo.costfit_batch import (
    fit_windows,
    masked_levels,
    masked_medians,
)
from fl_lbbsp.core.silo.report_columns import report_columns


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


@pytest.mark.parametrize(("seed", "spread"), [(0, 0.1), (1, 0.1), (2, 0.1), (3, 0.0)])
def test_the_fits_over_arrays_match_the_fits_one_window_at_a_time(seed: int, spread: float) -> None:
    # Prepare (a spread of 0, which the settings allow: equal batch sizes are still
    # replicates, and the anchor's own reports are near it)
    w = _windows(seed)
    common = {
        "knee": w["knee"], "noise": w["noise"], "prior_shape": w["shape"],
        "prior_known": w["known"], "min_relative_spread": spread,
    }  # fmt: skip

    # Execute: every row over arrays, and every row one at a time
    arrays = fit_windows(w["x"], w["t"], w["n"], scalar_rows=0, **common)  # type: ignore[arg-type]
    single = fit_windows(w["x"], w["t"], w["n"], scalar_rows=10**6, **common)  # type: ignore[arg-type]

    # Assert: the same knees, the same lines up to the last bits of a sum
    assert np.array_equal(arrays.knee, single.knee)
    assert np.array_equal(arrays.low, single.low) and np.array_equal(arrays.high, single.high)
    for name in ("slope", "intercept", "anchor", "level", "noise"):
        got, want = getattr(arrays, name), getattr(single, name)
        assert np.allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True), name
    assert np.allclose(arrays.weight, single.weight, rtol=1e-6, atol=1e-9)


def test_one_window_at_a_time_is_the_scalar_fit() -> None:
    # Prepare
    w = _windows(3, rows=20)
    r = 7
    xs, ts = w["x"][r, : w["n"][r]].tolist(), w["t"][r, : w["n"][r]].tolist()
    noise = None if math.isnan(w["noise"][r]) else float(w["noise"][r])

    # Execute
    fits = fit_windows(
        w["x"], w["t"], w["n"], knee=w["knee"], noise=w["noise"], prior_shape=w["shape"],
        prior_known=w["known"], min_relative_spread=0.1,
    )  # fmt: skip

    # Assert
    knee = find_knee(xs, ts, knee=float(w["knee"][r]), noise=noise, min_relative_spread=0.1)
    fit = fit_robust_cost(
        xs, ts, prior_shape=float(w["shape"][r]), prior_noise=noise,
        prior_known=bool(w["known"][r]), min_relative_spread=0.1, knee=knee,
    )  # fmt: skip
    assert (fits.knee[r], fits.slope[r], fits.intercept[r]) == (knee, fit.slope, fit.intercept)


@pytest.mark.parametrize("count", [1, 2, 4, 5, 9, 20])
def test_masked_levels_and_medians_are_the_scalar_ones(count: int) -> None:
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
        assert levels[r] == pytest.approx(robust_level(kept), rel=1e-12)
        assert medians[r] == float(np.median(kept))


@pytest.mark.parametrize(
    "bad",
    [
        SiloReport(batch_size=0, train_time=1.0),
        SiloReport(batch_size=True, train_time=1.0),  # type: ignore[arg-type]
        SiloReport(batch_size=32, train_time=math.nan),
        SiloReport(batch_size=32, train_time=-1.0),
        SiloReport(batch_size=32.5, train_time=1.0),  # type: ignore[arg-type]
        SiloReport(batch_size=32, train_time=1.0, samples=0),
        SiloReport(batch_size=32, train_time=1.0, max_batch_size=-4),
        SiloReport(batch_size=32, train_time=1.0, fixed_time=-0.5),
        SiloReport(batch_size=32, train_time=1e-320),
        SiloReport(batch_size="32", train_time=1.0),  # type: ignore[arg-type]
    ],
)
def test_a_rounds_reports_are_judged_as_validate_judges_them(bad: SiloReport) -> None:
    # Prepare: a bad report among good ones (one of numpy types)
    good = [
        SiloReport(batch_size=32, train_time=0.5, samples=64, fixed_time=0.1),
        SiloReport(batch_size=np.int64(16), train_time=np.float64(0.25), max_batch_size=64),  # type: ignore[arg-type]
    ]

    # Execute
    columns, errors = report_columns([good[0], bad, good[1]])

    # Assert: the bad one's error is validate's, the good ones' fields are read
    with pytest.raises(ValueError) as expected:
        bad.validate()
    assert list(errors) == [1] and str(errors[1]) == str(expected.value)
    assert columns.position.tolist() == [0, 2]
    assert columns.batch_size.tolist() == [32.0, 16.0]
    assert columns.samples[0] == 64.0 and math.isnan(columns.samples[1])
    assert math.isnan(columns.max_batch_size[0]) and columns.max_batch_size[1] == 64.0
