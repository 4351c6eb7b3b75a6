"""Report figures: which measured cost line each run's ideal T* comes from."""

from __future__ import annotations

import pytest

from fl_lbbsp.contract import STEP_BATCH_SIZE
from fl_lbbsp.runs.summary import fit_cost_line, run_cost_lines


def _round(sizes: list[int], a: float, b: float) -> dict[str, object]:
    silos = {str(k): {"batch-size": x, "compute-time": a * x + b} for k, x in enumerate(sizes)}
    return {"event": "train", "round": 1, "silos": silos}


def test_every_scheme_of_a_comparison_shares_one_cost_line() -> None:
    # Prepare: LB-BSP ran several batch sizes, FedAvg one, on the same machine
    lbbsp = [_round([10, 20, 40, 80], a=0.01, b=0.1), _round([12, 25, 30, 60], a=0.01, b=0.1)]
    fedavg = [_round([32, 32, 32, 32], a=0.01, b=0.1)]
    slowdowns = [1.0, 2.0, 2.0, 4.0]

    # Execute
    line, costs = run_cost_lines({"fedavg": fedavg, "lbbsp": lbbsp})

    # Assert: one line, fitted on both runs, hence one T* for both schemes
    assert costs["lbbsp"] is costs["fedavg"] is line
    assert line.a == pytest.approx(0.01)
    assert line.b == pytest.approx(0.1)
    assert costs["fedavg"].ideal(slowdowns, 128) == costs["lbbsp"].ideal(slowdowns, 128)
    assert not fit_cost_line(fedavg).fitted


def test_a_cold_first_report_does_not_move_the_cost_line() -> None:
    # Prepare: round 1's first silo paid its process's start-up (1.6 s); later rounds lie on
    # t = 0.01 B + 0.1
    cold = _round([32, 32, 32, 32], a=0.01, b=0.1)
    cold["silos"]["0"]["compute-time"] = 1.6 + 0.42  # type: ignore[index]
    run = [cold, _round([16, 37, 38, 37], a=0.01, b=0.1), _round([23, 34, 35, 36], a=0.01, b=0.1)]

    # Execute
    line = fit_cost_line(run)

    # Assert: the line of the later rounds, hence T* of the machine, not of its start-up
    assert (line.a, line.b) == pytest.approx((0.01, 0.1))


def test_cost_modelled_runs_get_the_model_line_whatever_was_measured() -> None:
    # Prepare: silos reported t = tau * k * (m B + b) from a cost model; compute was noise
    config = {"event": "config", "local_steps": 10, "cost_model": "0.002,0.01"}
    runs = {
        name: [config, _round(sizes, a=0.5, b=3.0)]
        for name, sizes in (("fedavg", [32, 32]), ("lbbsp", [50, 14]))
    }

    # Execute
    line, costs = run_cost_lines(runs)

    # Assert: a = tau m, b = tau b, exactly
    assert (line.a, line.b) == pytest.approx((0.02, 0.1))
    assert costs["fedavg"] is costs["lbbsp"] is line


def test_tau_variant_times_count_per_configured_steps() -> None:
    # Prepare: tau = 10 configured; silos ran 5, 10 and 20 steps of 16 samples at
    # 0.002 s per sample + 0.01 s per step (the line at tau: a = 0.02, b = 0.1)
    silos = {
        str(k): {
            "batch-size": 8 * (k + 1),
            STEP_BATCH_SIZE: 16,
            "samples-processed": 16 * steps,
            "compute-time": steps * (0.002 * 16 + 0.01),
        }
        for k, steps in enumerate([5, 10, 20])
    }
    run = [{"event": "config", "local_steps": 10}, {"event": "train", "round": 1, "silos": silos}]

    # Execute
    line = fit_cost_line(run)

    # Assert: every silo counts at its cost of 10 steps of 16: 10 * (0.032 + 0.01)
    assert line.a * 16 + line.b == pytest.approx(0.42)


def _summary(scheme: str, silos: int, rounds: int = 6) -> dict[str, object]:
    """A comparison summary: FedAvg equal batches, LB-BSP spread by silo; capacities
    change in round 4 (T* moves)."""
    table = []
    for r in range(1, rounds + 1):
        sizes = {str(s): 16 if scheme == "fedavg" or r == 1 else 8 + 4 * s for s in range(silos)}
        table.append(
            {
                "round": r,
                "round_time": 1.0,
                "ideal_round_time": 0.5 if r < 4 else 0.7,
                "elapsed_emulated": float(r),
                "accuracy": 0.1 * r,
                "batch_sizes": sizes,
            }
        )
    return {"scheme": scheme, "emulated": True, "ideal_round_time": 0.6, "rounds": table}


