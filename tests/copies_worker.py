"""Counts the copies of the frames an auto-saved trajectory makes on its way to storage.

Run as ``python copies_worker.py URL[,LOCAL_CACHE_DIR] ...`` in a process started with a fixed
``MALLOC_MMAP_THRESHOLD_`` (glibc then maps every large buffer afresh and unmaps it when
freed, so each one lives in the resident set exactly while it exists): it adds one
trajectory of large raw frames to each store, flushes, and prints (a line per store) how
many times the frames' size the resident high-water mark grew meanwhile.  Every copy
counts, whoever allocates it (torch, numpy, Python), the copy a memory filesystem keeps as
the stored object included.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.trajectory.staging import release_idle

T, B, SIDE = 4, 2, 416


def frames_trajectory(seed: int) -> Trajectory:
    """Two raw frame keys of ``T x B`` random 416 px frames (8.3 MB) and small fields."""
    g = torch.Generator().manual_seed(seed)
    shape = (T, B, SIDE, SIDE, 3)
    return Trajectory(
        max_episode_length=T,
        rewards=torch.randn(T, B, generator=g),
        dones=torch.zeros(T, B, dtype=torch.bool),
        curr_obs={"image": torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)},
        next_obs={"image": torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)},
    )


def _status(name: str) -> int:
    """A ``/proc/self/status`` figure, in bytes."""
    text = Path("/proc/self/status").read_text()
    return 1024 * int(re.search(rf"{name}:\s+(\d+) kB", text).group(1))  # type: ignore[union-attr]


def copies(url: str, local_cache_dir: str | None = None) -> float:
    """The resident high-water mark's growth over one add and flush, in frame sizes."""
    with TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        local_cache_dir=local_cache_dir,
        enable_cache=False,
        layout_options={"codecs": {"default": "raw"}},
    ) as buffer:
        buffer.add_trajectories([frames_trajectory(0)])  # plans, documents, parents, threads
        buffer.flush()
        trajectory = frames_trajectory(1)
        size = sum(v.numel() * v.element_size() for v in trajectory.tensors().values())
        # The first add's staging memory would be reused, its copy not seen: unmapped first.
        release_idle()
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark := resident now
        before = _status("VmRSS")
        buffer.add_trajectories([trajectory])
        buffer.flush()
        return (_status("VmHWM") - before) / size


if __name__ == "__main__":
    for store in sys.argv[1:]:
        print(copies(*store.split(",")))
