"""A writer process of the many-writers tests: appends to one shared store until done.

``write(store, options, writer, count, report)`` adds ``count`` trajectories one by one,
flushing after each and appending ``"<id> <model_weights_id>"`` to ``report`` once it is
committed.  Trajectory ``k`` of writer ``w`` is :func:`expected` (its content names both).
"""

from __future__ import annotations

import os
from typing import Any

from conftest import make_trajectory

from rbzarr import Trajectory, TrajectoryReplayBuffer


def expected(writer: int, k: int) -> Trajectory:
    """What writer ``writer`` adds as its ``k``-th trajectory."""
    return make_trajectory(2, 3, base=1000 * (100 * writer + k), mwid=f"w{writer}k{k}")


def write(store: str, options: dict[str, Any], writer: int, count: int, report: str) -> None:
    """Append ``count`` trajectories to ``store``, reporting each once it is committed."""
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, storage_options=options, cache_size=1
    )
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for k in range(count):
        buffer.add_trajectories([expected(writer, k)])
        buffer.flush()
        trajectory_id = buffer.trajectory_ids[-1]
        os.write(fd, f"{trajectory_id} w{writer}k{k}\n".encode())
    os.close(fd)
    buffer.close()
