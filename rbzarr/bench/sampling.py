"""The sampling modes of one workload, each timed with :meth:`TrajectoryReplayBuffer.sample`.

* ``hot``: every trajectory in the cache (``auto_save=False``), beside the references of
  :mod:`rbzarr.bench.baselines`;
* ``cold``: ``auto_save`` to a local store with a small cache and a larger window, so most
  rows miss.  For ``zarr``, bytes read are counted by a store wrapper and compared with the
  compressed size of the chunks that hold the missed rows; ``pt`` loads each missed
  trajectory's whole file (RLinf's way).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

from zarr.storage import LocalStore

from rbzarr.bench import baselines
from rbzarr.bench.accounting import disk_usage, needed_bytes
from rbzarr.bench.measure import CountingStore, add_all, nbytes, row_bytes, stats, timed
from rbzarr.bench.workloads import Workload
from rbzarr.buffer import TrajectoryReplayBuffer
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES
from rbzarr.trajectory import Trajectory

__all__ = ["Settings", "run_cold", "run_hot", "trajectory_sequence"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much work one run does (``rbzarr bench --help`` lists the flags that set it)."""

    trajectories: int = 100
    window: int = 100
    cache: int = 5
    pool: int = 8
    hot_calls: int = 200
    cold_calls: int = 30
    budget_s: float = 6.0
    # Extra cold image runs: (chunk_bytes, compressed).  One image step is 338,688 bytes,
    # so any chunk_bytes below 677,376 gives one step per chunk.
    chunk_sweep: tuple[tuple[int, bool], ...] = ((256 * 2**10, True), (256 * 2**10, False))
    seed: int = 1234
    threads: int = 1


def trajectory_sequence(workload: Workload, settings: Settings) -> list[Trajectory]:
    """``settings.trajectories`` trajectories cycling over ``settings.pool`` distinct ones
    (the buffer copies each, so repeats cost no memory here)."""
    pool = [workload.make(settings.seed + i) for i in range(settings.pool)]
    return [pool[i % len(pool)] for i in range(settings.trajectories)]


def run_hot(workload: Workload, settings: Settings) -> dict[str, Any]:
    """Sampling with every trajectory cached, and its references."""
    trajectories = trajectory_sequence(workload, settings)
    per_row = row_bytes(trajectories[0])
    buffer = TrajectoryReplayBuffer(
        seed=settings.seed, sample_window_size=len(trajectories), auto_save=False
    )
    adds = add_all(buffer, trajectories)
    calls, budget, seed, batch = (
        settings.hot_calls,
        settings.budget_s,
        settings.seed,
        workload.batch,
    )
    latencies = timed(lambda: buffer.sample(batch), calls, budget)
    result: dict[str, Any] = {
        "row_bytes": per_row,
        "add": adds,
        "buffer": stats(latencies, batch, per_row),
    }
    buffer.close()
    rows = len(trajectories) * workload.T * workload.B
    result["limit"] = baselines.hot_limit(rows, per_row, batch, calls, budget, seed)
    result["rlinf_style"] = baselines.rlinf_hot(trajectories, batch, calls, budget, seed, per_row)
    if workload.name == "state":
        loop_calls = max(3, calls // 10)
        result["per_row_loop"] = baselines.per_row_loop(
            trajectories, batch, loop_calls, budget, seed, per_row
        )
    result["vs_limit"] = result["limit"]["rows_s"] / result["buffer"]["rows_s"]
    result["speedup_vs_rlinf_style"] = result["buffer"]["rows_s"] / result["rlinf_style"]["rows_s"]
    return result


def run_cold(
    workload: Workload,
    settings: Settings,
    trajectory_format: str,
    root: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    compressed: bool = True,
) -> dict[str, Any]:
    """Sampling through a small cache from a local store in ``root``."""
    trajectories = trajectory_sequence(workload, settings)
    per_row = row_bytes(trajectories[0])
    counting = CountingStore(LocalStore(root)) if trajectory_format == "zarr" else None
    options: dict[str, Any] = {}
    if counting is not None:
        # The counting store sees layout-1 chunk reads; layout 2 reads shards directly and
        # counts them in an IOStats passed as layout_options["io_stats"] (bench: switch).
        options = {"store": counting, "chunk_bytes": chunk_bytes, "layout_version": 1}
        if not compressed:
            options["codecs"] = {"default": None}
    buffer = TrajectoryReplayBuffer(
        seed=settings.seed,
        cache_size=settings.cache,
        sample_window_size=settings.window,
        auto_save=True,
        auto_save_path=root,
        trajectory_format=trajectory_format,
        max_pending_writes=len(trajectories) + 1,  # measure the call, not the backpressure
        layout_options=options,
    )
    raw = nbytes(v for t in trajectories for v in t.tensors().values())
    start = time.perf_counter()
    adds = add_all(buffer, trajectories)
    buffer.flush()
    write_s = time.perf_counter() - start
    result: dict[str, Any] = {
        "row_bytes": per_row,
        "add": adds,
        "write": {"raw_mb": raw / 1e6, "seconds": write_s, "mb_s": raw / 1e6 / write_s},
        "disk": disk_usage(root, trajectories, trajectory_format),
    }
    reads: list[list[tuple[str, int]]] = []

    def sample() -> None:
        if counting is not None:
            counting.reads.clear()
        buffer.sample(workload.batch)
        if counting is not None:
            reads.append(list(counting.reads))

    latencies = timed(sample, settings.cold_calls, settings.budget_s)
    buffer.close()
    result["buffer"] = stats(latencies, workload.batch, per_row)
    _account(result, root, trajectories, workload, settings, trajectory_format, len(latencies))
    if counting is not None:
        reads = reads[1:]  # drop the warm-up call, as timed() does
        result["bytes_read_per_batch"] = statistics.mean(sum(n for _, n in r) for r in reads)
        result["read_vs_needed"] = result["bytes_read_per_batch"] / result["needed_bytes_per_batch"]
        result["limit"] = baselines.cold_limit(root, reads, workload.batch, per_row)
        result["vs_limit"] = result["limit"]["rows_s"] / result["buffer"]["rows_s"]
    else:
        result["bytes_read_per_batch"] = result["needed_bytes_per_batch"]
    return result


def _account(
    result: dict[str, Any],
    root: str,
    trajectories: Sequence[Trajectory],
    workload: Workload,
    settings: Settings,
    fmt: str,
    calls: int,
) -> None:
    needed = needed_bytes(
        root,
        trajectories,
        settings.window,
        settings.cache,
        workload.batch,
        settings.seed,
        fmt,
        calls,
    )
    result["needed_bytes_per_batch"] = statistics.mean(needed)
