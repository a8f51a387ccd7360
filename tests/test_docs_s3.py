"""docs/s3.md's "Try it on S3 locally" block runs as written (on a free port)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_block(cwd: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    """Run the documented block (on a free port, with this interpreter's scripts) in
    ``cwd``, ``paths`` put before the checkout on ``PYTHONPATH``."""
    text = (ROOT / "docs" / "s3.md").read_text()
    section = text.split("## Try it on S3 locally", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    script = block.group(1).replace("5555", str(_free_port()))
    script = script.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT)])}
    return subprocess.run(
        ["bash", "-e", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=180,
        check=False,
    )


def test_trying_s3_locally_without_moto_says_what_to_install(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "moto").mkdir(parents=True)
    (hidden / "moto" / "__init__.py").write_text("raise ImportError('moto is not installed')\n")
    work = tmp_path / "work"
    work.mkdir()
    done = _run_block(work, hidden)
    assert done.returncode == 1 and done.stdout == ""
    pip = f"{Path(sys.executable).parent}/pip"  # .venv/bin/pip, as the test runs it
    assert done.stderr.strip() == (
        f"this needs moto's server, boto3 and s3fs: {pip} install 'rbzarr[s3,test]'"
    )
    assert list(work.iterdir()) == []  # no server started, nothing written


@pytest.mark.s3
def test_trying_s3_locally_works_as_documented(tmp_path: Path) -> None:
    done = _run_block(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([4, 1])" in done.stdout
    assert "trajectories=1  samples=16" in done.stdout
