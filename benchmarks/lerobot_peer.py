"""LeRobot as a peer: its own ``LeRobotDataset`` on a video dataset of the same frames.

LeRobot 0.6 needs Python 3.12, so :mod:`benchmarks.lerobot_reads` runs in LeRobot's own
environment (``scripts/lerobot_env.sh setup``; ``LEROBOT_ENV`` names it, ``.venv-lerobot``
by default).  Without it the figure is reported unavailable with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rbzarr.trajectory.model import Trajectory

__all__ = ["lerobot_python", "measure_lerobot"]

SCRIPT = Path(__file__).with_name("lerobot_reads.py")


def lerobot_python() -> Path | str:
    """LeRobot's interpreter, or why there is none."""
    env = Path(os.environ.get("LEROBOT_ENV", ".venv-lerobot"))
    python = env / "bin" / "python"
    if not python.exists():
        return f"no LeRobot environment at {env} (bash scripts/lerobot_env.sh setup; LEROBOT_ENV)"
    return python


def measure_lerobot(
    trajectories: Sequence[Trajectory], root: Path, reads: int, seed: int
) -> dict[str, Any]:
    """Random ``dataset[i]`` reads of a LeRobot video dataset of ``trajectories``' frames."""
    python = lerobot_python()
    if isinstance(python, str):
        return {"unavailable": python}
    root.mkdir(parents=True, exist_ok=True)
    frames = root / "frames.npz"
    if not frames.exists():
        tensors = [t.tensors() for t in trajectories]
        arrays = {
            "main": np.stack([t["curr_obs/main_images"].numpy() for t in tensors]),
            "wrist": np.stack([t["curr_obs/wrist_images"].numpy() for t in tensors]),
            "state": np.stack([t["curr_obs/states"].numpy() for t in tensors]),
            "action": np.stack([t["actions"].numpy() for t in tensors]),
        }
        np.savez(root / "frames.tmp.npz", **arrays)
        (root / "frames.tmp.npz").replace(frames)
    command = [str(python), str(SCRIPT), str(frames), str(root / "dataset"), str(reads), str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"unavailable": f"LeRobot's reads failed: {' | '.join(tail)}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["python"] = str(python)
    result["interpreter_of_this_run"] = sys.executable
    return result
