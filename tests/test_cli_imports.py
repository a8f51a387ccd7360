"""The command line answers at once: help and the reading commands never import torch.

Each case runs in a fresh interpreter (this one has torch loaded already) and reports the
first command whose run left ``torch`` in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]

# Runs each argument list (a JSON list of lists) in order; prints the first one after which
# torch was imported, or "none".
_PROBE = """
import json, sys
from click.testing import CliRunner
from rbzarr.cli.main import main
runner = CliRunner()
for args in json.loads(sys.argv[1]):
    result = runner.invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, (args, result.output)
    if "torch" in sys.modules:
        print(json.dumps(args))
        break
else:
    print("none")
"""


def first_importing_torch(runs: list[list[str]]) -> str:
    """The first argument list whose command imported torch, or ``"none"``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_help_of_the_group_and_of_every_command_imports_no_torch() -> None:
    runs = [["--help"], *([name, "--help"] for name in COMMANDS)]
    assert first_importing_torch(runs) == "none"


def test_info_and_ls_of_a_zarr_store_import_no_torch(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, i) for i in range(3)])
    runs = [["info", store], ["info", "--json", store], ["ls", store], ["ls", "--json", store]]
    if "checkpoints" in COMMANDS:
        runs.append(["checkpoints", store])
    assert first_importing_torch(runs) == "none"
