"""Benchmark report: validate every section JSON and render them into one markdown file.

Each benchmark section writes ``<section>.json`` (and its PNGs) into the results folder,
following the schema below; this module checks them and writes ``REPORT.md`` beside them:
a summary of every figure that has a goal (met or missed, and by how much), then each
section with its setting, figures (goal beside each value), tables, plots and notes.

Section schema (``value`` may be null when the figure could not be computed; its note
says why)::

    {"section": "cluster", "title": "...", "setting": "markdown paragraph",
     "figures": [{"label": "...", "value": 1.02, "format": ".3f", "unit": "",
                  "goal": {"op": "<=", "target": 1.05} | null, "note": "..."}],
     "tables": [{"title": "...", "columns": ["a", "b"], "rows": [["x", "1"]]}],
     "plots": ["file.png"], "notes": ["..."]}

Some sections carry more and are checked for it (:data:`SECTION_CHECKS`): ``accuracy``
(``bench_accuracy.py``) has a per-partition table and a per-seed table, the two goal
figures of every partition, and a machine-readable ``summary`` per partition.

Run: ``python benchmarks/report.py [--results benchmarks/results] [--header FILE]``: the
header (the lines between the title and the goals: how and when the sections were run) is
kept from the existing ``REPORT.md`` unless ``--header`` gives new lines.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GOAL_OPS",
    "SECTION_CHECKS",
    "SECTION_ORDER",
    "SectionError",
    "goal_met",
    "load_sections",
    "main",
    "missed_by",
    "order_sections",
    "read_header",
    "render_report",
    "render_section",
    "render_summary",
    "validate_section",
    "write_report",
    "write_section",
]

SECTION_ORDER = (
    "setup", "fl", "dynamics", "noise", "accuracy", "predictors", "cluster", "ddp", "overhead",
    "he", "wallclock", "plugin", "robustness",
)  # fmt: skip
GOAL_OPS = ("<=", "<", ">=", ">")
REPORT_NAME = "REPORT.md"

# What a section must hold beyond the schema: figure labels that must be there with a
# goal, and the columns of its tables (in order).
SECTION_RULES: dict[str, dict[str, tuple[Any, ...]]] = {
    "noise": {
        "goal_figures": (
            "LB-BSP round time / oracle, worst cell at jitter <= 10%",
            "LB-BSP round time / oracle, worst cell at jitter 30%",
            "LB-BSP round time / FedAvg's, worst cell",
            "rounds to within 5% of the oracle after a step change, worst step cell at "
            "jitter <= 10%",
            "LB-BSP round time / oracle, worst cell with a machine-wide slowdown",
        ),
        "tables": (
            (
                "spread", "fixed cost", "jitter", "LB-BSP / oracle", "worst seed",
                "LB-BSP / T*", "LB-BSP idle", "FedAvg / oracle", "FedAvg / T*",
                "FedAvg idle", "goals",
            ),
            (
                "spread", "silo", "capacity", "jitter", "fixed cost", "rounds (down)",
                "rounds (back)", "LB-BSP / oracle", "FedAvg / oracle", "goals",
            ),
            (
                "spread", "fixed cost", "LB-BSP / oracle", "worst seed",
                "without the shared factor", "rounds within 5%",
                "without the shared factor, within 5%", "FedAvg / oracle", "goals",
            ),
            (
                "spread", "noise (log-sd)", "LB-BSP / oracle", "LB-BSP / T*", "LB-BSP idle",
                "FedAvg / oracle", "FedAvg / T*", "FedAvg idle", "goals",
            ),
        ),
    },
}  # fmt: skip
DEFAULT_FORMAT = ".4g"


class SectionError(ValueError):
    """A benchmark section that does not follow the schema (the message names the field)."""


# ----------------------------------------------------------------------------- goals
def goal_met(value: float | None, goal: Mapping[str, Any] | None) -> bool | None:
    """Whether ``value`` meets ``goal``; ``None`` when there is no goal or no value.

    Parameters
    ----------
    value : float | None
        The measured figure.
    goal : mapping | None
        ``{"op": "<=" | "<" | ">=" | ">", "target": float}``.
    """
    if goal is None or value is None:
        return None
    op, target = goal["op"], float(goal["target"])
    if op == "<=":
        return value <= target
    if op == "<":
        return value < target
    if op == ">=":
        return value >= target
    if op == ">":
        return value > target
    raise SectionError(f"unknown goal op {op!r}; expected one of {GOAL_OPS}")


@dataclass(frozen=True)
class Miss:
    """How far a figure is from its goal: ``absolute`` in the figure's unit (>= 0) and
    ``relative`` to the target (signed: value / target - 1; None when the target is 0)."""

    absolute: float
    relative: float | None


def missed_by(value: float | None, goal: Mapping[str, Any] | None) -> Miss | None:
    """The gap between a missed goal and its value, ``None`` when met (or not evaluable).

    For ``<=`` and ``<`` the gap is ``value - target``, for ``>=`` and ``>`` it is
    ``target - value``; a strict goal missed exactly at its bound has a gap of 0.
    """
    met = goal_met(value, goal)
    if met is None or met:
        return None
    assert value is not None and goal is not None
    target = float(goal["target"])
    gap = value - target if goal["op"] in ("<=", "<") else target - value
    relative = None if target == 0 else value / target - 1.0
    return Miss(absolute=max(gap, 0.0), relative=relative)


# ------------------------------------------------------------------------ validation
def _fail(where: str, message: str) -> SectionError:
    return SectionError(f"{where}: {message}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_str(data: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> None:
    if key not in data:
        if optional:
            return
        raise _fail(where, f"missing '{key}'")
    if not isinstance(data[key], str):
        raise _fail(f"{where}.{key}", f"must be a string, got {data[key]!r}")


def _check_list(data: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise _fail(f"{where}.{key}", f"must be a list, got {type(value).__name__}")
    return value


def _check_format(spec: object, where: str) -> None:
    if not isinstance(spec, str):
        raise _fail(where, f"must be a format spec string like '.3f', got {spec!r}")
    for probe in (1.5, 1):
        try:
            format(probe, spec)
            return
        except ValueError:
            pass
    raise _fail(where, f"invalid format spec {spec!r}")


def _check_goal(goal: object, where: str) -> None:
    if goal is None:
        return
    if not isinstance(goal, dict):
        raise _fail(where, f"must be an object {{op, target}} or null, got {goal!r}")
    if goal.get("op") not in GOAL_OPS:
        raise _fail(f"{where}.op", f"must be one of {', '.join(GOAL_OPS)}, got {goal.get('op')!r}")
    target = goal.get("target")
    if not _is_number(target) or not math.isfinite(float(target)):
        raise _fail(f"{where}.target", f"must be a finite number, got {target!r}")


def _check_figure(figure: object, where: str) -> None:
    if not isinstance(figure, dict):
        raise _fail(where, f"must be an object, got {figure!r}")
    _check_str(figure, "label", where)
    if "value" not in figure:
        raise _fail(where, "missing 'value' (use null when it could not be computed)")
    value = figure["value"]
    if value is not None and (not _is_number(value) or not math.isfinite(float(value))):
        raise _fail(f"{where}.value", f"must be a finite number or null, got {value!r}")
    if "format" in figure:
        _check_format(figure["format"], f"{where}.format")
    _check_str(figure, "unit", where, optional=True)
    _check_str(figure, "note", where, optional=True)
    _check_goal(figure.get("goal"), f"{where}.goal")


def _check_table(table: object, where: str) -> None:
    if not isinstance(table, dict):
        raise _fail(where, f"must be an object, got {table!r}")
    _check_str(table, "title", where, optional=True)
    columns = table.get("columns")
    if not isinstance(columns, list) or not columns:
        raise _fail(f"{where}.columns", f"must be a non-empty list, got {columns!r}")
    rows = _check_list(table, "rows", where)
    for k, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise _fail(
                f"{where}.rows[{k}]", f"must be a list of {len(columns)} cells, got {row!r}"
            )


ACCURACY_SUMMARY_KEYS = (
    "seeds",
    "diff_mean",
    "diff_sd",
    "diff_low",
    "diff_high",
    "diff_goal_met",
    "speedup_min",
    "speedup_median",
    "speedup_seeds_met",
    "speedup_goal_met",
    "min_batch_size",
    "noise_ratio",
    "seeds_needed",
)
"""What the ``accuracy`` section's ``summary`` holds for every partition."""