def _legend_below(ax) -> bool:  # type: ignore[no-untyped-def]
    renderer = ax.figure.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    return bool(legend.y1 <= ax.get_window_extent(renderer).y0)


@pytest.mark.parametrize("silos", [5, 10])
def test_comparison_plot_stays_readable(tmp_path, silos: int) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    import matplotlib.pyplot as plt

    from fl_lbbsp.runs.summary import HEATMAP_FROM, comparison_figure, plot_comparison

    summaries = {name: _summary(name, silos) for name in ("fedavg", "lbbsp")}

    # Execute
    figure = comparison_figure(summaries)
    path = plot_comparison(summaries, tmp_path / "compare.png")

    # Assert: T* drawn per round and labelled, legends under the data
    axes = {ax.get_title(): ax for ax in figure.axes}
    time_axes = axes["round time (emulated)"]
    ideal = [line for line in time_axes.get_lines() if "T*" in str(line.get_label())]
    assert len(ideal) == 1 and set(ideal[0].get_ydata()) == {0.5, 0.7}
    figure.canvas.draw()
    assert _legend_below(time_axes) and _legend_below(axes["test accuracy"])
    if silos < HEATMAP_FROM:
        # one line per silo for LB-BSP, one labelled line for FedAvg's equal batches
        labels = [str(line.get_label()) for line in axes["batch size per silo"].get_lines()]
        assert [x for x in labels if x.startswith("fedavg")] == ["fedavg: silos 0..4 (5) (equal)"]
        assert len([x for x in labels if x.startswith("lbbsp")]) == silos
        assert _legend_below(axes["batch size per silo"])
    else:
        # a heat map of silos x rounds per scheme
        for name in summaries:
            images = axes[f"batch size per silo: {name}"].get_images()
            assert len(images) == 1 and images[0].get_array().shape == (silos, 6)
    assert path.stat().st_size > 10_000
    plt.close(figure)


def _telemetry(config: dict[str, object]) -> list[dict[str, object]]:
    """A config event and 3 aggregated rounds of 2 machines, accuracy 0.1 -> 0.7."""
    events: list[dict[str, object]] = [{"event": "config", **config}]
    for r in (1, 2, 3):
        silos = {
            "0": {"batch-size": 8 + r, "compute-time": 0.1, "train-time": 1.0},
            "1": {"batch-size": 8 - r, "compute-time": 0.1, "train-time": 2.0},
        }
        events.append(
            {"event": "train", "round": r, "round_time": 2.0, "idle_fraction": 0.25,
             "wall_time": 2.5, "overhead": 0.5, "silos": silos}
        )  # fmt: skip
    events += [{"event": "evaluate", "round": r, "accuracy": 0.1 + 0.3 * r} for r in (0, 2)]
    return events


def test_one_summary_and_one_table_for_fl_and_cluster_runs() -> None:
    # Prepare: an FL run and a cluster run of the same rounds
    from fl_lbbsp.runs.summary import format_table, summarise

    fl = _telemetry({"scheme": "lbbsp", "silos": 2, "batch_size": 8, "speeds": [2.0, 1.0]})
    cluster = _telemetry({"scheme": "lbbsp", "workers": 2, "iterations": 3, "speeds": [2.0, 1.0]})

    # Execute
    fl_summary = summarise(fl, target_accuracy=0.6, steady_from=1)
    cluster_summary = summarise(cluster, target_accuracy=0.6)
    fl_table = format_table({"lbbsp": fl_summary})
    cluster_table = format_table({"lbbsp": cluster_summary})

    # Assert: shared figures alike; each table has its own rows and emulation note only
    for summary in (fl_summary, cluster_summary):
        assert summary["time_to_target"] == 4.0 and summary["final_accuracy"] == 0.7
        assert summary["batch_sizes_final"] == {"0": 11, "1": 5} and summary["emulated"]
    assert cluster_summary["iterations_to_target"] == 2
    assert cluster_summary["overhead_share"] == pytest.approx(0.2)
    assert "round time / T*" in fl_table and "messaging" not in fl_table
    assert "messaging share" in cluster_table and "T*" not in cluster_table
    assert "time to target accuracy (s)" in fl_table and "time to target" in cluster_table
    assert "silo capacities [2.0, 1.0]" in fl_table
    assert "worker capacities [2.0, 1.0]" in cluster_table
