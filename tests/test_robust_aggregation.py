"""Weighted centred clipping (issue 39): no minority of silos steers the aggregate, the
dataset-size weights are kept, and slow silos' longer honest updates pass (synthetic
updates, no clock)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core.aggregation import WeightedMean
from fl_lbbsp.core.centered_clip import CenteredClip

DIM = 200
Attack = Callable[[np.ndarray, np.ndarray, list[np.ndarray]], np.ndarray]


def _alie_z(n: int, f: int) -> float:
    s = math.floor(n / 2 + 1) - f
    return statistics.NormalDist().inv_cdf((n - s) / n)


def _target(own: np.ndarray, mean: np.ndarray, honest: list[np.ndarray]) -> np.ndarray:
    push = np.zeros_like(own)
    push[0] = 8.0 * float(np.linalg.norm(own))
    return push


ATTACKS: dict[str, Attack] = {
    "signflip-1": lambda own, mean, honest: -1.0 * own,
    "signflip-3": lambda own, mean, honest: -3.0 * own,
    "signflip-8": lambda own, mean, honest: -8.0 * own,
    "ipm": lambda own, mean, honest: -2.0 * mean,
    "scaled": lambda own, mean, honest: 30.0 * own,
    "target": _target,
}


def _honest(
    rng: np.random.Generator, n: int, noise: float = 0.5
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The true direction g (norm about 1 per coordinate) and n honest updates around it."""
    g = rng.normal(1.0, 0.2, DIM)
    return g, [g + rng.normal(0.0, noise, DIM) for _ in range(n)]


def _aggregate(
    aggregator: CenteredClip | WeightedMean,
    updates: list[np.ndarray],
    weights: list[float],
    scales: list[float] | None = None,
) -> np.ndarray:
    aggregator.begin([np.zeros(DIM)])
    for k, (update, weight) in enumerate(zip(updates, weights, strict=True)):
        if isinstance(aggregator, CenteredClip):
            aggregator.add([update], weight=weight, scale=1.0 if scales is None else scales[k])
        else:
            aggregator.add([update], weight=weight)
    return aggregator.result()[0]