def _check_accuracy(data: Mapping[str, Any], source: str) -> None:
    """The ``accuracy`` section: tables ``[per partition, per seed]`` whose first columns
    are ``partition`` (and ``seed``), every partition of the per-seed table in the
    per-partition one, a goal figure for the 95% lower bound and the smallest speed-up of
    every partition, and a ``summary`` object with :data:`ACCURACY_SUMMARY_KEYS` per
    partition."""
    tables = data.get("tables", [])
    if len(tables) < 2:
        raise _fail(f"{source}.tables", "needs the per-partition and the per-seed table")
    if tables[0]["columns"][0] != "partition":
        raise _fail(f"{source}.tables[0].columns", "must start with 'partition'")
    if tables[1]["columns"][:2] != ["partition", "seed"]:
        raise _fail(f"{source}.tables[1].columns", "must start with 'partition', 'seed'")
    partitions = [row[0] for row in tables[0]["rows"]]
    if not partitions:
        raise _fail(f"{source}.tables[0].rows", "must list at least one partition")
    unknown = sorted({row[0] for row in tables[1]["rows"]} - set(partitions))
    if unknown:
        raise _fail(f"{source}.tables[1].rows", f"partitions {unknown} have no summary row")
    for partition in partitions:
        for kind in ("95% lower bound", "speed-up"):
            if not any(
                kind in f["label"] and f["label"].endswith(f", {partition}") and f.get("goal")
                for f in data.get("figures", [])
            ):
                raise _fail(
                    f"{source}.figures", f"no figure with a goal for the {kind} of {partition}"
                )
    summary = data.get("summary")
    if not isinstance(summary, dict) or sorted(summary) != sorted(partitions):
        raise _fail(f"{source}.summary", f"must be an object keyed by {partitions}")
    for partition, values in summary.items():
        where = f"{source}.summary[{partition!r}]"
        if not isinstance(values, dict):
            raise _fail(where, f"must be an object, got {values!r}")
        missing = [k for k in ACCURACY_SUMMARY_KEYS if k not in values]
        if missing:
            raise _fail(where, f"missing {missing}")
        for key, value in values.items():
            if value is not None and not isinstance(value, bool) and not _is_number(value):
                raise _fail(f"{where}.{key}", f"must be a number, a boolean or null: {value!r}")
            if _is_number(value) and not math.isfinite(float(value)):
                raise _fail(f"{where}.{key}", f"must be finite, got {value!r}")


