"""RLinf itself as the tests' oracle: its real classes, and helpers to feed and compare them.

``rlinf==0.3.0`` is installed without its dependency tree (``scripts/dev.sh``). Its modules
take their logger from ``rlinf.utils.logging.get_logger``, which imports RLinf's Ray
scheduler; the tests hand it a plain :mod:`logging` logger instead, before importing any
RLinf module that calls it (``embodied_buffer_dataset`` does at import).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from pathlib import Path
from typing import Any

import rlinf.utils.logging
import torch
from conftest import make_trajectory

from rbzarr import Trajectory


def plain_logger() -> logging.Logger:
    """RLinf's logger without RLinf's scheduler (and Ray); quiet below errors."""
    logger = logging.getLogger("rlinf")
    logger.setLevel(logging.ERROR)  # RLinf warns on every auto_save=False construction
    return logger


rlinf.utils.logging.get_logger = plain_logger

from rlinf.data.embodied_buffer_dataset import (  # noqa: E402
    PreloadReplayBufferDataset as RLinfPreloadDataset,
)
from rlinf.data.embodied_buffer_dataset import (  # noqa: E402
    ReplayBufferDataset as RLinfDataset,
)
from rlinf.data.embodied_buffer_dataset import (  # noqa: E402
    replay_buffer_collate_fn as rlinf_collate_fn,
)
from rlinf.data.embodied_io_struct import Trajectory as RLinfTrajectory  # noqa: E402
from rlinf.data.replay_buffer import TrajectoryCache as RLinfTrajectoryCache  # noqa: E402
from rlinf.data.replay_buffer import TrajectoryReplayBuffer as RLinfBuffer  # noqa: E402

__all__ = [
    "RLinfBuffer",
    "RLinfDataset",
    "RLinfPreloadDataset",
    "RLinfTrajectory",
    "RLinfTrajectoryCache",
    "assert_batches_equal",
    "expected_numbers",
    "make_rlinf_trajectory",
    "rlinf_collate_fn",
    "rlinf_copy",
    "rlinf_window",
    "wait_for_rlinf_files",
]


def rlinf_copy(traj: Trajectory) -> RLinfTrajectory:
    """The same trajectory as RLinf's own ``Trajectory`` (sharing its tensors)."""
    return RLinfTrajectory(**{f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)})


def make_rlinf_trajectory(T: int, B: int, base: int, epochs: int = 1) -> RLinfTrajectory:
    """:func:`conftest.make_trajectory` (rows encode ``base + i``) as RLinf's object."""
    return rlinf_copy(make_trajectory(T, B, base, epochs))


def rlinf_window(window: int, count: int) -> int:
    """RLinf's ``sample_window_size`` without auto_save for our ``window`` over ``count`` adds.

    Our 0 means "all" (a fix); RLinf's cache of size 0 divides by zero, and a window as wide
    as the buffer draws the same.
    """
    return window if window > 0 else max(count, 1)


def expected_numbers(
    seed: int, sizes: list[tuple[int, int]], window: int, calls: list[int]
) -> list[torch.Tensor]:
    """The numbers RLinf's buffer draws per call after ``make_trajectory`` adds of ``sizes``."""
    buffer = RLinfBuffer(seed=seed, sample_window_size=rlinf_window(window, len(sizes)))
    base = 0
    for T, B in sizes:
        buffer.add_trajectories([make_rlinf_trajectory(T, B, base)])
        base += T * B
    numbers = [buffer.sample(n)["prev_logprobs"].to(torch.int64) for n in calls]
    buffer.close()
    return numbers


def wait_for_rlinf_files(buffer: RLinfBuffer, timeout: float = 60.0) -> None:
    """Wait until RLinf's background saves of every listed trajectory have finished.

    RLinf writes its files on a thread pool and offers no flush; a file that loads is
    complete (``torch.save`` / ``pickle`` write it in one piece, the tail last).
    """
    folder = Path(buffer.auto_save_path)
    suffix = ".pt" if buffer.trajectory_format == "pt" else ".pkl"
    deadline = time.monotonic() + timeout
    for trajectory_id in buffer._trajectory_id_list:
        weights = buffer._trajectory_index[trajectory_id]["model_weights_id"]
        path = folder / f"trajectory_{trajectory_id}_{weights}{suffix}"
        while not _loads(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"RLinf never finished writing {path}")
            time.sleep(0.01)


def _loads(path: Path) -> bool:
    """Whether ``path`` holds a complete RLinf trajectory file."""
    try:
        if path.suffix == ".pt":
            torch.load(path, map_location="cpu")
        else:
            with path.open("rb") as f:
                pickle.load(f)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError):
        return False
    return True


def assert_batches_equal(got: dict[str, Any], want: dict[str, Any], where: str = "") -> None:
    """The same keys in the same order, and every tensor of the same dtype, shape and values."""
    assert list(got) == list(want), where
    for key, value in want.items():
        name = f"{where}/{key}" if where else key
        if isinstance(value, dict):
            assert_batches_equal(got[key], value, name)
        else:
            assert isinstance(got[key], torch.Tensor), name
            assert got[key].dtype == value.dtype, name
            assert got[key].shape == value.shape, name
            assert torch.equal(got[key], value), name
