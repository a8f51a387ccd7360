"""The ``scale`` suite: what a commit, a resume and an open cost as the store grows.

Measured on a local store (moto S3 figures need the S3 harness, see benchmarks/README.md):

* ``commits``: one buffer adds tiny trajectories (T=4, B=2, three keys) one at a time and
  flushes every 50, with real commits all the way to ``--trajectories`` (100,000 by
  default).  For the 1,000 trajectories after the first 500 and the last 1,000, it reports
  ms per trajectory (add + commit), commits per second and bytes written per trajectory
  (``wchar`` of ``/proc/self/io``: every byte the process wrote).
* ``resume`` and ``open``: a store of 1,000,000 trajectories whose index log this script
  writes directly (blocks of entries, as compaction leaves them), with data only for the
  window's last 100 trajectories (written by the zarr layout).  ``resume`` is
  ``TrajectoryReplayBuffer(auto_save=True, ...)`` + ``load_checkpoint`` of that store;
  ``open`` is ``open_buffer(url, sample_window_size=100)`` + the first ``sample(256)``, in a
  fresh process that reports its peak RSS.
* ``durable``: ms per ``flush()`` of one tiny trajectory with ``durable=False`` and ``True``.

Run: ``python benchmarks/scale.py [--quick] [--out benchmarks/results/scale.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage import index_log
from rbzarr.storage.location import Location
from rbzarr.storage.zarr.layout import ZarrLayout

WINDOW = 100
FLUSH_EVERY = 50


def tiny(i: int) -> Trajectory:
    """A tiny trajectory: T=4, B=2, three keys."""
    return Trajectory(
        rewards=torch.full((4, 2, 1), float(i)),
        dones=torch.zeros(4, 2, 1, dtype=torch.bool),
        prev_logprobs=torch.zeros(4, 2, 7),
    )


def written_bytes() -> int:
    """Bytes this process has written (``wchar``), or 0 where /proc has no io file."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return 0
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("wchar")))


def commits(store: Path, count: int) -> dict[str, Any]:
    """Real commits up to ``count``; figures of an early and the last stretch of 1,000."""
    stretches = {"early": (500, 1500), "late": (count - 1000, count)}
    marks: dict[int, tuple[float, int]] = {}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, sample_window_size=WINDOW, cache_size=5
    ) as buffer:
        for i in range(count):
            if i in (500, 1500, count - 1000):
                buffer.flush()
                marks[i] = (time.perf_counter(), written_bytes())
            buffer.add_trajectories([tiny(i)])
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                buffer.flush()
        buffer.flush()
        marks[count] = (time.perf_counter(), written_bytes())
    result = {}
    for name, (start, end) in stretches.items():
        seconds = marks[end][0] - marks[start][0]
        result[name] = {
            "trajectories_before": start,
            "ms_per_trajectory": 1000 * seconds / (end - start),
            "commits_per_s": (end - start) / seconds,
            "bytes_per_trajectory": (marks[end][1] - marks[start][1]) / (end - start),
        }
    return result


def synthetic_store(store: Path, count: int) -> None:
    """A store of ``count`` trajectories: a log written directly, data for the last WINDOW."""
    location = Location.from_url(store)
    layout = ZarrLayout(location)
    entries = []
    now = time.time()
    first_data = count - WINDOW
    for i in range(count):
        entry = {
            "uuid": str(uuid.UUID(int=i)),
            "trajectory_id": i,
            "num_samples": 8,
            "shape": [4, 2, 7],
            "max_episode_length": 0,
            "model_weights_id": "",
        }
        entries.append((entry, now))
        if i >= first_data:
            layout.write(entry, tiny(i))
    log = index_log.IndexLog(location)
    log.rewrite(
        entries,
        counter=count,
        metadata={"trajectory_format": "zarr", "rbzarr_format_version": 1, "seed": 1234},
    )


def resume(store: Path) -> dict[str, Any]:
    """``load_checkpoint`` of the live store, window 100."""
    start = time.perf_counter()
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, sample_window_size=WINDOW, cache_size=5
    )
    buffer.load_checkpoint(store)
    seconds = time.perf_counter() - start
    size = len(buffer)
    batch = buffer.sample(256)
    buffer.close()
    return {"seconds": seconds, "len": size, "sampled_rows": int(batch["rewards"].shape[0])}


