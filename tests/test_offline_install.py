"""docs/install.md's offline install (issue 38): an app whose dependency comes from a local
folder of wheels, a flat ``file://`` index in ``[tool.uv.index]``, installs with ``uv sync
--offline`` (what ``flwr run`` does for the app, without any network). Skipped where uv is
not installed."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

UV = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel of ``name`` (one module saying its version)."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    rows.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(rows) + "\n"
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.mark.skipif(UV is None, reason="uv is not installed (Flower's flwr run brings it)")
def test_an_apps_dependency_installs_from_a_local_wheel_folder_offline(tmp_path: Path) -> None:
    # Prepare: the docs' flat index in the app's pyproject.toml, the wheel in the folder
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "lbbsp_probe", "0.1.0")
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(
        "[project]\n"
        'name = "my-app"\n'
        'version = "1.0.0"\n'
        f'requires-python = ">={sys.version_info.major}.{sys.version_info.minor}"\n'
        'dependencies = ["lbbsp_probe==0.1.0"]\n\n'
        "[tool.uv]\n"
        "package = false\n\n"
        "[[tool.uv.index]]\n"
        'name = "local"\n'
        f'url = "{wheels.as_uri()}"\n'
        'format = "flat"\n'
        "explicit = true\n\n"
        "[tool.uv.sources]\n"
        'lbbsp_probe = { index = "local" }\n'
    )
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(tmp_path / "cache"),
        "UV_PYTHON": sys.executable,
        "UV_PYTHON_DOWNLOADS": "never",
    }

    # Execute: no network at all
    assert UV is not None
    done = subprocess.run(
        [UV, "sync", "--offline", "--no-progress"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    # Assert: installed from the folder, importable in the app's environment
    assert done.returncode == 0, done.stderr
    python = app / ".venv" / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import lbbsp_probe; print(lbbsp_probe.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.stdout.strip() == "0.1.0", probe.stderr
