"""What ``rbzarr show`` and ``rbzarr report`` cost on photo stores (issue 48's targets).

    python -m benchmarks.pictures [--work DIR] [--report-trajectories 36]

* ``show``: one 224x224 trajectory (T=20, B=8, two cameras) as MP4, GIF, WebP and PNG,
  each a fresh ``rbzarr`` process (wall and CPU seconds, interpreter start included);
* bytes ``show`` reads against the bytes its rows need (the chunks of the shown env
  column's frames and signals, :class:`~benchmarks.accounting.StoreGeometry`): locally what
  the layout's reads ask for (:class:`~benchmarks.accounting.CountingByteSource`), on S3
  (moto) every byte the server sends, JSON documents included (:class:`S3Proxy`);
* ``report`` of a store of ``--report-trajectories`` such trajectories (36: about 1 GB on
  disk), 20 episodes embedded: wall seconds and page size.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fsspec

from benchmarks.accounting import CountingByteSource, StoreGeometry
from benchmarks.frames import SOURCES, rollout, to_trajectory
from benchmarks.s3_server import S3Proxy, create_bucket, s3_storage_options, start_moto
from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.frames import image_keys, trajectory_steps
from rbzarr.analysis.view import open_buffer

T, B, ENV = 20, 8, 3
SHOWN = ["rewards", "dones", "curr_obs/main_images", "curr_obs/wrist_images"]


def write_store(url: str, count: int, storage_options: dict[str, Any] | None = None) -> None:
    """``count`` photo trajectories (224x224, lossless) written one by one to ``url``."""
    source = SOURCES["photos224"]
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=storage_options
    ) as buffer:
        for arrays in rollout(source.scenes(B, seed=0), count, T, B, seed=0):
            buffer.add_trajectories([to_trajectory(arrays, T)])


def _run(*args: str) -> dict[str, float]:
    """Wall and CPU seconds (user + system, every thread) of one ``rbzarr`` process: on a
    shared host the CPU seconds are what an idle machine's wall time would be."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rbzarr", *args], check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def _needed(fs: Any, root: str) -> int:
    """Bytes of the chunks that env ``ENV``'s rows of :data:`SHOWN` need in trajectory 0."""
    geometry = StoreGeometry(fs, root, SHOWN, T, B)
    return geometry.needed({0: [t * B + ENV for t in range(T)]}).bytes


def measure_show(work: Path) -> dict[str, Any]:
    """Seconds per format and bytes read, on one trajectory."""
    store = work / "show-store"
    write_store(str(store), 1)
    seconds = {
        suffix: _run("show", str(store), "0", "--env", str(ENV), "-o", str(work / f"t.{suffix}"))
        for suffix in ("mp4", "gif", "webp", "png")
    }
    counting = CountingByteSource()
    view = open_buffer(store, layout_options={"zarr": {"byte_source": counting, "range_gap": 0}})
    trajectory_steps(view, 0, ENV, image_keys(view))
    needed = _needed(fsspec.filesystem("file"), str(store))
    return {
        "seconds": seconds,
        "local_bytes_read": counting.bytes,
        "needed_bytes": needed,
        "local_ratio": round(counting.bytes / needed, 3),
        **measure_s3(),
    }


def measure_s3() -> dict[str, Any]:
    """Bytes the S3 server sends for ``show``'s reads, against what its rows need."""
    server, endpoint = start_moto()
    proxy = S3Proxy(endpoint)
    try:
        create_bucket(endpoint, "pictures")
        direct = s3_storage_options(endpoint)
        write_store("s3://pictures/store", 1, direct)
        view = open_buffer(
            "s3://pictures/store",
            s3_storage_options(proxy.endpoint_url),
            layout_options={"zarr": {"range_gap": 0}},
        )
        proxy.reset_log()
        trajectory_steps(view, 0, ENV, image_keys(view))
        sent, requests = proxy.bytes_to_client, len(proxy.requests)
        needed = _needed(fsspec.filesystem("s3", **direct), "pictures/store")
    finally:
        proxy.close()
        server.stop()
    return {
        "s3_bytes_sent": sent,
        "s3_requests": requests,
        "s3_ratio": round(sent / needed, 3),
    }


def measure_report(work: Path, count: int) -> dict[str, Any]:
    """Seconds and page bytes of ``rbzarr report`` on ``count`` trajectories."""
    store = work / "report-store"
    write_store(str(store), count)
    disk = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    page = work / "report.html"
    seconds = _run("report", str(store), "-o", str(page))
    return {
        "trajectories": count,
        "store_bytes": disk,
        **seconds,
        "page_bytes": page.stat().st_size,
    }


def main() -> None:
    """Measure and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--report-trajectories", type=int, default=36)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        results = {"show": measure_show(Path(work))}
        results["report"] = measure_report(Path(work), args.report_trajectories)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
