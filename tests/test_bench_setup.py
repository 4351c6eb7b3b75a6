"""The ``setup`` benchmark section: the gain it reads from a demo report made by the demo's
own command (tiny: 3 silos, 4 rounds, times from a cost model). No timing assertions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_setup  # noqa: E402

from fl_lbbsp.cli import main as cli_main  # noqa: E402


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    code = cli_main(
        ["compare", "--dataset", "embedded", "--model", "mlp", "--silos", "3",
         "--speeds", "4,2,1", "--partition", "iid", "--rounds", "4", "--local-steps", "5",
         "--batch-size", "16", "--lr", "0.1", "--seed", "0", "--quiet", "--in-process",
         "--no-wait", "--cost-model", "1e-4,5e-4", "--out", str(out),
         "--json", str(out / "report.json")]
    )  # fmt: skip
    assert code in (0, None)
    return json.loads((out / "report.json").read_text())  # type: ignore[no-any-return]


def test_the_demo_report_shows_the_gain_the_section_reads(demo_report: dict[str, Any]) -> None:
    # Execute
    figures = bench_setup.demo_figures(demo_report)

    # Assert: with times from a cost model, LB-BSP's steady rounds are shorter than FedAvg's
    # equal split, whose slowest silo (capacity 1 of 4) sets its pace
    assert figures["lbbsp_over_ideal"] < figures["fedavg_over_ideal"]
    assert figures["fedavg_over_ideal"] > 1.5


def test_a_demo_whose_scheme_missed_the_target_is_refused(demo_report: dict[str, Any]) -> None:
    # Prepare: the same report with LB-BSP never reaching the target
    report = json.loads(json.dumps(demo_report))
    report["schemes"]["lbbsp"]["time_to_target"] = None

    # Execute / Assert
    with pytest.raises(ValueError, match="never reached the target"):
        bench_setup.demo_figures(report)
