"""The project as a library: the sdist and wheel that ``python -m build`` makes from this
checkout, ``fl_lbbsp.__version__`` and the PEP 561 marker a Flower app's type checker reads.

The build runs without build isolation (offline), on a copy of the files the sdist is made of,
so it leaves nothing in the shared checkout.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest

import fl_lbbsp

ROOT = Path(__file__).resolve().parents[1]
# What the sdist is made of: pyproject.toml, MANIFEST.in and the files they name.
SOURCES = (
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "constraints.txt",
    "constraints-flwr141.txt",
    "fl_lbbsp",
)


@dataclass(frozen=True)
class Dist:
    """The built distributions and the wheel's contents."""

    sdist: Path
    wheel: Path
    names: frozenset[str]
    metadata: Message


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """Build the sdist and, from it, the wheel (what ``python -m build`` does)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = frozenset(zf.namelist())
        (meta,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(meta).decode("utf-8"))
    return Dist(sdist=sdist, wheel=wheel, names=names, metadata=metadata)


def test_wheel_holds_every_module_and_the_typed_marker(dist: Dist) -> None:
    # Prepare: every module of the checkout's package, subpackages included
    modules = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "fl_lbbsp").rglob("*.py")
        if "__pycache__" not in path.parts
    }

    # Execute
    packaged = {n for n in dist.names if n.startswith("fl_lbbsp/")}

    # Assert: the same modules plus py.typed, and nothing beside the package and its metadata
    assert packaged == modules | {"fl_lbbsp/py.typed"}
    assert all(n.startswith(("fl_lbbsp/", "fl_lbbsp-")) for n in dist.names)


def test_wheel_metadata_names_version_license_and_command(dist: Dist) -> None:
    # Prepare
    version = dist.metadata["Version"]
    info = f"fl_lbbsp-{version}.dist-info"

    # Execute
    with zipfile.ZipFile(dist.wheel) as zf:
        license_text = zf.read(f"{info}/licenses/LICENSE").decode("utf-8")
        entry_points = zf.read(f"{info}/entry_points.txt").decode("utf-8")

    # Assert: the installed package reports the version it is built as
    assert fl_lbbsp.__version__ == version
    assert dist.wheel.name == f"fl_lbbsp-{version}-py3-none-any.whl"
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in dist.metadata.get_all("Classifier", [])
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "fl-lbbsp = fl_lbbsp.cli:main" in entry_points


def test_sdist_holds_license_changelog_readme_and_constraints(dist: Dist) -> None:
    # Prepare
    top = dist.sdist.name.removesuffix(".tar.gz")

    # Execute
    with tarfile.open(dist.sdist) as tf:
        names = {n.removeprefix(f"{top}/") for n in tf.getnames()}

    # Assert
    assert {
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        "pyproject.toml",
        "constraints.txt",
        "constraints-flwr141.txt",
        "fl_lbbsp/py.typed",
        "fl_lbbsp/__init__.py",
    } <= names


@pytest.mark.parametrize(
    ("with_metadata", "expected"),
    [(True, "from-wheel"), (False, "0+unknown")],
    ids=["installed", "bare-source-tree"],
)
def test_version_comes_from_the_distribution_metadata(
    dist: Dist, tmp_path: Path, with_metadata: bool, expected: str
) -> None:
    # Prepare: the package beside its wheel's metadata, or alone, on an interpreter that
    # sees no site-packages (-S) and no environment (-I)
    with zipfile.ZipFile(dist.wheel) as zf:
        members = [
            n
            for n in zf.namelist()
            if n == "fl_lbbsp/__init__.py" or (with_metadata and ".dist-info/" in n)
        ]
        zf.extractall(tmp_path, members=members)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import fl_lbbsp; "
    code += "print(fl_lbbsp.__version__)"

    # Execute
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    # Assert
    want = dist.metadata["Version"] if expected == "from-wheel" else expected
    assert done.stdout.strip() == want


@pytest.mark.parametrize(
    ("typed", "revealed"),
    [(True, "str"), (False, "Any")],
    ids=["with-py.typed", "without-py.typed"],
)
def test_a_type_checker_in_a_users_app_reads_the_package_as_typed(
    dist: Dist, tmp_path: Path, typed: bool, revealed: str
) -> None:
    # Prepare: the wheel unpacked where the app's interpreter finds installed packages
    # (mypy searches its sys.path, PYTHONPATH included, for PEP 561 packages); without the
    # marker the same app must fail, so the first case passes because of py.typed
    site = tmp_path / "site"
    with zipfile.ZipFile(dist.wheel) as zf:
        zf.extractall(site)
    if not typed:
        (site / "fl_lbbsp" / "py.typed").unlink()
    app = tmp_path / "app"
    app.mkdir()
    (app / "use_it.py").write_text(
        "from fl_lbbsp import __version__\n\nreveal_type(__version__)\n", encoding="utf-8"
    )
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "use_it.py"]
    command += ["--cache-dir", str(tmp_path / "cache")]

    # Execute
    done = subprocess.run(
        command,
        cwd=app,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    # Assert
    assert re.search(rf'Revealed type is "(builtins\.)?{revealed}"', done.stdout), done.stdout
    assert ("import-untyped" in done.stdout) is not typed, done.stdout + done.stderr
