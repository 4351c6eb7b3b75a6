"""The ``budget`` benchmark section and the accuracy study's measures (issue 29): the
oracle split and T* honour the noise budget and the curve family, the study's plateau,
equal-time and speed-up figures, and a smoke run of each script. No timing assertions."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy_study  # noqa: E402
import bench_accuracy  # noqa: E402
import bench_budget  # noqa: E402
import common  # noqa: E402

from fl_lbbsp.core import BALANCER_DEFAULTS, ideal_round_time, linear_minmax  # noqa: E402
from fl_lbbsp.core.allocation.budget import noise_ratio  # noqa: E402


# ------------------------------------------------------------------ oracle and T*
def test_the_oracle_and_t_star_honour_the_default_budget() -> None:
    # Prepare: the wide mix's lines, where the budget binds
    capacity = np.array(bench_budget.MIXES["wide"], dtype=float)
    a, b = 0.01 / capacity, np.zeros(len(capacity))

    # Execute
    oracle = common.oracle_split(a, b, 480, 1)
    ideal = common.ideal_time(a, b, 480)

    # Assert: within the budget, slower than the lines' unbudgeted optimum, and T* is the
    # real-valued bound of the integer oracle
    assert BALANCER_DEFAULTS["noise_budget"] == common.RHO
    assert noise_ratio(oracle) <= common.RHO * (1 + 1e-9)
    assert ideal > ideal_round_time(a, b, 480)
    assert ideal <= float(np.max(a * oracle)) + 1e-12


def test_without_budget_the_oracle_is_the_linear_minmax() -> None:
    # Prepare
    a, b = np.array([0.01, 0.02, 0.04]), np.array([0.1, 0.0, 0.2])

    # Execute
    ours = common.oracle_split(a, b, 96, 1, rho=None)
    lines = linear_minmax(a, b, 96, lower=np.ones(3))

    # Assert
    assert float(np.max(a * ours + b)) == pytest.approx(float(np.max(a * lines + b)))
    assert common.ideal_time(a, b, 96, rho=None) == pytest.approx(ideal_round_time(a, b, 96))


def test_the_oracle_keeps_a_flat_silo_at_its_knee() -> None:
    # Prepare: two equal silos, one flat up to 40 (a GPU), X = 64
    a, b, knee = np.array([0.01, 0.01]), np.zeros(2), np.array([40.0, 0.0])

    # Execute
    sizes = common.oracle_split(a, b, 64, 1, knee=knee, rho=None)

    # Assert: the GPU takes 40 at no cost, the other the rest
    assert sizes.tolist() == [40, 24]


@pytest.mark.parametrize(("curve", "has_knee"), [("none", False), ("mixed", False), ("knee", True)])
def test_budget_cells_curves(curve: str, has_knee: bool) -> None:
    # Execute
    a, b, knee = bench_budget.curves((4, 2, 1), curve, bench_budget.FULL, np.random.default_rng(0))

    # Assert
    assert a.tolist() == pytest.approx([0.01, 0.02, 0.04])
    assert (knee is not None) == has_knee
    assert (b.max() > 0) == (curve == "mixed")


def test_budget_cells_reject_an_unknown_curve() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="unknown curve"):
        bench_budget.curves((1, 1), "cubic", bench_budget.FULL, np.random.default_rng(0))


def test_budget_smoke_run_writes_a_section(tmp_path: Path) -> None:
    # Execute
    assert bench_budget.main(["--smoke", "--out", str(tmp_path)], report=lambda _: None) == 0

    # Assert
    data = json.loads((tmp_path / "budget.json").read_text())
    assert data["section"] == "budget"
    labels = [f["label"] for f in data["figures"]]
    assert any("noise-free" in label for label in labels)
    assert all(f["goal"] is not None for f in data["figures"])


# ----------------------------------------------------------------- the study's measures
@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [
        ([0.1 * k for k in range(1, 21)], 20),  # still climbing: the last round
        ([0.5] * 20, 10),  # flat from the start: the first full pair of windows
        ([0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9], 15),
    ],
)
def test_plateau_is_where_a_window_stops_gaining(accuracy: list[float], expected: int) -> None:
    # Execute / Assert
    assert accuracy_study.plateau(accuracy) == expected


def test_compare_measures_plateau_equal_time_and_speedup() -> None:
    # Prepare: FedAvg 2 s a round, LB-BSP 1 s, the same accuracy per round (plateau at 0.9
    # from round 6)
    acc: list[float | None] = [0.2, 0.4, 0.6, 0.8, 0.85, *([0.9] * 15)]
    fedavg = bench_accuracy.Trace(elapsed=[2.0 * (r + 1) for r in range(20)], accuracy=acc)
    lbbsp = bench_accuracy.Trace(elapsed=[1.0 * (r + 1) for r in range(20)], accuracy=acc)

    # Execute
    row = accuracy_study.compare(fedavg, lbbsp, target_share=0.9)

    # Assert: the same accuracy at the plateau; at LB-BSP's time FedAvg is half as far
    p = row["plateau"]
    assert row["diff"] == pytest.approx(0.0)
    assert row["equal_time_fedavg_rounds"] == p // 2
    assert row["equal_time_diff"] > 0
    assert row["speedup"] == pytest.approx(2.0)
    assert not row["climbing"]


def test_summarise_gives_intervals_and_counts() -> None:
    # Prepare
    rows: list[dict[str, Any]] = [
        {"diff": d, "equal_time_diff": e, "speedup": s, "climbing": False,
         "noise_ratio": 1.2, "weighted_noise_ratio": 1.3, "min_batch_size": 5}
        for d, e, s in ((-1.0, 2.0, 2.0), (0.0, 1.0, 3.0), (1.0, -1.0, 2.5))
    ]  # fmt: skip

    # Execute
    out = accuracy_study.summarise(rows)

    # Assert
    assert out["diff_mean"] == pytest.approx(0.0)
    assert out["diff_low"] < 0 < out["diff_high"]
    assert out["equal_time_seeds_ok"] == 2
    assert out["speedup_min"] == 2.0
    assert out["speedup_low"] < out["speedup_geo"] < out["speedup_high"]
    assert out["weighted_noise_ratio"] == 1.3


@pytest.mark.slow
def test_study_smoke_run_writes_a_finite_section(tmp_path: Path) -> None:
    # Execute: two seeds, one mix and partition, tiny rounds, embedded digits; the seeds
    # in two worker processes, then again in this process from no cache
    code = accuracy_study.main(
        ["--smoke", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"),
         "--mixes", "5:1", "--partitions", "dirichlet:0.3", "--jobs", "2"]
    )  # fmt: skip
    alone = tmp_path / "alone"
    assert accuracy_study.main(
        ["--smoke", "--out", str(alone), "--mixes", "5:1", "--partitions", "dirichlet:0.3",
         "--jobs", "1"]
    ) == 0  # fmt: skip

    # Assert
    assert code == 0
    data = json.loads((tmp_path / "accuracy-budget.json").read_text())
    assert data["section"] == "accuracy-budget"
    # the same tables either way: a seed's runs are reproducible, whichever process runs them
    in_process = json.loads((alone / "accuracy-budget.json").read_text())["tables"]
    assert in_process == data["tables"]
    variants = {row[1] for row in data["tables"][0]["rows"]}
    assert variants == {"budget", "floor"}
    for figure in data["figures"]:
        assert figure["value"] is None or math.isfinite(figure["value"])

    # Execute: the same section again from the cache alone, and from an empty cache
    again = tmp_path / "again"
    args = ["--smoke", "--mixes", "5:1", "--partitions", "dirichlet:0.3", "--cached-only"]
    assert (
        accuracy_study.main([*args, "--out", str(again), "--cache", str(tmp_path / "cache")]) == 0
    )
    empty = tmp_path / "empty"
    assert accuracy_study.main([*args, "--out", str(empty), "--cache", str(empty / "c")]) == 0

    # Assert: nothing ran, the cached runs give the same tables; no runs, no cells
    cached = json.loads((again / "accuracy-budget.json").read_text())
    assert cached["tables"] == data["tables"]
    assert json.loads((empty / "accuracy-budget.json").read_text())["summary"] == {}


def _study(**changes: Any) -> accuracy_study.Study:
    base: dict[str, Any] = dict(
        datasets=("embedded", "mnist:/data"), mixes=("5:1",), partitions=("labels:2",),
        seeds=(0, 1), rounds=4, local_steps=2, batch_size=8, lr=0.1, model="mlp",
    )  # fmt: skip
    return accuracy_study.Study(**{**base, **changes})


def test_seed_counts_per_dataset_replace_the_default_and_keep_the_cache_key() -> None:
    # Prepare
    plain = _study()
    more = _study(seeds_by_dataset=(("embedded", 5),))

    # Execute / Assert: the embedded cells run 5 seeds, MNIST keeps the default two
    assert more.seeds_of("embedded") == (0, 1, 2, 3, 4)
    assert more.seeds_of("mnist:/data") == (0, 1)
    assert plain.seeds_of("embedded") == (0, 1)


@pytest.mark.parametrize("text", ["embedded", "embedded=1", "embedded=x", "=3"])
def test_seed_counts_are_refused_when_malformed(text: str) -> None:
    # Execute / Assert
    with pytest.raises(SystemExit):
        accuracy_study.main(["--smoke", "--seeds-for", text, "--out", "/nonexistent"])


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_study_refuses_fewer_than_one_job(jobs: str) -> None:
    # Execute / Assert
    with pytest.raises(SystemExit):
        accuracy_study.main(["--smoke", "--jobs", jobs, "--out", "/nonexistent"])


def _section(cells: list[str], setting: str) -> dict[str, Any]:
    return {
        "setting": setting,
        "figures": [{"label": f"figure, {c}", "value": 1.0} for c in cells],
        "tables": [{"rows": [[c, "budget"] for c in cells]}, {"rows": [[c, "0"] for c in cells]}],
        "summary": {c: {"budget": {"seeds": 8}} for c in cells},
        "runs": {c: {"0": {}} for c in cells},
    }


def test_keep_cells_copies_only_the_cells_this_run_did_not_run() -> None:
    # Prepare: this run has cell A; the earlier one A and B
    data = _section(["A"], "now.")
    earlier = _section(["A", "B"], "then.")
    earlier["figures"][0]["value"] = 2.0  # the earlier A must not replace this run's

    # Execute
    kept = accuracy_study.keep_cells(data, earlier, "old.json")

    # Assert
    assert kept == ["B"]
    assert [f["label"] for f in data["figures"]] == ["figure, A", "figure, B"]
    assert data["figures"][0]["value"] == 1.0
    assert [r[0] for r in data["tables"][0]["rows"]] == ["A", "B"]
    assert [r[0] for r in data["tables"][1]["rows"]] == ["A", "B"]
    assert set(data["summary"]) == set(data["runs"]) == {"A", "B"}
    assert "kept from an earlier run" in data["setting"] and "old.json" in data["setting"]
    assert data["setting"].endswith("then.")


def test_the_floor_reference_runs_on_the_first_seeds_only() -> None:
    # Prepare
    study = _study(floor_seeds=2)

    # Execute / Assert: FedAvg and the budget on every seed, the floor on seeds 0 and 1
    assert study.schemes_of(1) == ("fedavg", "budget", "floor")
    assert study.schemes_of(2) == ("fedavg", "budget")
    assert _study().schemes_of(9) == ("fedavg", "budget", "floor")
