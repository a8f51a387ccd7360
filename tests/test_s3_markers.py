"""A test that starts moto without the ``s3`` marker stops collection (s3_fixtures.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def collect(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only -m "not s3"`` of one test file using the project's config."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(source))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not s3"]
    options = [
        "-p",
        "no:cacheprovider",
        "-p",
        "s3_fixtures",
        "-c",
        str(TESTS.parent / "pyproject.toml"),
    ]
    return subprocess.run(
        [*command, *options, str(tmp_path / "test_probe.py")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(240)
def test_an_unmarked_s3_test_stops_collection_and_a_marked_one_is_deselected(tmp_path):
    unmarked = collect(tmp_path, "def test_uses_s3(s3_bucket):\n    pass\n")
    assert unmarked.returncode == pytest.ExitCode.USAGE_ERROR, unmarked.stdout + unmarked.stderr
    assert "lack @pytest.mark.s3: " in unmarked.stderr
    assert "::test_uses_s3" in unmarked.stderr
    marked = collect(
        tmp_path,
        """
        import pytest

        @pytest.mark.s3
        def test_uses_s3(s3_bucket):
            pass
        """,
    )
    assert marked.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, marked.stdout + marked.stderr
    assert "1 deselected" in marked.stdout
