"""Run every benchmark section, then write the report (``make bench``).

Each section is its own script, run in a fresh process from the repository root (so its
timings do not share a process with the others): ``bench_setup.py`` (``make demo``'s run),
``bench_fl.py`` (sections ``fl`` and
``dynamics``), ``bench_noise.py`` (section ``noise``), ``bench_budget.py`` (section
``budget``), ``accuracy_study.py`` (section ``accuracy-budget``), ``budget_tradeoff.py`` (section
``budget-tradeoff``, on the study's cached runs), ``bench_predictors.py``,
``bench_cluster.py``, ``bench_ddp.py``, ``bench_overhead.py``, ``bench_he.py``,
``bench_wallclock.py``, ``bench_plugin.py``, ``bench_robustness.py`` (section
``robustness``). A missing script is skipped with a message; a
failing one is reported and the others still run. A run of every section first removes
every section file of the folder, so that ``REPORT.md`` holds that one run and nothing
older. Finally ``report.py`` validates every section JSON in the folder and writes
``REPORT.md`` under one header: the machine, the commit, the load average at the start and
the end, and each section's wall time.

Run: ``python benchmarks/run_all.py [--smoke] [--out DIR] [--sections fl,cluster]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from common import ROOT, machine, parser
from report import SectionError, write_report

HERE = Path(__file__).resolve().parent

# name -> (script, the section files it writes)
SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "setup": ("bench_setup.py", ("setup",)),
    "fl": ("bench_fl.py", ("fl", "dynamics")),
    "noise": ("bench_noise.py", ("noise",)),
    "budget": ("bench_budget.py", ("budget",)),
    # The accuracy study (to FedAvg's plateau, 8 seeds, 2 datasets) supersedes
    # bench_accuracy.py's short LeNet-5 section, which stays runnable on its own.
    "accuracy": ("accuracy_study.py", ("accuracy-budget",)),
    "tradeoff": ("budget_tradeoff.py", ("budget-tradeoff",)),
    "predictors": ("bench_predictors.py", ("predictors",)),
    "cluster": ("bench_cluster.py", ("cluster",)),
    "ddp": ("bench_ddp.py", ("ddp",)),
    "overhead": ("bench_overhead.py", ("overhead",)),
    "he": ("bench_he.py", ("he",)),
    "wallclock": ("bench_wallclock.py", ("wallclock",)),
    "plugin": ("bench_plugin.py", ("plugin",)),
    "robustness": ("bench_robustness.py", ("robustness",)),
}


SHARED_RUNS = frozenset({"accuracy", "tradeoff"})
"""Sections that share one run cache (``--cache``, a folder of this run): the trade-off
reuses the study's FedAvg and default-budget runs of the same commit."""


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (out.stdout.strip() or "unknown") + (" with local changes" if dirty else "")


def clear_sections(out: Path) -> list[str]:
    """Remove every section JSON of ``out`` (a file with a ``section`` key); return their
    names."""
    removed = []
    for path in sorted(out.glob("*.json")):
        try:
            is_section = "section" in json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_section:
            path.unlink()
            removed.append(path.name)
    return removed


def section_names(out: Path) -> list[str]:
    """The ids of the section JSONs in ``out``."""
    names = []
    for path in sorted(out.glob("*.json")):
        try:
            section = json.loads(path.read_text()).get("section")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(section, str):
            names.append(section)
    return names


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def run_section(
    name: str, out: Path, *, smoke: bool, timeout: float | None, runs: Path | None = None
) -> tuple[str, float]:
    """Run one section's script; return its outcome (``ok``, ``skipped: ...``,
    ``failed: ...``) and its wall time. ``runs``: the run cache of this ``run_all`` run,
    given to the sections of :data:`SHARED_RUNS`."""
    script, files = SECTIONS[name]
    path = HERE / script
    if not path.is_file():
        return f"skipped: {script} not found", 0.0
    for stem in files:  # no stale result survives a failed run
        (out / f"{stem}.json").unlink(missing_ok=True)
    env = dict(os.environ)
    # The scripts import fl_lbbsp from this checkout, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(path), "--out", str(out), *(["--smoke"] if smoke else [])]
    if runs is not None and name in SHARED_RUNS:
        command += ["--cache", str(runs)]
    print(f"=== {name}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    try:
        code = subprocess.run(command, cwd=ROOT, env=env, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        return f"failed: timed out after {timeout:.0f} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if code != 0:
        return f"failed: exit code {code}", seconds
    if not all((out / f"{stem}.json").is_file() for stem in files):
        return "ok (wrote no section: see its output)", seconds
    return "ok", seconds


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sections, print their wall times, write ``REPORT.md``."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all)",
    )
    cli.add_argument(
        "--timeout", type=float, default=None, help="seconds per section (default: none)"
    )
    args = cli.parse_args(argv)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        print(f"unknown sections {unknown}; expected some of {list(SECTIONS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if set(names) == set(SECTIONS):
        removed = clear_sections(args.out)
        if removed:
            print(f"removed the earlier sections {', '.join(removed)}", flush=True)
    outcomes: dict[str, tuple[str, float]] = {}
    load_start, commit = _load(), _commit()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fl-lbbsp-runs-") as runs:
        for name in names:
            outcomes[name] = run_section(
                name, args.out, smoke=args.smoke, timeout=args.timeout, runs=Path(runs)
            )
            print(f"=== {name}: {outcomes[name][0]} ({_minutes(outcomes[name][1])})", flush=True)
    total = time.perf_counter() - started
    kind = "Smoke run" if args.smoke else "One `make bench` run"
    if set(names) != set(SECTIONS):
        kind += f" of the sections {', '.join(names)}"
    lines = [
        f"{kind} of commit {commit} on {machine()}, {_minutes(total)} in all; load average "
        f"{load_start} at the start, {_load()} at the end. Each section's setting line says "
        "what was emulated."
    ]
    ran = {stem for name in names for stem in SECTIONS[name][1]}
    kept = sorted(set(section_names(args.out)) - ran)
    if kept:
        lines.append(
            f"Sections kept from earlier runs (their setting lines say how they ran): "
            f"{', '.join(kept)}."
        )
    lines += [
        f"- {name}: {outcome} ({_minutes(seconds)})"
        for name, (outcome, seconds) in outcomes.items()
    ]
    print("\n".join(lines))
    try:
        path = write_report(args.out, header=lines)
    except SectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 1 if any(o.startswith("failed") for o, _ in outcomes.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
