"""Sampling from S3 through moto and the test suite's counting, delaying proxy.

moto and the proxy each run in a process of their own (so neither shares the client's
interpreter lock, as a real endpoint would not); moto is far slower per request than S3:
two batches without the delay show what it and the client cost by themselves.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import socket
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from benchmarks.accounting import StoreGeometry
from benchmarks.draws import DrawSequence, TrackedBuffer
from benchmarks.measure import nbytes
from benchmarks.s3_cache import measure_cache
from benchmarks.settings import Settings
from benchmarks.workloads import camera_and_state_trajectory
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.storage.io.backends import with_s3_defaults
from rbzarr.storage.zarr.remote import DEFAULT_RANGE_GAP
from rbzarr.trajectory.model import validate

__all__ = [
    "concurrency_limit",
    "drop_filesystems",
    "load_s3_server",
    "moto_process",
    "proxied_bucket",
    "run_s3",
]


def load_s3_server() -> ModuleType | str:
    """The S3 test server module (:mod:`benchmarks.s3_server`), or why it cannot be used."""
    try:
        import moto.server  # noqa: F401, PLC0415  (test extra)
        import s3fs  # noqa: F401, PLC0415
    except ImportError as exc:
        return f"moto's S3 server or s3fs is not installed ({exc}); install rbzarr[test]"
    from benchmarks import s3_server  # noqa: PLC0415

    return s3_server


def concurrency_limit(options: dict[str, Any]) -> int:
    """How many requests of one batch may be in flight at once: the layout fetches a batch's ranges
    with one ``fs.cat_ranges``, which s3fs runs over botocore's connection pool
    (``max_pool_connections`` in ``config_kwargs``, botocore's default otherwise).
    """
    from botocore.config import Config  # noqa: PLC0415  (with s3fs)

    merged = with_s3_defaults("s3://bucket", options)  # what Location.from_url passes on
    return int(Config(**merged.get("config_kwargs", {})).max_pool_connections)


def run_s3(settings: Settings, quick: bool) -> dict[str, Any]:
    """The S3 mode: see the module docs; ``{"unavailable": reason}`` without a server."""
    server_module = load_s3_server()
    if isinstance(server_module, str):
        return {"unavailable": server_module}
    import s3fs  # noqa: PLC0415

    with proxied_bucket(server_module, "bench") as (endpoint, proxy, bucket, options):
        direct = s3fs.S3FileSystem(**server_module.s3_storage_options(endpoint, timeout=60.0))
        return _measure(settings, quick, proxy, f"{bucket}/store", options, direct)


@contextlib.contextmanager
def proxied_bucket(
    server_module: ModuleType, prefix: str
) -> Iterator[tuple[str, Any, str, dict[str, Any]]]:
    """moto in a child process, a new bucket on it and the delaying proxy in front:
    yields ``(moto's URL, the proxy, the bucket, s3fs options through the proxy)``."""
    import s3fs  # noqa: PLC0415  (with the S3 server)

    with moto_process() as endpoint:
        proxy = server_module.ProxyProcess(endpoint)
        try:
            bucket = server_module.unique_bucket_name(prefix)
            server_module.create_bucket(endpoint, bucket)
            s3fs.S3FileSystem.clear_instance_cache()
            options = server_module.s3_storage_options(proxy.endpoint_url, timeout=60.0)
            yield endpoint, proxy, bucket, options
        finally:
            proxy.close()
            drop_filesystems(s3fs)


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """moto's S3 server in a child process on a free port of 127.0.0.1; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None
        drain = threading.Thread(target=process.stderr.read, daemon=True)
        try:
            for line in process.stderr:  # werkzeug announces "Running on http://..." when ready
                if "Running on" in line:
                    break
            else:
                raise RuntimeError(f"moto's server exited with status {process.wait()}")
            drain.start()  # it logs every request on stderr: keep draining so it never blocks
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=30)
            if drain.is_alive():
                drain.join(timeout=30)


def drop_filesystems(s3fs: Any) -> None:
    """Forget s3fs's cached filesystems and collect their sessions, quietly."""
    # zarr's fsspec store opens asynchronous s3fs instances whose aiohttp sessions nothing
    # closes; collect them here, where their "Unclosed client session" warning is expected.
    s3fs.S3FileSystem.clear_instance_cache()
    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    asyncio_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", "Unclosed (client session|connector)", ResourceWarning
            )
            gc.collect()
    finally:
        asyncio_log.setLevel(level)


def _measure(
    settings: Settings, quick: bool, proxy: Any, path: str, options: dict[str, Any], direct: Any
) -> dict[str, Any]:
    T, B = (8, 4) if quick else (32, 8)
    trajectories = [
        camera_and_state_trajectory(settings.seed + i, T, B)
        for i in range(settings.s3_trajectories)
    ]
    spec = validate(trajectories[0])
    raw = nbytes(v for t in trajectories for v in t.tensors().values())
    with TrajectoryReplayBuffer(
        seed=settings.seed,
        enable_cache=False,
        cache_size=0,
        sample_window_size=len(trajectories),
        auto_save=True,
        auto_save_path=f"s3://{path}",
        storage_options=options,
    ) as buffer:
        proxy.reset_log()
        start = time.perf_counter()
        buffer.add_trajectories(trajectories)
        buffer.flush()
        seconds = time.perf_counter() - start
        writes = dict(Counter(r.method for r in proxy.requests))
        proxy.slow_down(settings.s3_delay_s)
        geometry = StoreGeometry(direct, path, list(spec.schema), T, B)
        draws = DrawSequence(
            [spec.num_samples] * len(trajectories), settings.s3_batch, settings.seed
        )
        tracked = TrackedBuffer(buffer, settings.s3_batch)
        limit = concurrency_limit(options)
        batches = [
            _batch(tracked, proxy, geometry, draws, settings.s3_delay_s, limit)
            for _ in range(settings.s3_batches + 1)
        ]
        # The same kind of batch without the delay: what the server and client cost alone.
        proxy.slow_down(0.0)
        undelayed = [_batch(tracked, proxy, geometry, draws, 0.0, limit) for _ in range(2)]
    cache = measure_cache(
        settings, proxy, f"{path}-cached", options, direct, trajectories, settings.s3_delay_s
    )
    steady = batches[1:]
    return {
        "T": T,
        "B": B,
        "trajectories": len(trajectories),
        "batch": settings.s3_batch,
        "delay_s": settings.s3_delay_s,
        "concurrency_limit": concurrency_limit(options),
        "write": {
            "seconds": seconds,
            "raw_mb_s": raw / 1e6 / seconds,
            "requests_per_trajectory": {k: v / len(trajectories) for k, v in writes.items()},
        },
        "first_batch": batches[0],
        "steady_median": {key: statistics.median(b[key] for b in steady) for key in STEADY_KEYS},
        "steady_batches": steady,
        "undelayed_seconds": statistics.median(b["seconds"] for b in undelayed),
        "local_cache": cache,
    }


STEADY_KEYS = (
    "requests",
    "needed_ranges",
    "needed_chunks",
    "bytes",
    "needed_bytes",
    "bytes_vs_needed",
    "bytes_vs_needed_and_gaps",
    "seconds",
    "rows_s",
    "time_bound_s",
)


def _batch(
    tracked: TrackedBuffer,
    proxy: Any,
    geometry: StoreGeometry,
    draws: DrawSequence,
    delay: float,
    limit: int,
) -> dict[str, Any]:
    """One timed batch through the proxy, and what its rows need."""
    k = tracked.calls
    proxy.reset_log()
    start = time.perf_counter()
    tracked.sample()
    seconds = time.perf_counter() - start
    requests = proxy.requests
    sent = proxy.bytes_to_client
    positions, rows = draws.at(k)
    wanted: dict[int, list[int]] = {}
    for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
        wanted.setdefault(position, []).append(row)
    needed = geometry.needed(wanted)
    rounds = math.ceil(len(requests) / limit)
    return {
        "requests": len(requests),
        "by_method": dict(Counter(r.method for r in requests)),
        "needed_ranges": len(needed.coalesced_pieces()),
        "needed_chunks": needed.chunks,
        "bytes": sent,
        "needed_bytes": needed.piece_bytes,
        "bytes_vs_needed": sent / needed.piece_bytes,
        # Ranges closer than range_gap are merged: each request may carry that much more.
        "bytes_vs_needed_and_gaps": sent / (needed.piece_bytes + len(requests) * DEFAULT_RANGE_GAP),
        "seconds": seconds,
        "rows_s": tracked.batch / seconds,
        "time_bound_s": 3 * delay * rounds,
    }
