"""S3 with the local shard cache, against the same trajectories in a local store.

Three buffers read one store on moto behind the delaying proxy: the buffer that wrote it (with
a cache: its misses should cost no GET), a new reader with an empty cache (the cold first
batch, then the steady state and the bytes fetched over many passes of the window), and,
for the ratio, a local store of the same trajectories read warm.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.settings import Settings
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory.model import Trajectory, validate

__all__ = ["measure_cache"]

# Batches sampled after the first, for the steady rate and the bytes over many passes.
PASSES = 100


def measure_cache(
    settings: Settings,
    proxy: Any,
    path: str,
    options: dict[str, Any],
    direct: Any,
    trajectories: list[Trajectory],
    delay: float,
) -> dict[str, Any]:
    """The cache's figures for ``trajectories`` written to ``s3://<path>``."""
    window = len(trajectories)
    batch = settings.s3_batch
    url = f"s3://{path}"
    with tempfile.TemporaryDirectory(prefix="rbzarr-bench-cache-") as root:
        base = Path(root)
        proxy.slow_down(0.0)
        with _buffer(settings, window, url, options, base / "writer-cache") as writer:
            writer.add_trajectories(trajectories)
            writer.flush()
            proxy.slow_down(delay)
            proxy.reset_log()
            for _ in range(3):
                writer.sample(batch)
            own_gets = _trajectory_gets(proxy)
        data_bytes = int(direct.du(f"{path}/trajectories"))
        reader = _buffer(settings, window, url, options, base / "reader-cache")
        with reader:
            reader.load_checkpoint(url)
            proxy.reset_log()
            start = time.perf_counter()
            reader.sample(batch)
            first_s = time.perf_counter() - start
            first_requests = len(proxy.requests)
            steady = [_timed(reader, batch) for _ in range(PASSES)]
            steady_requests = len(proxy.requests) - first_requests
            fetched = proxy.bytes_to_client
        local = _local_rate(settings, window, trajectories, base / "local-store")
    rows_s = statistics.median(batch / s for s in steady)
    rows = sum(validate(t).num_samples for t in trajectories)
    return {
        "writer": {"own_miss_gets": own_gets, "batches": 3},
        "first_batch": {"seconds": first_s, "requests": first_requests},
        "steady": {
            "rows_s": rows_s,
            "requests_per_batch": steady_requests / PASSES,
            "batches": PASSES,
        },
        "bytes": {
            "fetched": fetched,
            "store_data": data_bytes,
            "fetched_vs_data": fetched / data_bytes,
            "passes_of_window": (PASSES + 1) * batch / rows,
        },
        "local_warm": {"rows_s": local},
        "vs_local_warm": rows_s / local,
    }


def _buffer(
    settings: Settings,
    window: int,
    url: str | Path,
    options: dict[str, Any] | None = None,
    cache: Path | None = None,
) -> TrajectoryReplayBuffer:
    """A buffer saving to ``url`` that samples from storage (through ``cache`` when given)."""
    return TrajectoryReplayBuffer(
        seed=settings.seed,
        enable_cache=False,
        cache_size=0,
        sample_window_size=window,
        auto_save=True,
        auto_save_path=url,
        storage_options=options,
        local_cache_dir=cache,
    )


def _timed(buffer: TrajectoryReplayBuffer, batch: int) -> float:
    start = time.perf_counter()
    buffer.sample(batch)
    return time.perf_counter() - start


def _trajectory_gets(proxy: Any) -> int:
    return sum(1 for r in proxy.requests if r.method == "GET" and "/trajectories/" in r.key)


def _local_rate(
    settings: Settings, window: int, trajectories: list[Trajectory], store: Path
) -> float:
    """Steady rows/s of the same trajectories in a local store, page cache warm."""
    batch = settings.s3_batch
    with _buffer(settings, window, store) as buffer:
        buffer.add_trajectories(trajectories)
        buffer.flush()
        for _ in range(3):
            buffer.sample(batch)
        return statistics.median(batch / _timed(buffer, batch) for _ in range(PASSES))
