"""Cold sampling from S3: requests, bytes and rows per second per batch.

Starts its own moto S3 server (real HTTP on 127.0.0.1) behind the counting proxy of
``tests/s3_server.py``, writes a few image trajectories (``3x84x84`` uint8 ``curr_obs`` /
``next_obs`` plus per-step scalars) with ``auto_save`` to ``s3://``, then samples batches
with the cache off, so every row is read from S3.  Per batch it records the HTTP requests
by method, the distinct chunks fetched, the bytes the server sent back and rows/s; the
first batch (which also opens each trajectory's metadata) is reported separately.

Two s3fs settings are compared: ``max_concurrency=1`` (the default in rbzarr's tests) and
s3fs's own default, which sends a HEAD before every whole-object GET.  moto is far slower
per request than real S3 and runs on the same 2 cores, so rows/s is a floor; the request
and byte counts do not depend on the machine.  Run::

    .venv/bin/python benchmarks/bench_s3.py            # full (~1-2 min)
    .venv/bin/python benchmarks/bench_s3.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import s3fs

# The S3 test server and counting proxy live with the tests; reuse them, don't copy them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import (
    S3Proxy,
    create_bucket,
    s3_storage_options,
    start_moto,
    unique_bucket_name,
)

from rbzarr import Trajectory, TrajectoryReplayBuffer, tree
from rbzarr.bench import image_trajectory

RESULTS = Path(__file__).parent / "results" / "s3.json"


def measure_batch(buffer: TrajectoryReplayBuffer, proxy: S3Proxy, rows: int) -> dict[str, Any]:
    proxy.reset_log()
    start = time.perf_counter()
    batch = buffer.sample(rows)
    seconds = time.perf_counter() - start
    useful = sum(v.numel() * v.element_size() for _, v in tree.leaves(batch))
    requests = proxy.requests
    chunks = [r.key for r in requests if r.method == "GET" and "/c/" in r.key]
    return {
        "requests": dict(Counter(r.method for r in requests)),
        "total_requests": len(requests),
        "chunk_gets": len(chunks),
        "distinct_chunks": len(set(chunks)),
        "metadata_gets": sum(r.method == "GET" and "/c/" not in r.key for r in requests),
        "bytes": proxy.bytes_to_client,
        "batch_bytes": useful,
        "read_amplification": proxy.bytes_to_client / useful,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
    }


def run(
    endpoint: str,
    options_extra: dict[str, Any],
    trajectories: list[Trajectory],
    rows: int,
    batches: int,
) -> dict[str, Any]:
    s3fs.S3FileSystem.clear_instance_cache()
    proxy = S3Proxy(endpoint)
    try:
        bucket = unique_bucket_name("bench")
        create_bucket(endpoint, bucket)
        options = {**s3_storage_options(proxy.endpoint_url, timeout=30.0), **options_extra}
        options = {k: v for k, v in options.items() if v is not None}
        url = f"s3://{bucket}/store"
        raw_bytes = sum(
            v.numel() * v.element_size() for t in trajectories for v in t.tensors().values()
        )
        with TrajectoryReplayBuffer(
            seed=0,
            enable_cache=False,
            cache_size=0,
            sample_window_size=0,
            auto_save=True,
            auto_save_path=url,
            storage_options=options,
        ) as buffer:
            proxy.reset_log()
            start = time.perf_counter()
            buffer.add_trajectories(trajectories)
            buffer.flush()
            write_seconds = time.perf_counter() - start
            write_requests = dict(Counter(r.method for r in proxy.requests))
            first = measure_batch(buffer, proxy, rows)
            steady = [measure_batch(buffer, proxy, rows) for _ in range(batches)]
    finally:
        proxy.close()
    return {
        "write": {
            "seconds": write_seconds,
            "raw_MB_per_s": raw_bytes / write_seconds / 1e6,
            "requests_per_trajectory": {
                k: v / len(trajectories) for k, v in write_requests.items()
            },
        },
        "first_batch": first,
        "steady_batch_median": {
            key: statistics.median(b[key] for b in steady)
            for key in (
                "total_requests",
                "chunk_gets",
                "distinct_chunks",
                "metadata_gets",
                "bytes",
                "read_amplification",
                "seconds",
                "rows_per_s",
            )
        },
        "steady_batches": steady,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON results path (default: a new temporary directory; committed: {RESULTS})",
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="rbzarr-bench-")) / RESULTS.name
    count, T, B, rows, batches = (2, 8, 4, 32, 2) if args.quick else (4, 32, 16, 256, 5)
    trajectories = [image_trajectory(seed, T, B) for seed in range(count)]
    server, endpoint = start_moto()
    try:
        results = {
            "config": {
                "trajectories": count,
                "T": T,
                "B": B,
                "rows_per_batch": rows,
                "batches": batches,
                "image": [3, 84, 84],
            },
            "max_concurrency=1": run(endpoint, {}, trajectories, rows, batches),
            "s3fs_default": run(endpoint, {"max_concurrency": None}, trajectories, rows, batches),
        }
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    for name in ("max_concurrency=1", "s3fs_default"):
        first, steady = results[name]["first_batch"], results[name]["steady_batch_median"]
        print(
            f"{name:18s} first batch: {first['total_requests']} requests {first['requests']}, "
            f"{first['bytes'] / 1e6:.2f} MB | steady: {steady['total_requests']:.0f} requests "
            f"({steady['chunk_gets']:.0f} chunk GETs, {steady['distinct_chunks']:.0f} distinct), "
            f"{steady['bytes'] / 1e6:.2f} MB ({steady['read_amplification']:.1f}x the batch), "
            f"{steady['rows_per_s']:.0f} rows/s"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