SECTION_CHECKS: dict[str, Callable[[Mapping[str, Any], str], None]] = {
    "accuracy": _check_accuracy,
}
"""Checks beyond the common schema, by section id (run after it)."""


def validate_section(data: object, *, source: str = "section") -> dict[str, Any]:
    """Check a section against the schema and return it.

    Parameters
    ----------
    data : object
        The parsed JSON.
    source : str (default: "section")
        Where it came from, for the error message (a file name).

    Raises
    ------
    SectionError
        Naming the file, the field (``figures[2].goal.op``) and what is wrong.
    """
    if not isinstance(data, dict):
        raise _fail(source, f"a section must be a JSON object, got {type(data).__name__}")
    for key in ("section", "title"):
        _check_str(data, key, source)
    if not data["section"]:
        raise _fail(f"{source}.section", "must not be empty")
    _check_str(data, "setting", source, optional=True)
    for k, figure in enumerate(_check_list(data, "figures", source)):
        _check_figure(figure, f"{source}.figures[{k}]")
    for k, table in enumerate(_check_list(data, "tables", source)):
        _check_table(table, f"{source}.tables[{k}]")
    for key in ("plots", "notes"):
        for k, item in enumerate(_check_list(data, key, source)):
            if not isinstance(item, str):
                raise _fail(f"{source}.{key}[{k}]", f"must be a string, got {item!r}")
    _check_rules(data, source)
    check = SECTION_CHECKS.get(data["section"])
    if check is not None:
        check(data, source)
    return data


