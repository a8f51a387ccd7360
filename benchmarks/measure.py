"""Timing, byte sizes and the run's context (machine, versions).

rows/s is ``rows / median latency`` (robust on a shared machine); ``rows_s_mean`` beside it.
A figure compared with a peer's is timed :func:`interleaved` with it.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numcodecs
import numpy as np
import torch
import zarr

import rbzarr
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, trajectory_from_raw, validate

__all__ = [
    "add_all",
    "add_latency",
    "clone_trajectory",
    "interleaved",
    "machine",
    "nbytes",
    "row_bytes",
    "stats",
    "timed",
    "versions",
]


def timed(fn: Callable[[], object], calls: int, budget_s: float) -> list[float]:
    """Latencies of ``fn`` after one warm-up call."""
    fn()
    latencies: list[float] = []
    spent = 0.0
    while len(latencies) < calls and (len(latencies) < 3 or spent < budget_s):
        start = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - start)
        spent += latencies[-1]
    return latencies


def interleaved(
    fns: Sequence[Callable[[], object]], calls: int, budget_s: float, rounds: int = 10
) -> list[list[float]]:
    """Latencies of each of ``fns``, timed in ``rounds`` interleaved rounds after one warm-up
    call of each.

    A round calls each function ``calls / rounds`` times in a row (a block keeps its own
    caches warm, as repeated calls do), in reverse order every other round (ABBA...), so that
    all of them see the same load of a shared machine and a slow spell does not land on one
    side only.  Rounds stop after ``calls`` calls each, or after 3 rounds once the first
    function has spent ``budget_s``.
    """
    for fn in fns:
        fn()
    block = max(1, calls // rounds)
    latencies: list[list[float]] = [[] for _ in fns]
    done = 0
    while len(latencies[0]) < calls and (done < 3 or sum(latencies[0]) < budget_s):
        order = range(len(fns)) if done % 2 == 0 else range(len(fns) - 1, -1, -1)
        for i in order:
            for _ in range(min(block, calls - len(latencies[i]))):
                start = time.perf_counter()
                fns[i]()
                latencies[i].append(time.perf_counter() - start)
        done += 1
    return latencies


def stats(latencies: Sequence[float], rows: int, bytes_per_row: int) -> dict[str, float]:
    """Throughput from the median call (the mean, the slowest and the fastest call beside it),
    latency percentiles."""
    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    rows_s = rows / p50
    return {
        "calls": len(ordered),
        "rows_s": rows_s,
        "rows_s_mean": rows * len(ordered) / sum(ordered),
        "rows_s_min": rows / ordered[-1],
        "rows_s_max": rows / ordered[0],
        "mb_s": rows_s * bytes_per_row / 1e6,
        "p50_ms": 1e3 * p50,
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
    }


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    """Total bytes of ``tensors``."""
    return sum(t.numel() * t.element_size() for t in tensors)


def row_bytes(trajectory: Trajectory) -> int:
    """Bytes of one sampled (flat) row of ``trajectory``."""
    flat = flatten_trajectory(trajectory, validate(trajectory))
    return sum(t[0].numel() * t.element_size() for t in flat.values())


def clone_trajectory(trajectory: Trajectory) -> Trajectory:
    """A copy of ``trajectory`` that shares no tensor memory with it."""
    fields = {key: value.clone() for key, value in trajectory.tensors().items()}
    return trajectory_from_raw(fields, trajectory.max_episode_length, trajectory.model_weights_id)


def add_all(
    buffer: TrajectoryReplayBuffer, trajectories: Sequence[Trajectory]
) -> tuple[list[float], list[float]]:
    """Seconds of each ``add_trajectories`` call (one trajectory per call), and of a clone
    of the same trajectory made just before it: paired, the two meet the same writer
    thread and the same memory (each clone is kept until every add returned, as the write
    queue keeps its copies; fresh pages cost far more than the copy on a VM that hands
    freed memory back to its host, and recycled ones do not)."""
    adds, copies, kept = [], [], []
    for trajectory in trajectories:
        start = time.perf_counter()
        kept.append([value.clone() for value in trajectory.tensors().values()])
        copies.append(time.perf_counter() - start)
        start = time.perf_counter()
        buffer.add_trajectories([trajectory])
        adds.append(time.perf_counter() - start)
    return adds, copies


def add_latency(adds: Sequence[float], copies: Sequence[float]) -> dict[str, float]:
    """p50/p99 of the ``adds`` against the paired clones (seconds, from :func:`add_all`)."""
    add_p50, copy_p50 = statistics.median(adds), statistics.median(copies)
    return {
        "add_p50_ms": 1e3 * add_p50,
        "add_p99_ms": 1e3 * sorted(adds)[math.ceil(0.99 * len(adds)) - 1],
        "memcpy_p50_ms": 1e3 * copy_p50,
        "add_vs_memcpy": add_p50 / copy_p50,
    }


def machine() -> dict[str, Any]:
    """CPU count, platform, load average and torch threads of this run."""
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
    }


def versions() -> dict[str, str]:
    """Versions of Python and the libraries the figures depend on."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zarr": zarr.__version__,
        "numcodecs": numcodecs.__version__,
        "numpy": np.__version__,
        "rbzarr": rbzarr.__version__,
    }