OPEN_CHILD = """
import json, resource, sys, time
import rbzarr
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
view = rbzarr.open_buffer(sys.argv[1], sample_window_size=100, seed=1)
batch = view.sample(256)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "len": len(view), "rows": int(batch["rewards"].shape[0]),
                  "peak_rss_mb": peak / 1024, "rss_after_import_mb": before / 1024}))
"""


def open_view(store: Path) -> dict[str, Any]:
    """``open_buffer`` + the first ``sample(256)`` in a fresh process, with its peak RSS."""
    done = subprocess.run(
        [sys.executable, "-c", OPEN_CHILD, str(store)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def durable_flush(workdir: Path, flushes: int) -> dict[str, Any]:
    """ms per flush of one tiny trajectory, without and with ``durable``."""
    result = {}
    for durable in (False, True):
        store = workdir / f"durable-{durable}"
        with TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=store, durable=durable
        ) as buffer:
            buffer.add_trajectories([tiny(0)])
            buffer.flush()
            start = time.perf_counter()
            for i in range(flushes):
                buffer.add_trajectories([tiny(i)])
                buffer.flush()
            result["durable" if durable else "default"] = {
                "ms_per_flush": 1000 * (time.perf_counter() - start) / flushes
            }
    return result


def store_cost(store: Path) -> dict[str, Any]:
    """Files and bytes on disk per trajectory of a store."""
    files = [p for p in store.rglob("*") if p.is_file()]
    on_disk = sum(p.stat().st_blocks * 512 for p in files)
    trajectories = len(list((store / "trajectories").iterdir()))
    return {
        "files_per_trajectory": len(files) / max(trajectories, 1),
        "bytes_on_disk_per_trajectory": on_disk / max(trajectories, 1),
    }


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on this run."""
    found = []

    def add(name: str, value: float, threshold: float, op: str) -> None:
        met = value <= threshold if op == "<=" else value >= threshold
        found.append({"name": name, "value": value, "threshold": threshold, "op": op, "met": met})

    early, late = results["commits"]["early"], results["commits"]["late"]
    n = results["commits"]["trajectories"]
    add(
        f"ms per tiny trajectory at {n} vs at 1k",
        late["ms_per_trajectory"] / early["ms_per_trajectory"],
        1.2,
        "<=",
    )
    add(
        f"bytes written per tiny trajectory at {n} vs at 1k",
        late["bytes_per_trajectory"] / max(early["bytes_per_trajectory"], 1),
        1.2,
        "<=",
    )
    add("tiny-trajectory commits/s, one writer (at 1k)", early["commits_per_s"], 1000, ">=")
    add(
        f"resume (load_checkpoint, window 100) at {results['resume']['len']} trajectories, s",
        results["resume"]["seconds"],
        0.5,
        "<=",
    )
    add("open_buffer + first sample(256), window 100, s", results["open"]["seconds"], 0.5, "<=")
    add("peak RSS of that view, MB", results["open"]["peak_rss_mb"], 300, "<=")
    return found


def main() -> None:
    """Run the suite and write its results JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k commits, a 100k store")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--large", type=int, default=None, help="trajectories of resume/open")
    parser.add_argument("--out", default="benchmarks/results/scale.json")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    count = args.trajectories or (10_000 if args.quick else 100_000)
    large = args.large or (100_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        workdir = Path(work)
        print(f"[scale] {count} tiny commits", flush=True)
        committed = commits(workdir / "commits", count)
        cost = store_cost(workdir / "commits")
        print(f"[scale] a {large}-trajectory store (log written directly)", flush=True)
        synthetic_store(workdir / "large", large)
        print("[scale] resume and open", flush=True)
        resumed = resume(workdir / "large")
        opened = open_view(workdir / "large")
        print("[scale] durable flushes", flush=True)
        durable = durable_flush(workdir, 50 if args.quick else 200)
    results = {
        "commits": {"trajectories": count, **committed, "store": cost},
        "resume": resumed,
        "open": opened,
        "durable": durable,
        "notes": (
            f"resume/open use a store of {large} trajectories whose index log the bench "
            f"wrote directly, with data only for the window's last {WINDOW}; the commit "
            "figures use real commits"
        ),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "peak_rss_mb_bench": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    document = {"suite": "scale", "results": results, "targets": targets(results)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    for found in document["targets"]:
        print(f"{'met' if found['met'] else 'NOT met'}: {found['name']} = {found['value']:.3g}")


if __name__ == "__main__":
    main()