def _check_rules(data: Mapping[str, Any], source: str) -> None:
    """The section-specific rules of :data:`SECTION_RULES`."""
    rules = SECTION_RULES.get(data["section"])
    if rules is None:
        return
    goals = {f["label"]: f.get("goal") for f in data.get("figures", [])}
    for label in rules.get("goal_figures", ()):
        if label not in goals:
            raise _fail(f"{source}.figures", f"missing the figure {label!r}")
        if goals[label] is None:
            raise _fail(f"{source}.figures", f"the figure {label!r} must carry its goal")
    tables = data.get("tables", [])
    expected = rules.get("tables", ())
    if len(tables) != len(expected):
        raise _fail(f"{source}.tables", f"must hold {len(expected)} tables, got {len(tables)}")
    for k, (table, columns) in enumerate(zip(tables, expected, strict=True)):
        if tuple(table["columns"]) != tuple(columns):
            raise _fail(f"{source}.tables[{k}].columns", f"must be {list(columns)}")


def load_sections(folder: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` section in ``folder``, validated, in report order.

    Raises
    ------
    SectionError
        On a file that is not JSON or does not follow the schema, or two files with the
        same section id.
    """
    sections = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SectionError(f"{path.name}: not valid JSON ({err})") from None
        sections.append(validate_section(data, source=path.name))
    seen: dict[str, int] = {}
    for section in sections:
        seen[section["section"]] = seen.get(section["section"], 0) + 1
    duplicates = sorted(name for name, count in seen.items() if count > 1)
    if duplicates:
        raise SectionError(f"section ids written by more than one file: {duplicates}")
    return order_sections(sections)


def order_sections(sections: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Known sections in :data:`SECTION_ORDER`, then unknown ones by id."""

    def key(section: dict[str, Any]) -> tuple[int, str]:
        name = section["section"]
        rank = SECTION_ORDER.index(name) if name in SECTION_ORDER else len(SECTION_ORDER)
        return rank, name

    return sorted(sections, key=key)


def write_section(data: dict[str, Any], out: Path) -> Path:
    """Validate a section and write it to ``out/<section>.json``; return the path."""
    validate_section(data, source=f"{data.get('section', '?')}.json")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{data['section']}.json"
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return path


# ------------------------------------------------------------------------- rendering
def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = [
        "| " + " | ".join(_cell(c) for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)
    return lines


def _with_unit(text: str, unit: str) -> str:
    if not unit:
        return text
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}"


def format_value(value: float | None, figure: Mapping[str, Any]) -> str:
    """A figure's value with its format and unit; ``n/a`` when null."""
    if value is None:
        return "n/a"
    spec = figure.get("format", DEFAULT_FORMAT)
    try:
        text = format(value, spec)
    except ValueError:  # an integer spec ("d") for a whole float (JSON has no int type)
        text = format(int(value), spec) if float(value).is_integer() else format(value, ".4g")
    return _with_unit(text, figure.get("unit", ""))


def format_goal(figure: Mapping[str, Any]) -> str:
    """``<= 1.05`` (in the figure's format and unit), ``-`` without a goal."""
    goal = figure.get("goal")
    if goal is None:
        return "-"
    return f"{goal['op']} {format_value(float(goal['target']), figure)}"


def format_met(figure: Mapping[str, Any]) -> str:
    """``✓``, ``✗``, ``n/a`` (no value) or ``-`` (no goal)."""
    if figure.get("goal") is None:
        return "-"
    met = goal_met(figure.get("value"), figure["goal"])
    return "n/a" if met is None else ("✓" if met else "✗")


def format_missed_by(figure: Mapping[str, Any]) -> str:
    """``0.030 (+2.9% vs goal)`` for a missed goal, empty otherwise."""
    miss = missed_by(figure.get("value"), figure.get("goal"))
    if miss is None:
        return ""
    absolute = format_value(miss.absolute, figure)
    if miss.relative is None:
        return absolute
    return f"{absolute} ({miss.relative:+.1%} vs goal)"


def render_summary(sections: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines: one row per figure with a goal, across all sections."""
    rows = []
    met_count = total = 0
    for section in sections:
        for figure in section.get("figures", []):
            if figure.get("goal") is None:
                continue
            total += 1
            met_count += goal_met(figure.get("value"), figure["goal"]) is True
            rows.append(
                [
                    f"[{section['section']}](#{section['section']})",
                    figure["label"],
                    format_value(figure.get("value"), figure),
                    format_goal(figure),
                    format_met(figure),
                    format_missed_by(figure),
                ]
            )
    if not rows:
        return ["No figure with a goal was measured."]
    lines = [f"{met_count} of {total} goals met.", ""]
    lines.extend(_table(["section", "figure", "value", "goal", "met", "missed by"], rows))
    return lines


def render_section(section: Mapping[str, Any]) -> list[str]:
    """Markdown lines of one section: title, setting, figures, tables, plots, notes."""
    name = section["section"]
    lines = [f'<a id="{name}"></a>', "", f"## {section['title']}", ""]
    if section.get("setting"):
        lines += [section["setting"], ""]
    figures = section.get("figures", [])
    if figures:
        rows = [
            [
                f["label"],
                format_value(f.get("value"), f),
                format_goal(f),
                format_met(f),
                format_missed_by(f),
                f.get("note", ""),
            ]
            for f in figures
        ]
        lines += _table(["figure", "value", "goal", "met", "missed by", "note"], rows)
        lines.append("")
    for table in section.get("tables", []):
        if table.get("title"):
            lines += [f"**{table['title']}**", ""]
        lines += _table(table["columns"], table.get("rows", []))
        lines.append("")
    for plot in section.get("plots", []):
        lines += [f"![{plot}]({plot})", ""]
    notes = section.get("notes", [])
    if notes:
        lines += [f"- {note}" for note in notes]
        lines.append("")
    return lines


def render_report(sections: Sequence[Mapping[str, Any]], *, header: Sequence[str] = ()) -> str:
    """The whole ``REPORT.md``: title, ``header`` lines, summary, then every section."""
    lines = ["# Benchmark report", ""]
    if header:
        lines += [*header, ""]
    lines += ["## Goals", ""]
    lines += render_summary(sections)
    lines.append("")
    for section in order_sections([dict(s) for s in sections]):
        lines += render_section(section)
    return "\n".join(lines).rstrip() + "\n"


def read_header(path: Path) -> list[str]:
    """The header of an existing report: its lines between the title and ``## Goals``
    (empty when there is no such file)."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("# "):
        return []
    end = next((k for k, line in enumerate(lines) if line.strip() == "## Goals"), len(lines))
    header = lines[1:end]
    while header and not header[0].strip():
        header.pop(0)
    while header and not header[-1].strip():
        header.pop()
    return header


def write_report(folder: Path, *, header: Sequence[str] = ()) -> Path:
    """Validate every section in ``folder`` and write ``folder/REPORT.md``."""
    sections = load_sections(folder)
    path = folder / REPORT_NAME
    path.write_text(render_report(sections, header=header))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``REPORT.md`` from the section JSON files; exit 2 on a malformed one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder of the section JSON files (default: benchmarks/results)",
    )
    parser.add_argument(
        "--header",
        type=Path,
        default=None,
        help="markdown file whose lines head the report (default: keep the existing "
        "REPORT.md's header)",
    )
    args = parser.parse_args(argv)
    if args.header is not None:
        header = args.header.read_text().strip("\n").splitlines()
    else:
        header = read_header(args.results / REPORT_NAME)
    try:
        path = write_report(args.results, header=header)
    except SectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
