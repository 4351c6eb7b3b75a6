"""Tests for benchmarks/report.py: goals, missed-by, schema errors, rendering."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


def _load_report() -> Any:
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks/report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = module
    spec.loader.exec_module(module)
    return module


report = _load_report()


def _section(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "section": "cluster",
        "title": "Cluster: 4 workers",
        "setting": "MNIST, emulated capacities 4:2:1:1.",
        "figures": [
            {
                "label": "LB-BSP iteration time / T*",
                "value": 1.08,
                "format": ".3f",
                "unit": "",
                "goal": {"op": "<=", "target": 1.05},
                "note": "steady iterations",
            },
            {"label": "idle fraction", "value": 0.01, "format": ".1%", "goal": None},
        ],
        "tables": [{"title": "Per scheme", "columns": ["scheme", "time"], "rows": [["bsp", "1"]]}],
        "plots": ["cluster.png"],
        "notes": ["a note"],
    }
    section.update(overrides)
    return section


# ------------------------------------------------------------------------------ goals
@pytest.mark.parametrize(
    ("value", "op", "target", "expected"),
    [
        (1.0, "<=", 1.0, True),
        (1.0, "<", 1.0, False),
        (0.9, "<", 1.0, True),
        (1.0, ">=", 1.0, True),
        (1.0, ">", 1.0, False),
        (1.1, ">", 1.0, True),
        (1.2, "<=", 1.0, False),
        (0.8, ">=", 1.0, False),
    ],
)
def test_goal_met_per_operator(value: float, op: str, target: float, expected: bool) -> None:
    # Execute / Assert
    assert report.goal_met(value, {"op": op, "target": target}) is expected


@pytest.mark.parametrize(("value", "goal"), [(None, {"op": "<=", "target": 1}), (1.0, None)])
def test_goal_met_is_none_without_value_or_goal(value: float | None, goal: Any) -> None:
    # Execute / Assert
    assert report.goal_met(value, goal) is None


@pytest.mark.parametrize(
    ("value", "op", "target", "absolute", "relative"),
    [
        (1.08, "<=", 1.05, 0.03, 1.08 / 1.05 - 1),
        (0.045, "<", 0.03, 0.015, 0.5),
        (1.2, ">=", 1.5, 0.3, -0.2),
        (1.5, ">", 1.5, 0.0, 0.0),
        (0.2, "<=", 0.0, 0.2, None),
    ],
)
def test_missed_by_is_the_gap_to_the_target(
    value: float, op: str, target: float, absolute: float, relative: float | None
) -> None:
    # Execute
    miss = report.missed_by(value, {"op": op, "target": target})

    # Assert
    assert miss.absolute == pytest.approx(absolute)
    if relative is None:
        assert miss.relative is None
    else:
        assert miss.relative == pytest.approx(relative)


@settings(max_examples=100, deadline=None)
@given(
    value=st.floats(-1e6, 1e6, allow_nan=False),
    target=st.floats(-1e6, 1e6, allow_nan=False),
    op=st.sampled_from(["<=", "<", ">=", ">"]),
)
def test_missed_by_is_none_exactly_when_met(value: float, target: float, op: str) -> None:
    # Execute
    goal = {"op": op, "target": target}
    miss = report.missed_by(value, goal)

    # Assert: a miss iff the goal is not met, and its gap is never negative
    assert (miss is None) == report.goal_met(value, goal)
    if miss is not None:
        assert miss.absolute >= 0


# ------------------------------------------------------------------------- validation
def _broken(path: str, value: Any) -> dict[str, Any]:
    """A valid section with the field at ``path`` (dots, list indices) set to ``value``
    (or removed when ``value`` is the string ``"<del>"``)."""
    section = copy.deepcopy(_section())
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    node: Any = section
    for key in keys[:-1]:
        node = node[key]
    if value == "<del>":
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return section


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("section", "<del>", "missing 'section'"),
        ("title", 3, r"title: must be a string"),
        ("figures", {}, r"figures: must be a list"),
        ("figures.0.value", "1.0", r"figures\[0\].value: must be a finite number or null"),
        ("figures.0.value", float("nan"), r"figures\[0\].value"),
        ("figures.0.value", "<del>", r"figures\[0\]: missing 'value'"),
        ("figures.0.goal.op", "==", r"figures\[0\].goal.op: must be one of"),
        ("figures.0.goal.target", None, r"figures\[0\].goal.target: must be a finite number"),
        ("figures.0.goal", 1.05, r"figures\[0\].goal: must be an object"),
        ("figures.0.format", ".3q", r"figures\[0\].format: invalid format spec"),
        ("figures.1.label", "<del>", r"figures\[1\]: missing 'label'"),
        ("tables.0.rows", [["only one cell"]], r"tables\[0\].rows\[0\]: must be a list of 2"),
        ("tables.0.columns", [], r"tables\[0\].columns: must be a non-empty list"),
        ("plots", [3], r"plots\[0\]: must be a string"),
    ],
)
def test_validate_section_names_the_bad_field(path: str, value: Any, message: str) -> None:
    # Prepare
    data = _broken(path, value)

    # Execute / Assert
    with pytest.raises(report.SectionError, match=message):
        report.validate_section(data, source="cluster.json")


def test_validate_section_rejects_a_non_object() -> None:
    # Execute / Assert
    with pytest.raises(report.SectionError, match="x.json: a section must be a JSON object"):
        report.validate_section([1, 2], source="x.json")


def test_load_sections_reports_invalid_json_with_file_name(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "he.json").write_text("{not json")

    # Execute / Assert
    with pytest.raises(report.SectionError, match=r"he.json: not valid JSON"):
        report.load_sections(tmp_path)


def test_load_sections_rejects_duplicate_section_ids(tmp_path: Path) -> None:
    # Prepare
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps(_section()))

    # Execute / Assert
    with pytest.raises(report.SectionError, match="more than one file"):
        report.load_sections(tmp_path)


def test_sections_are_ordered_known_first_then_unknown_by_name() -> None:
    # Prepare
    names = ["zeta", "he", "cluster", "alpha", "fl", "predictors"]

    # Execute
    ordered = report.order_sections([_section(section=n) for n in names])

    # Assert
    assert [s["section"] for s in ordered] == ["fl", "predictors", "cluster", "he", "alpha", "zeta"]


# -------------------------------------------------------------------------- rendering
def test_render_section_shows_goal_miss_and_contents() -> None:
    # Execute
    text = "\n".join(report.render_section(_section()))

    # Assert: value, goal and the miss beside it; no goal shown as '-'
    assert "| LB-BSP iteration time / T* | 1.080 | <= 1.050 | ✗ | 0.030 (+2.9% vs goal) |" in text
    assert "| idle fraction | 1.0% | - | - |  |" in text
    assert "## Cluster: 4 workers" in text
    assert "| bsp | 1 |" in text and "![cluster.png](cluster.png)" in text
    assert "- a note" in text


def test_render_section_with_null_value_shows_na() -> None:
    # Prepare
    section = _section()
    section["figures"][0]["value"] = None
    section["figures"][0]["note"] = "no run reached the target"

    # Execute
    text = "\n".join(report.render_section(section))

    # Assert
    expected = "| LB-BSP iteration time / T* | n/a | <= 1.050 | n/a |  | no run reached the target"
    assert expected in text


def test_summary_lists_only_figures_with_goals_and_counts_met() -> None:
    # Prepare
    met = _section(section="overhead", title="Overhead")
    met["figures"] = [
        {"label": "decision at 1,000", "value": 0.4, "unit": "ms", "goal": {"op": "<", "target": 1}}
    ]

    # Execute
    lines = report.render_summary([_section(), met])

    # Assert
    text = "\n".join(lines)
    assert lines[0] == "1 of 2 goals met."
    assert "| [overhead](#overhead) | decision at 1,000 | 0.4 ms | < 1 ms | ✓ |  |" in text
    assert "idle fraction" not in text


@pytest.mark.parametrize(("value", "expected"), [(120, "120"), (120.0, "120"), (1.5, "1.5")])
def test_integer_format_renders_whole_numbers(value: float, expected: str) -> None:
    # Prepare: "d" is a valid spec for a count, whatever JSON made of it
    figure = {"label": "iterations", "value": value, "format": "d"}
    report.validate_section(_section(figures=[figure]))

    # Execute / Assert
    assert report.format_value(value, figure) == expected


def test_render_escapes_pipes_in_cells() -> None:
    # Prepare
    section = _section(tables=[{"columns": ["a|b"], "rows": [["x|y"]]}])

    # Execute
    text = "\n".join(report.render_section(section))

    # Assert
    assert "| a\\|b |" in text and "| x\\|y |" in text


def test_write_report_round_trip(tmp_path: Path) -> None:
    # Prepare
    report.write_section(_section(), tmp_path)
    report.write_section(_section(section="fl", title="FL"), tmp_path)

    # Execute
    path = report.write_report(tmp_path, header=["Run on 2 CPUs."])

    # Assert: FL comes before cluster, the header and the summary are there
    text = path.read_text()
    assert path.name == "REPORT.md"
    assert text.index("## FL") < text.index("## Cluster: 4 workers")
    assert "Run on 2 CPUs." in text and "0 of 2 goals met." in text


def test_write_section_refuses_an_invalid_section(tmp_path: Path) -> None:
    # Prepare
    section = _broken("figures.0.goal.op", "=<")

    # Execute / Assert
    with pytest.raises(report.SectionError, match="goal.op"):
        report.write_section(section, tmp_path)
    assert not list(tmp_path.iterdir())


def test_main_exits_2_on_a_malformed_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Prepare
    (tmp_path / "fl.json").write_text(json.dumps({"section": "fl"}))

    # Execute
    code = report.main(["--results", str(tmp_path)])

    # Assert
    assert code == 2
    assert "fl.json: missing 'title'" in capsys.readouterr().err


def test_main_keeps_the_existing_header_unless_given_a_new_one(tmp_path: Path) -> None:
    # Prepare: a report whose header says how its sections were run
    report.write_section(_section(), tmp_path)
    report.write_report(tmp_path, header=["Full run on 2 CPUs.", "- cluster: ok (2 min)"])
    new = tmp_path / "header.md"
    new.write_text("\nRerun of the cluster section.\n\n")

    # Execute: regenerate without, then with --header
    kept = report.main(["--results", str(tmp_path)])
    kept_text = (tmp_path / "REPORT.md").read_text()
    replaced = report.main(["--results", str(tmp_path), "--header", str(new)])
    replaced_text = (tmp_path / "REPORT.md").read_text()

    # Assert
    assert kept == replaced == 0
    assert report.read_header(tmp_path / "REPORT.md") == ["Rerun of the cluster section."]
    assert kept_text.startswith("# Benchmark report\n\nFull run on 2 CPUs.\n- cluster: ok")
    assert "Full run on 2 CPUs." not in replaced_text
    assert replaced_text.startswith("# Benchmark report\n\nRerun of the cluster section.\n\n##")
    assert report.read_header(tmp_path / "missing.md") == []