def _attacked(
    attack: str, n: int, k: int, seed: int
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """g, the round's updates (the last k hostile) and the honest silos' mean."""
    rng = np.random.default_rng(seed)
    g, honest = _honest(rng, n - k)
    mean = np.mean(honest, axis=0)
    if attack == "alie":
        bad = mean - _alie_z(n, k) * np.std(honest, axis=0)
    else:
        bad = ATTACKS[attack](honest[0], mean, honest)
    return g, [*honest, *([bad] * k)], mean


@pytest.mark.parametrize(("n", "k"), [(5, 1), (5, 2), (10, 2)])
@pytest.mark.parametrize("attack", [*ATTACKS, "alie"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_minority_of_hostile_silos_cannot_steer_the_clipped_aggregate(
    attack: str, n: int, k: int, seed: int
) -> None:
    # Prepare: n - k honest updates around g, k hostile ones, equal weights
    g, updates, honest_mean = _attacked(attack, n, k, seed)

    # Execute
    robust = _aggregate(CenteredClip(), updates, [1.0] * n)

    # Assert: the aggregate stays near the honest mean, within the hostile silos' share
    # of the honest spread (k / n of the radius, one median of about sqrt(DIM) * 0.5, per pass), and
    # points along g: closely with a fifth hostile, never reversed with two of five
    spread = 0.5 * math.sqrt(DIM)
    assert float(np.linalg.norm(robust - honest_mean)) <= 3 * 1.0 * spread * k / n + 1e-9
    cosine = float(robust @ g) / float(np.linalg.norm(robust) * np.linalg.norm(g))
    assert cosine > (0.85 if k / n <= 0.2 else 0.4)


@pytest.mark.parametrize("attack", ["signflip-8", "scaled", "ipm"])
def test_fedavgs_mean_is_steered_by_the_same_attacks(attack: str) -> None:
    # Prepare: the attack of the test above, one hostile silo of 5
    g, updates, honest_mean = _attacked(attack, 5, 1, 0)

    # Execute
    mean = _aggregate(WeightedMean(), updates, [1.0] * 5)

    # Assert: the plain mean is far from the honest one, or reversed (the test above can
    # fail)
    far = float(np.linalg.norm(mean - honest_mean)) > 3 * 1.0 * 0.5 * math.sqrt(DIM) / 5
    cosine = float(mean @ g) / float(np.linalg.norm(mean) * np.linalg.norm(g))
    assert far or cosine < 0.85


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(1, 10**6), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_with_nothing_clipped_it_is_fedavgs_weighted_mean(weights: list[int], seed: int) -> None:
    # Prepare: updates of any spread, a radius no update reaches
    rng = np.random.default_rng(seed)
    updates = [rng.normal(0.0, 1.0, DIM) for _ in weights]

    # Execute
    robust = _aggregate(CenteredClip(factor=1e9), updates, [float(w) for w in weights])
    mean = _aggregate(WeightedMean(), updates, [float(w) for w in weights])

    # Assert: the dataset-size weights are kept (no clipping, FedAvg's mean)
    np.testing.assert_allclose(robust, mean, rtol=1e-9, atol=1e-9)


def test_a_huge_weight_moves_the_clipped_aggregate_at_most_its_radius() -> None:
    # Prepare: 4 honest silos of 100 examples, a liar whose capped weight is 200 (2x the
    # median) sending 1e6 times the honest update
    g, honest = _honest(np.random.default_rng(3), 4)
    updates = [*honest, -1e6 * g]
    weights = [100.0, 100.0, 100.0, 100.0, 200.0]

    # Execute
    clip = CenteredClip()
    robust = _aggregate(clip, updates, weights)

    # Assert: the liar's pull is at most its share (1/3) of its radius per pass
    honest_mean = np.mean(honest, axis=0)
    spread = float(np.median([np.linalg.norm(u - np.median(updates, axis=0)) for u in updates]))
    assert float(np.linalg.norm(robust - honest_mean)) <= 3 * (1 / 3) * 1.0 * spread * 1.5
    assert clip.clipped >= 1


def _pull(updates: list[np.ndarray], weights: list[float], claimed: list[bool]) -> np.ndarray:
    """The last silo's term in one clipping pass: the result less the others' terms."""
    clip = CenteredClip(iterations=1, bound_claims=True)
    clip.begin([np.zeros(DIM)])
    for update, weight, claim in zip(updates, weights, claimed, strict=True):
        clip.add([update], weight=weight, claimed=claim)
    start = np.median(updates, axis=0)
    rho = float(np.median([np.linalg.norm(u - start) for u in updates]))
    others = sum(
        w / sum(weights) * min(1.0, rho / float(np.linalg.norm(u - start))) * (u - start)
        for u, w in zip(updates[:-1], weights[:-1], strict=True)
    )
    return np.asarray(clip.result()[0] - start - others)


def _aggregate_once(
    updates: list[np.ndarray], weights: list[float], claimed: list[bool]
) -> np.ndarray:
    clip = CenteredClip(bound_claims=True)
    clip.begin([np.zeros(DIM)])
    for update, weight, claim in zip(updates, weights, claimed, strict=True):
        clip.add([update], weight=weight, claimed=claim)
    return clip.result()[0]


def _radius(updates: list[np.ndarray]) -> float:
    start = np.median(updates, axis=0)
    return float(np.median([np.linalg.norm(u - start) for u in updates]))


@pytest.mark.parametrize("claim", [1.0, 2.0, 50.0])
def test_a_claimed_weight_pulls_the_centre_no_further_than_a_median_silo(claim: float) -> None:
    # Prepare: 4 honest silos of 100 examples, one whose undeclared (claimed) size weighs
    # claim x 100 sending 1e6 times the reversed direction: far outside every radius
    g, honest = _honest(np.random.default_rng(3), 4)
    updates = [*honest, -1e6 * g]
    weights = [100.0] * 4 + [100.0 * claim]

    # Execute: one pass, the liar's weight a claim
    term = _pull(updates, weights, [False] * 4 + [True])

    # Assert: its term is a median silo's share of the radius, whatever it claims (at the
    # median weight, the pull it had before claiming more)
    expected = _radius(updates) * 100.0 / sum(weights)
    assert float(np.linalg.norm(term)) == pytest.approx(expected, rel=1e-9)


def test_without_the_option_a_claimed_weight_keeps_the_pull_of_its_size() -> None:
    # Prepare: the liar of the test above, claiming 2x the median
    g, honest = _honest(np.random.default_rng(3), 4)
    updates = [*honest, -1e6 * g]
    weights = [100.0] * 4 + [200.0]

    # Execute: the default clip (bound_claims off) told the weight is a claim
    clip = CenteredClip()
    clip.begin([np.zeros(DIM)])
    for update, weight in zip(updates, weights, strict=True):
        clip.add([update], weight=weight, claimed=True)
    as_claim = clip.result()[0]
    plain = _aggregate(CenteredClip(), updates, weights)

    # Assert: FedAvg's weights decide the pull, as before the option existed
    np.testing.assert_array_equal(as_claim, plain)


def test_a_declared_weight_keeps_the_pull_of_its_size() -> None:
    # Prepare: the same federation, the large silo's size 4x the others' and its update
    # honest but far from the others' (a silo with other data)
    g, honest = _honest(np.random.default_rng(4), 4)
    far = g + 20.0 * np.random.default_rng(5).normal(0.0, 0.5, DIM)
    updates = [*honest, far]
    weights = [100.0] * 4 + [400.0]

    # Execute: its size declared (not a claim), then only claimed
    declared = _pull(updates, weights, [False] * 5)
    claimed = _pull(updates, weights, [False] * 4 + [True])

    # Assert: declared, it pulls as its weight says, 4 times as far as the claim can
    rho = _radius(updates)
    assert float(np.linalg.norm(declared)) == pytest.approx(rho * 400.0 / 800.0, rel=1e-9)
    assert float(np.linalg.norm(claimed)) == pytest.approx(rho * 100.0 / 800.0, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 1000), min_size=3, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_claims_at_or_below_the_median_weight_change_nothing(weights: list[int], seed: int) -> None:
    # Prepare: any updates; every silo's weight a claim, but none above the median
    rng = np.random.default_rng(seed)
    cap = sorted(weights)[(len(weights) - 1) // 2]
    level = [float(min(w, cap)) for w in weights]
    updates = [rng.normal(0.0, 1.0, DIM) for _ in weights]

    # Execute
    as_claims = _aggregate_once(updates, level, [True] * len(level))
    as_declared = _aggregate_once(updates, level, [False] * len(level))

    # Assert: the rule only ever shrinks the radius of a weight above the median
    np.testing.assert_array_equal(as_claims, as_declared)


def test_a_slow_silos_longer_honest_update_passes_at_its_batch_size() -> None:
    # Prepare: a silo sent B = 2 of B_eq = 32 moves sqrt(16) = 4 times as far from noise
    rng = np.random.default_rng(5)
    g, honest = _honest(rng, 4, noise=0.1)
    slow = g + 4.0 * rng.normal(0.0, 0.1, DIM)
    updates = [*honest, slow]

    # Execute: its radius widened by sqrt(B_eq / B_i) = 4, and not
    widened = CenteredClip(factor=2.0)
    _aggregate(widened, updates, [1.0] * 5, scales=[1.0, 1.0, 1.0, 1.0, 4.0])
    plain = CenteredClip(factor=2.0)
    _aggregate(plain, updates, [1.0] * 5)

    # Assert: kept whole at its batch size; clipped if judged as a fast silo
    assert widened.clipped == 0
    assert plain.clipped == 1


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.add([np.zeros(DIM)], weight=1.0), RuntimeError),
        (lambda c: (c.begin([np.zeros(DIM)]), c.add([np.zeros(DIM)], weight=0.0)), ValueError),
        (lambda c: (c.begin([np.zeros(DIM)]), c.add([np.zeros(DIM)], weight=math.nan)), ValueError),
        (
            lambda c: (c.begin([np.zeros(DIM)]), c.add([np.zeros(DIM)], weight=1.0, scale=0.5)),
            ValueError,
        ),
        (lambda c: (c.begin([np.zeros(DIM)]), c.add([np.zeros(3)], weight=1.0)), ValueError),
        (lambda c: (c.begin([np.zeros(DIM)]), c.add([np.zeros(DIM)] * 2, weight=1.0)), ValueError),
        (lambda c: (c.begin([np.zeros(DIM)]), c.result()), ValueError),
    ],
    ids=["before-begin", "zero-weight", "nan-weight", "scale-below-1", "shape", "layers", "empty"],
)
def test_bad_uses_are_refused(call: Callable[[CenteredClip], Any], error: type[Exception]) -> None:
    # Prepare
    clip = CenteredClip()

    # Execute / Assert
    with pytest.raises(error):
        call(clip)


@pytest.mark.parametrize(("factor", "iterations"), [(0.0, 3), (math.inf, 3), (-1.0, 3), (2.0, 0)])
def test_bad_settings_are_refused(factor: float, iterations: int) -> None:
    with pytest.raises(ValueError):
        CenteredClip(factor=factor, iterations=iterations)


def test_a_non_finite_update_gives_no_aggregate() -> None:
    # Prepare: the reply screen rejects NaN updates; one that got here anyway
    clip = CenteredClip()
    clip.begin([np.zeros(3)])
    clip.add([np.full(3, np.inf)], weight=1.0)

    # Execute / Assert: an error, never a NaN model
    with pytest.raises(ValueError, match="NaN or inf"):
        clip.result()
