"""Pure parts of the benchmark sections: the cluster's ideal T*, the contention schedule
and the emulated iteration times of the predictors section."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_cluster  # noqa: E402
import bench_predictors  # noqa: E402


def test_ideal_iteration_time_of_the_cluster_example() -> None:
    # Prepare: the example's cost model, capacities 4:2:1:1, global batch 256
    slowdowns = (1.0, 2.0, 4.0, 4.0)

    # Execute
    t_star = bench_cluster.ideal_iteration_time("0.05,0.5,1.0,400", slowdowns, 256)

    # Assert: (X + sum b_i/a_i) / sum 1/a_i = (256 + 4 * 10) / (20 + 10 + 5 + 5)
    assert t_star == pytest.approx(7.4)


def test_ideal_iteration_time_is_held_up_by_the_floor_of_a_small_batch() -> None:
    # Execute: 4 samples in all, one each; the slowest worker's floor is 4 x 1.0 s
    t_star = bench_cluster.ideal_iteration_time("0.05,0.5,1.0,400", (1.0, 2.0, 4.0, 4.0), 4)

    # Assert
    assert t_star == pytest.approx(4.0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), burners=st.integers(1, 3))
def test_contention_schedule_is_a_seeded_step_function(seed: int, burners: int) -> None:
    # Prepare
    config = bench_predictors.Settings(
        duration=30.0, batch_size=8, burners=burners, period=(1.0, 4.0), spike_rate=0.5,
        spike_length=(0.05, 0.2), narx={"warmup": 10}, window=10,
    )  # fmt: skip

    # Execute
    changes = bench_predictors.contention_schedule(config, np.random.default_rng(seed))
    again = bench_predictors.contention_schedule(config, np.random.default_rng(seed))

    # Assert: starts at 0, times increase within the run, levels change at every point
    times = [t for t, _ in changes]
    levels = [level for _, level in changes]
    assert changes == again
    assert times[0] == 0.0 and all(a < b for a, b in zip(times, times[1:], strict=False))
    assert times[-1] < config.duration
    assert all(0 <= level <= burners for level in levels)
    assert all(a != b for a, b in zip(levels, levels[1:], strict=False))


def test_cluster_times_perfect_prediction_is_ideal_and_bsp_waits_for_the_slowest() -> None:
    # Prepare: 2 workers, speeds 300 and 100 samples/s, then 100 and 100
    speeds = np.array([[300.0, 100.0], [100.0, 100.0]])

    # Execute
    bsp = bench_predictors.cluster_times(speeds, None, 400)
    perfect = bench_predictors.cluster_times(speeds, speeds, 400)

    # Assert: BSP 200 / 100 s; LB-BSP with the actual speeds X / sum v
    assert bsp.tolist() == [2.0, 2.0]
    assert perfect.tolist() == pytest.approx([1.0, 2.0])


def test_wallclock_section_compares_steady_medians_of_both_schemes() -> None:
    # Prepare: rounds 1-2 are start-up; from round 3 FedAvg takes 4 s emulated and 4.4 s
    # of wall time, LB-BSP 2 s and 2.2 s (the same 10% of messaging), in both repeats
    import bench_wallclock

    def run(emulated: float, wall: float) -> list[dict[str, object]]:
        return [
            {"event": "config"},
            *({"event": "train", "round": r, "round_time": 9.0, "wall_time": 30.0} for r in (1, 2)),
            *(
                {"event": "train", "round": r, "round_time": emulated, "wall_time": wall}
                for r in (3, 4, 5)
            ),
            {"event": "train", "round": 6, "round_time": None, "wall_time": 1.0},  # skipped
        ]

    # Execute
    medians = {
        "fedavg": [bench_wallclock.steady_medians(run(4.0, 4.4), 3, 6)] * 2,
        "lbbsp": [bench_wallclock.steady_medians(run(2.0, 2.2), 3, 6)] * 2,
    }
    result = bench_wallclock.ratios(medians)

    # Assert
    assert medians["fedavg"][0] == pytest.approx((4.0, 4.4))
    assert result["emulated"] == pytest.approx(0.5)
    assert result["wall"] == pytest.approx(0.5)
    assert result["gap"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no aggregated round"):
        bench_wallclock.steady_medians(run(1.0, 1.0), 7, 9)


def test_a_full_benchmark_run_starts_from_no_earlier_section(tmp_path: Path) -> None:
    # Prepare: an earlier run's sections, a figure beside them, and a file of another kind
    import json

    import run_all

    (tmp_path / "old-section.json").write_text(json.dumps({"section": "old-section"}))
    (tmp_path / "fl.json").write_text(json.dumps({"section": "fl", "figures": []}))
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a section"}))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "fl_round_time.png").write_bytes(b"png")

    # Execute
    removed = run_all.clear_sections(tmp_path)

    # Assert: only section files are gone, so REPORT.md can hold that one run
    assert removed == ["fl.json", "old-section.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.json",
        "fl_round_time.png",
        "notes.json",
    ]


def test_a_partial_benchmark_run_names_the_sections_it_kept(tmp_path: Path) -> None:
    # Prepare: sections of earlier runs, and files that are not sections
    import json

    import run_all

    (tmp_path / "accuracy-budget.json").write_text(json.dumps({"section": "accuracy-budget"}))
    (tmp_path / "fl.json").write_text(json.dumps({"section": "fl", "figures": []}))
    (tmp_path / "notes.json").write_text(json.dumps(["not", "a section"]))
    (tmp_path / "broken.json").write_text("{")

    # Execute
    names = run_all.section_names(tmp_path)

    # Assert: the header of a partial run can say which sections it did not rerun
    assert names == ["accuracy-budget", "fl"]


def _row(attack: str, agg: str, final: float | None, *, hostile: int = 1, seed: int = 0,
         partition: str = "iid") -> dict[str, Any]:  # fmt: skip
    return {"partition": partition, "silos": 5, "hostile": 0 if attack == "honest" else hostile,
            "attack": attack, "claim": False, "aggregation": agg, "seed": seed,
            "final": final, "rejected": 0, "rollbacks": 0, "clipped": 0}  # fmt: skip


def test_the_robustness_section_compares_each_cell_with_its_honest_run() -> None:
    # Prepare: honest runs at 0.90 (both aggregations), attacked runs at 0.89 and 0.50
    # (clip) and a run that ended with no finite accuracy (mean)
    import bench_robustness as br
    from report import validate_section

    rows = [
        _row("honest", "centered-clip", 0.90), _row("honest", "mean", 0.90),
        _row("signflip-8", "centered-clip", 0.89), _row("ipm", "centered-clip", 0.50),
        _row("signflip-8", "mean", None),
        _row("signflip-8", "centered-clip", 0.70, hostile=2),
        _row(br.EXCLUDED, "centered-clip", 0.85),
    ]  # fmt: skip

    # Execute
    data = br.section(rows, complete=True, seconds=60.0, load="1.0")

    # Assert: a valid section; the worst drop per hostile share, the failed run counted
    validate_section(data)
    figures = {f["label"]: f["value"] for f in data["figures"]}
    assert figures["largest drop under attack, 1/5 hostile, centered-clip"] == pytest.approx(40.0)
    assert figures["largest drop under attack, 2/5 hostile, centered-clip"] == pytest.approx(20.0)
    assert figures["largest drop under attack, 2/10 hostile, centered-clip"] is None
    assert data["notes"][0].startswith("1 runs")
    assert [r[6] for r in data["tables"][0]["rows"]] == ["-1.0", "-40.0", "-", "-20.0"]
    # ... and each 1/5 cell against the hostile silo excluded (0.85): the best any defence
    # could do, the attacked run above it by 4 points or below it by 35
    assert [r[8] for r in data["tables"][0]["rows"]] == ["+4.0", "-35.0", "-", "-"]
    below = "largest drop below the hostile silos excluded, 1/5, centered-clip"
    assert figures[below] == pytest.approx(35.0)


def test_the_robustness_section_gives_each_robust_aggregation_its_figures() -> None:
    # Prepare: the trusted clip beside centered clipping, and a held-out cell that loses
    # 60 points (its own table, never a goal figure)
    import bench_robustness as br

    held, seed = br.HELD_OUT[0]
    rows = [
        _row("honest", "centered-clip", 0.90), _row("honest", "trusted-clip", 0.90),
        _row("ipm", "centered-clip", 0.50), _row("ipm", "trusted-clip", 0.88),
        _row("honest", "trusted-clip", 0.90, partition=held, seed=seed),
        _row("ipm", "trusted-clip", 0.30, partition=held, seed=seed),
    ]  # fmt: skip

    # Execute
    data = br.section(rows, complete=True, seconds=60.0, load="1.0")

    # Assert: one drop figure per aggregation, the held-out cell apart
    figures = {f["label"]: f["value"] for f in data["figures"]}
    assert figures["largest drop under attack, 1/5 hostile, centered-clip"] == pytest.approx(40.0)
    assert figures["largest drop under attack, 1/5 hostile, trusted-clip"] == pytest.approx(2.0)
    assert [r[3] for r in data["tables"][0]["rows"]] == ["centered-clip", "trusted-clip"]
    assert [(r[0], r[6]) for r in data["tables"][1]["rows"]] == [(held, "-60.0")]


def _ckks_row(attack: str, final: float | None, *, claim: bool = False, agg: str = "ckks",
              share: float | None = None) -> dict[str, Any]:  # fmt: skip
    return {**_row(attack, agg, final), "claim": claim, "liar-share": share,
            "refused-rounds": 2, "refusing": 9, "named": ["4"], "bounded": 0,
            "applied-not-logged": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("ckks_share", "met"),
    [(1 / 3, True), (0.89, False)],
    ids=["capped-as-in-plaintext", "the-cap-not-applied"],
)
def test_the_robustness_section_compares_the_ckks_liars_weight_with_plaintext(
    ckks_share: float, met: bool
) -> None:
    # Prepare: a CKKS honest run, a CKKS attack, and the size-claim liar in CKKS beside
    # its plaintext twin (FedAvg's mean), whose share is 1/3
    import bench_robustness as br
    from report import goal_met, validate_section

    rows = [
        _ckks_row("honest", 0.90), _ckks_row("ipm", 0.80), _row("honest", "mean", 0.88),
        _ckks_row("signflip-1", 0.86, claim=True, agg="mean", share=1 / 3),
        _ckks_row("signflip-1", 0.85, claim=True, share=ckks_share),
    ]  # fmt: skip

    # Execute
    data = br.section(rows, complete=True, seconds=60.0, load="1.0")

    # Assert: the CKKS cells in their own table against the CKKS honest run; the liar's
    # share judged against plaintext's
    validate_section(data)
    ckks = next(t for t in data["tables"] if t["title"].startswith("CKKS"))
    assert [(r[1], r[4], r[9]) for r in ckks["rows"]] == [
        ("ipm", "-10.0", "4"),
        ("signflip-1 +claim", "-5.0", "4"),
    ]
    assert [r[3] for r in data["tables"][0]["rows"]] == ["mean"]
    share = next(f for f in data["figures"] if f["label"].startswith("size-claim liar"))
    assert share["value"] == pytest.approx(100 * (ckks_share - 1 / 3))
    assert goal_met(share["value"], share["goal"]) is met
