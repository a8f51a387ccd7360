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


@pytest.mark.s3
def test_trying_s3_locally_works_as_documented(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "s3.md").read_text()
    section = text.split("## Try it on S3 locally", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    script = block.group(1).replace("5555", str(_free_port()))
    script = script.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "torch.Size([4, 1])" in done.stdout
    assert "trajectories=1  samples=16" in done.stdout
