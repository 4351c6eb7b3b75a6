"""The ``noise`` benchmark section: its pure parts (cost lines, schedules, the rounds to
the oracle after a change, a driven run) and its smoke run, which writes a section the
report accepts (seconds, real burners included)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_noise  # noqa: E402

OPS = {"<=", "<", ">=", ">"}


def _load_report() -> Any:
    spec = importlib.util.spec_from_file_location(
        "bench_report_noise", ROOT / "benchmarks/report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report_noise"] = module
    spec.loader.exec_module(module)
    return module


report = _load_report()


# ------------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("spread", [2.0, 4.0, 8.0])
def test_capacities_span_the_spread_geometrically(spread: float) -> None:
    # Execute
    caps = bench_noise.capacities(spread, 5)

    # Assert
    assert caps[0] == pytest.approx(spread) and caps[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(caps[:-1] / caps[1:], spread**0.25)


def test_mixed_fixed_costs_are_a_share_of_the_time_at_b_init() -> None:
    # Prepare
    config = bench_noise.FULL

    # Execute
    a, b = bench_noise.cost_lines(4.0, "mixed", config, np.random.default_rng(0))
    _, none = bench_noise.cost_lines(4.0, "none", config, np.random.default_rng(0))

    # Assert: b_i / (a_i B_init) in [0.2, 1]; "none" has no fixed cost
    share = b / (a * config.initial_batch_size)
    assert np.all((share >= 0.2) & (share <= 1.0))
    assert not none.any()
    with pytest.raises(ValueError, match="fixed cost"):
        bench_noise.cost_lines(4.0, "large", config, np.random.default_rng(0))


@settings(max_examples=30, deadline=None)
@given(sigma=st.sampled_from([0.0, 0.1, 0.3]), seed=st.integers(0, 1000))
def test_jitter_is_seeded_log_normal_with_mean_one(sigma: float, seed: int) -> None:
    # Execute
    noise = bench_noise.jitter(sigma, (4000, 5), np.random.default_rng(seed))
    again = bench_noise.jitter(sigma, (4000, 5), np.random.default_rng(seed))

    # Assert
    np.testing.assert_array_equal(noise, again)
    assert noise.mean() == pytest.approx(1.0, abs=0.02)
    assert np.log(noise).std() == pytest.approx(sigma, abs=0.02)


def test_step_schedule_slows_one_silo_between_the_changes() -> None:
    # Prepare
    config = bench_noise.FULL

    # Execute
    m, changes = bench_noise.step_schedule(config, 2, 1 / 3, 45)

    # Assert: rounds 16-30 (1-based) of silo 2 take 3x; changes at rounds 16 and 31
    assert changes == [15, 30]
    assert m[15:30, 2].tolist() == [3.0] * 15
    assert m[:15].max() == m[30:].max() == 1.0 and m[:, [0, 1, 3, 4]].max() == 1.0


@pytest.mark.parametrize(
    ("clean", "oracle", "expected"),
    [
        ([1.0, 1.0, 2.0, 2.0, 1.0, 1.0], [1.0] * 6, [2, 0]),  # r, r+1 bad, r+2 good
        ([1.0, 1.0, 1.04, 1.0, 1.0, 1.0], [1.0] * 6, [0, 0]),  # within 5% at once
        ([1.0, 1.0, 2.0, 2.0, 2.0, 2.0], [1.0] * 6, [None, None]),  # never followed
    ],
)
def test_rounds_to_oracle_counts_from_the_first_round_at_the_new_capacity(
    clean: list[float], oracle: list[float], expected: list[int | None]
) -> None:
    # Prepare: changes at rounds 2 and 5 (0-based)
    run = bench_noise.Run(lbbsp_clean=clean, oracle_clean=oracle)

    # Execute / Assert
    assert bench_noise.rounds_to_oracle(run, [2, 5]) == expected


def test_a_perfect_start_is_the_oracle_and_fedavg_waits_for_the_slowest() -> None:
    # Prepare: 5 silos, no noise, constant capacities 4:1
    config = bench_noise.FULL
    a, b = bench_noise.cost_lines(4.0, "none", config, np.random.default_rng(0))
    ones = np.ones((20, config.silos))

    # Execute
    run = bench_noise.simulate(a, b, ones, ones, config)
    ratios = run.ratios(config.warmup)

    # Assert: the balancer reaches the oracle; FedAvg is set by the slowest silo
    assert ratios["oracle"] == pytest.approx(1.0, abs=0.01)
    assert ratios["fedavg_oracle"] > 1.5
    assert run.sizes[0] == [config.initial_batch_size] * config.silos
    assert all(sum(s) == config.silos * config.initial_batch_size for s in run.sizes)


# ------------------------------------------------------------------------- smoke run
@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("noise")
    assert bench_noise.main(["--smoke", "--out", str(out)], report=lambda _: None) == 0
    return json.loads((out / "noise.json").read_text()), out


def test_smoke_run_writes_a_section_the_report_accepts(smoke: tuple[dict[str, Any], Path]) -> None:
    # Prepare
    section, out = smoke

    # Execute
    report.validate_section(section, source="noise.json")
    text = report.render_report(report.load_sections(out))

    # Assert: every figure renderable, the goals there, the setting says what is emulated
    assert section["section"] == "noise" and "Emulated" in section["setting"]
    for figure in section["figures"]:
        value, goal = figure["value"], figure["goal"]
        assert value is None or math.isfinite(value)
        assert goal is None or goal["op"] in OPS
        assert figure["note"]
    assert "## Noise" in text and "LB-BSP round time / oracle" in text
    static, steps, shared, real = section["tables"]
    assert len(static["rows"]) == 2 * 2 * 2  # spreads x fixed costs x jitters
    assert len(steps["rows"]) == 2 * 2 and len(real["rows"]) == 1
    assert len(shared["rows"]) == 2 * 2  # spreads x fixed costs, a shared slowdown each


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("figures", [], "missing the figure"),
        ("figures.0.goal", None, "must carry its goal"),
        ("tables", [], "must hold 4 tables"),
        ("tables.1.columns", ["spread", "silo"], r"tables\[1\].columns: must be"),
    ],
)
def test_report_rejects_a_noise_section_without_its_figures_or_tables(
    smoke: tuple[dict[str, Any], Path], path: str, value: Any, message: str
) -> None:
    # Prepare: the smoke section with one field broken
    section = copy.deepcopy(smoke[0])
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    node: Any = section
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    if path == "tables.1.columns":
        section["tables"][1]["rows"] = []

    # Execute / Assert
    with pytest.raises(report.SectionError, match=message):
        report.validate_section(section, source="noise.json")


def test_noise_is_a_section_of_make_bench() -> None:
    # Prepare
    spec = importlib.util.spec_from_file_location("run_all_noise", ROOT / "benchmarks/run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    # Assert
    assert module.SECTIONS["noise"] == ("bench_noise.py", ("noise",))
    assert "noise" in report.SECTION_ORDER
