"""The package as a user installs it: a wheel built from this checkout, in a fresh venv.

Offline: the wheel is built without build isolation (setuptools is in the test extra) and
installed with ``--no-deps --no-index``; only then does the venv see this environment's
packages (a ``.pth`` line), for rbzarr's dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(240)


def run(*args: object) -> subprocess.CompletedProcess[str]:
    """Run a command outside this checkout (``python -c`` would import it from the cwd)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [str(a) for a in args], cwd="/", env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding only rbzarr's wheel, its dependencies reached from this environment."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy: building writes build/ and *.egg-info beside it
    shutil.copytree(
        ROOT / "rbzarr", source / "rbzarr", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", work / "dist", source)
    (wheel,) = (work / "dist").glob("rbzarr-*.whl")
    env = work / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    run(*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout
    (Path(site.strip()) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env


def test_the_wheel_installs_a_package_that_imports(installed: Path) -> None:
    found = run(installed / "bin" / "python", "-c", "import rbzarr; print(rbzarr.__file__)")
    assert Path(found.stdout.strip()).is_relative_to(installed)
    checked = "import rbzarr; rbzarr.TrajectoryReplayBuffer(); print(rbzarr.__version__)"
    assert run(installed / "bin" / "python", "-c", checked).stdout.strip() == "0.1.0"


def test_the_wheels_command_runs(installed: Path) -> None:
    result = run(installed / "bin" / "rbzarr", "demo", "--help")
    assert result.stdout.startswith("Usage: rbzarr demo [OPTIONS]")
    assert run(installed / "bin" / "rbzarr", "--version").stdout.startswith("rbzarr, version 0.1.0")
