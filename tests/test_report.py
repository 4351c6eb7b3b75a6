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
