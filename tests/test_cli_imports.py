"""The command line answers at once: help and the reading commands never import torch.

``info``, ``ls``, ``show``, ``report``, ``plot``, ``verify`` and ``stats`` of a zarr store read
it into numpy.

Each case runs in a fresh interpreter (this one has torch loaded already) and reports the
first command whose run left ``torch`` in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.stats import compute_stats
from rbzarr.analysis.view import open_buffer
from rbzarr.cli.main import COMMANDS
from rbzarr.trajectory.model import Trajectory

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


def _camera_store(path: Path) -> str:
    """A small RLinf-shaped zarr store: two cameras and a state in curr_obs and next_obs,
    rewards, dones and a bfloat16 field (held in numpy as its bits)."""
    g = torch.Generator().manual_seed(0)
    T, B = 6, 2
    frames = torch.randint(0, 256, (T, B, 16, 16, 3), dtype=torch.uint8, generator=g)
    observations = {"main": frames, "wrist": frames.flip(2).clone(), "state": torch.randn(T, B, 3)}
    trajectories = [
        Trajectory(
            max_episode_length=T,
            rewards=torch.randn(T, B, generator=g),
            dones=torch.rand(T, B, generator=g) < 0.4,
            prev_values=torch.randn(T, B, generator=g).to(torch.bfloat16),
            curr_obs=observations,
            next_obs=observations,
        )
        for _ in range(2)
    ]
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as buffer:
        buffer.add_trajectories(trajectories)
    return str(path)


def test_show_of_a_zarr_store_imports_no_torch(tmp_path: Path) -> None:
    store = _camera_store(tmp_path / "store")
    runs = [
        ["show", store, "1", "--env", "1", "-o", str(tmp_path / "column.gif")],
        ["show", store, "0", "-o", str(tmp_path / "column.mp4")],
        ["show", store, "--episode", "0", "-o", str(tmp_path / "episode.png")],
    ]
    assert first_importing_torch(runs) == "none"
    for name in ("column.gif", "column.mp4", "episode.png"):
        assert (tmp_path / name).stat().st_size, name


def test_verify_of_a_zarr_store_imports_no_torch(tmp_path: Path) -> None:
    store = _camera_store(tmp_path / "store")
    assert first_importing_torch([["verify", store], ["verify", "--json", store]]) == "none"


def test_stats_of_a_zarr_store_imports_no_torch(tmp_path: Path) -> None:
    store = _camera_store(tmp_path / "store")
    runs = [["stats", store], ["stats", "--json", "--keys", "rewards,prev_values", store]]
    assert first_importing_torch(runs) == "none"


def test_report_and_plot_of_a_zarr_store_import_no_torch(tmp_path: Path) -> None:
    store = _camera_store(tmp_path / "store")
    page, figure = tmp_path / "report.html", tmp_path / "plot.png"
    runs = [["report", store, "-o", str(page)], ["plot", store, "-o", str(figure)]]
    assert first_importing_torch(runs) == "none"
    assert page.stat().st_size and figure.stat().st_size


def test_stats_read_into_numpy_equal_the_tensors(tmp_path: Path) -> None:
    """The torch-free statistics are those of the stored tensors (bfloat16 by value)."""
    store = _camera_store(tmp_path / "store")
    report = compute_stats(store, keys=["prev_values", "curr_obs/main"], decode_images=True)
    view = open_buffer(store)
    for key in ("prev_values", "curr_obs/main"):
        values = torch.cat([view.trajectory(i, [key]).tensors()[key] for i in view.ids])
        got = report["keys"][key]
        assert got["count"] == values.numel()
        assert got["mean"] == pytest.approx(float(values.double().mean()), rel=1e-12)
        assert (got["min"], got["max"]) == (float(values.min()), float(values.max()))
