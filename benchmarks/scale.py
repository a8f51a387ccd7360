"""The ``scale`` suite: what a commit, a resume and an open cost as the store grows.

* ``commits``: one buffer adds tiny trajectories (T=4, B=2, three keys) one at a time and
  flushes every 50, with real commits all the way to ``--trajectories`` (100,000 by
  default), timed in stretches of 1,000 after the first 500 (each stretch's trajectories
  made before its clock starts).  For the first 10 stretches and the last 10 (medians), it
  reports ms per trajectory (add + commit), commits per second, user and system CPU
  microseconds per trajectory (this process) and bytes written per trajectory (``wchar`` of
  ``/proc/self/io``: every byte the process wrote); for all, the spread of commits per
  second (the target is their median).
* ``resume`` and ``open``: a store of 1,000,000 trajectories whose index log this script
  writes directly (blocks of entries, as compaction leaves them), with data only for the
  window's last 100 trajectories (written by the zarr layout).  ``resume`` is
  ``TrajectoryReplayBuffer(auto_save=True, ...)`` + ``load_checkpoint`` of that store;
  ``open`` is ``open_buffer(url, sample_window_size=100)`` + the first ``sample(256)``, in a
  fresh process that reports its peak RSS (``imported``: the same after importing the
  modules rbzarr imports on first use, which the figure includes).
* ``durable``: ms per ``flush()`` of one tiny trajectory with ``durable=False`` and ``True``.
* ``writes``: rows/s of the buffer's writes against TorchRL's ``LazyMemmapStorage.extend`` on
  the same state and image rows (:mod:`benchmarks.write_rows`: TorchRL's first pass over new
  files, and again over the same storage), 7 alternating rounds each (on this VM one
  side's rounds swung 10x with the memory the host had taken back; 3 left the median to one).
* ``s3``: on moto behind the delaying proxy (20 ms a request): ms per tiny trajectory of
  real commits appended after a log of 500 and of 10,000 trajectories (the prefix written
  directly: what a commit costs depends on the log's state, not on how it was made), and
  the requests a resume of a large store (window 100, no cache warming) makes.

Run: ``python -m benchmarks --suites scale [--quick]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.limits import clock, per_trajectory, spread
from benchmarks.report import target
from benchmarks.s3 import load_s3_server, proxied_bucket
from benchmarks.write_rows import measure
from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.schema import schema_to_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.model import validate

__all__ = ["run_scale", "scale_targets"]

WINDOW = 100
FLUSH_EVERY = 50
# Commits are timed in stretches of this many, after the first WARM_UP.
STRETCH = 1000
WARM_UP = 500
# The early and the late figures are medians of this many stretches.
EDGE = 10


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
    """Real commits up to ``count``: the first :data:`WARM_UP`, then stretches of
    :data:`STRETCH`, each timed from a ``flush`` to a ``flush``.  A stretch's trajectories are
    made before its clock starts (the figure is rbzarr's add and commit, not the making of
    tensors).  Figures of the first :data:`EDGE` stretches and the last (medians, one
    stretch's noise aside), and the spread of all."""
    starts = [0, *range(WARM_UP, count - STRETCH + 1, STRETCH)]
    ends = [*starts[1:], count]
    stretches: list[dict[str, float]] = []
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, sample_window_size=WINDOW, cache_size=5
    ) as buffer:
        for first, end in zip(starts, ends, strict=True):
            made = [tiny(i) for i in range(first, end)]
            buffer.flush()
            written, began = written_bytes(), clock()
            for i, trajectory in enumerate(made, first):
                buffer.add_trajectories([trajectory])
                if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                    buffer.flush()
            buffer.flush()
            figures = per_trajectory(began, len(made))  # wall, user and system us
            if first > 0:  # the last stretch takes the rest (up to twice as many)
                stretches.append(
                    {
                        "trajectories_before": first,
                        "ms_per_trajectory": figures["wall_us"] / 1000,
                        "commits_per_s": figures["per_s"],
                        "user_us": figures["user_us"],
                        "system_us": figures["system_us"],
                        "bytes_per_trajectory": (written_bytes() - written) / len(made),
                    }
                )
    edge = min(EDGE, len(stretches))
    return {
        "early": _median_stretch(stretches[:edge]),
        "late": _median_stretch(stretches[-edge:]),
        "stretches": spread([stretch["commits_per_s"] for stretch in stretches]),
    }


def _median_stretch(stretches: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure of ``stretches``, and where they start."""
    out = {key: statistics.median(s[key] for s in stretches) for key in stretches[0]}
    out["trajectories_before"] = stretches[0]["trajectories_before"]
    out["stretches"] = len(stretches)
    return out


def synthetic_store(location: Location, count: int, data: int = WINDOW) -> None:
    """A store of ``count`` trajectories: a log written directly, data for the last ``data``."""
    layout = ZarrLayout(location)
    entries = []
    now = time.time()
    first_data = count - data
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
        metadata={
            "trajectory_format": "zarr",
            "rbzarr_format_version": 1,
            "seed": 1234,
            "schema": schema_to_json(validate(tiny(0)).schema),
        },
    )


def resume(
    store: str, options: dict[str, Any] | None = None, cache: int = 5, loaded: Any = None
) -> dict[str, Any]:
    """``load_checkpoint`` of the live store, window 100 (``loaded()`` is called right after
    it, before the first sample)."""
    start = time.perf_counter()
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=store,
        sample_window_size=WINDOW,
        cache_size=cache,
        storage_options=options,
    )
    buffer.load_checkpoint(store)
    seconds = time.perf_counter() - start
    result = loaded() if loaded is not None else {}
    size = len(buffer)
    batch = buffer.sample(256)
    buffer.close()
    return {
        "seconds": seconds,
        "len": size,
        "sampled_rows": int(batch["rewards"].shape[0]),
        **result,
    }


OPEN_CHILD = """
import json, sys, time
import torch, rbzarr, rbzarr.analysis  # the imports: not what an open costs
if len(sys.argv) > 2:  # and the modules rbzarr imports on an open's first use (`imported`)
    import rbzarr.analysis.view, rbzarr.storage.zarr.layout, rbzarr.storage.io.local_store

def peak_mb():  # VmHWM: this process's peak (ru_maxrss keeps the forking parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")

after_import = peak_mb()
start, cpu = time.perf_counter(), time.process_time()
view = rbzarr.open_buffer(sys.argv[1], sample_window_size=100, seed=1)
batch = view.sample(256)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "len": len(view),
                  "rows": int(batch["rewards"].shape[0]), "peak_rss_mb": peak_mb(),
                  "rss_after_import_mb": after_import}))
"""


def open_view(store: Path) -> dict[str, Any]:
    """``open_buffer`` + the first ``sample(256)`` in a fresh process, with its peak RSS; and
    in ``imported``, the same in a process that imported the view's modules before the clock
    (the difference is what the first use's imports cost)."""
    figures = []
    for extra in ([], ["imported"]):
        done = subprocess.run(
            [sys.executable, "-c", OPEN_CHILD, str(store), *extra],
            capture_output=True,
            text=True,
            check=True,
        )
        figures.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, imported = figures
    return {**first, "imported": {k: imported[k] for k in ("seconds", "cpu_seconds")}}


def appending(buffer: TrajectoryReplayBuffer, count: int, flush_every: int) -> float:
    """Seconds to add ``count`` tiny trajectories after a first one, flushing every
    ``flush_every`` and at the end."""
    buffer.add_trajectories([tiny(0)])
    buffer.flush()
    start = time.perf_counter()
    for i in range(count):
        buffer.add_trajectories([tiny(i)])
        if i % flush_every == flush_every - 1:
            buffer.flush()
    buffer.flush()
    return time.perf_counter() - start


def durable_flush(workdir: Path, flushes: int) -> dict[str, Any]:
    """ms per flush of one tiny trajectory, without and with ``durable``."""
    result = {}
    for durable in (False, True):
        store = workdir / f"durable-{durable}"
        with TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=store, durable=durable
        ) as buffer:
            seconds = appending(buffer, flushes, flush_every=1)
            result["durable" if durable else "default"] = {"ms_per_flush": 1000 * seconds / flushes}
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


def s3_figures(quick: bool) -> dict[str, Any]:
    """Commits after a short and a long log, and a resume's requests, on moto behind the
    20 ms proxy."""
    server = load_s3_server()
    if isinstance(server, str):
        return {"unavailable": server}
    appended = 20 if quick else 100
    result: dict[str, Any] = {"delay_s": 0.02, "appended": appended}
    with proxied_bucket(server, "scale") as (_, proxy, bucket, options):
        for name, prefix in (("after_500", 500), ("after_10k", 10_000)):
            url = f"s3://{bucket}/commits-{prefix}"
            proxy.slow_down(0.0)
            synthetic_store(Location.from_url(url, options), prefix, data=0)
            proxy.slow_down(0.02)
            with TrajectoryReplayBuffer(
                auto_save=True, auto_save_path=url, storage_options=options
            ) as buffer:
                seconds = appending(buffer, appended, FLUSH_EVERY)
            result[name] = {"ms_per_trajectory": 1000 * seconds / appended}
        large = 100_000 if quick else 1_000_000
        url = f"s3://{bucket}/large"
        proxy.slow_down(0.0)
        synthetic_store(Location.from_url(url, options), large)
        proxy.slow_down(0.02)
        proxy.reset_log()

        def counted() -> dict[str, Any]:
            requests = proxy.requests
            return {
                "requests": len(requests),
                "by_method": dict(Counter(r.method for r in requests)),
                "cache_size": 0,
            }

        result["resume"] = resume(url, options, cache=0, loaded=counted)
    return result


def write_figures(quick: bool, workdir: str) -> dict[str, Any]:
    """Buffer writes against TorchRL's, state and image rows (see the module docs)."""
    try:
        import tensordict  # noqa: F401, PLC0415  (the bench extra)
        import torchrl  # noqa: F401, PLC0415
    except ImportError as exc:
        return {"unavailable": f"torchrl is not installed ({exc}); install rbzarr[bench]"}
    return {name: measure(name, 1 if quick else 7, workdir, {}) for name in ("state", "image")}


def run_scale(quick: bool, workdir: str | None) -> dict[str, Any]:
    """Every figure of the suite (see the module docs)."""
    count = 10_000 if quick else 100_000
    large = 100_000 if quick else 1_000_000
    with tempfile.TemporaryDirectory(dir=workdir) as work:
        root = Path(work)
        committed = commits(root / "commits", count)
        cost = store_cost(root / "commits")
        synthetic_store(Location.from_url(root / "large"), large)
        resumed = resume(str(root / "large"))
        opened = open_view(root / "large")
        durable = durable_flush(root, 50 if quick else 200)
        writes = write_figures(quick, str(root))
    return {
        "commits": {"trajectories": count, **committed, "store": cost},
        "resume": resumed,
        "open": opened,
        "durable": durable,
        "writes": writes,
        "s3": s3_figures(quick),
        "notes": (
            f"resume/open use a store of {large} trajectories whose index log the bench "
            f"wrote directly, with data only for the window's last {WINDOW}; the local commit "
            "figures use real commits; the S3 commit figures append real commits to a log "
            "prefix written directly"
        ),
    }


def scale_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the suite, evaluated on ``results``."""
    commit = results["commits"]
    early, late = commit["early"], commit["late"]
    n = commit["trajectories"]
    s3 = results["s3"]
    s3_reason = s3.get("unavailable")
    writes = results["writes"]
    return [
        target(
            f"ms per tiny trajectory at {n:,} vs at 1k, local",
            "add + commit of T=4, B=2, three keys, one add at a time, flush every 50: the "
            f"median of the last {EDGE} stretches of 1,000 over that of the first {EDGE}",
            late["ms_per_trajectory"] / early["ms_per_trajectory"],
            1.2,
            "<=",
        ),
        target(
            "the same on moto S3 behind the 20 ms proxy, at 10k vs at 500",
            "real commits appended to a log of 10,000 and of 500 trajectories",
            None
            if s3_reason
            else s3["after_10k"]["ms_per_trajectory"] / s3["after_500"]["ms_per_trajectory"],
            1.2,
            "<=",
            s3_reason,
        ),
        target(
            f"bytes written per tiny trajectory at {n:,} vs at 1k",
            "wchar of /proc/self/io per trajectory (data is constant: this is metadata)",
            late["bytes_per_trajectory"] / max(early["bytes_per_trajectory"], 1.0),
            1.2,
            "<=",
        ),
        target(
            "tiny-trajectory commits per second, one writer, local",
            f"median of every stretch of {STRETCH:,} commits after the first {WARM_UP} "
            "(each stretch's trajectories made before its clock starts; issue 46: 2,000)",
            commit["stretches"]["median"],
            2000,
            ">=",
        ),
        target(
            f"resume at {results['resume']['len']:,} trajectories, local, s",
            "a new auto_save buffer + load_checkpoint of the live store, window 100",
            results["resume"]["seconds"],
            0.5,
            "<=",
        ),
        target(
            "resume on S3 (20 ms/request), requests",
            "requests of the same resume through the proxy (cache_size=0: no trajectory warmed)",
            None if s3_reason else float(s3["resume"]["requests"]),
            20,
            "<=",
            s3_reason,
        ),
        target(
            "open_buffer + the first sample(256), window 100, s",
            "in a fresh process, after the import",
            results["open"]["seconds"],
            0.5,
            "<=",
        ),
        *(
            target(
                f"{name}-row writes >= TorchRL LazyMemmapStorage.extend",
                "rows/s of add_trajectories + flush (auto_save, zarr) / rows/s of extend into "
                "a new LazyMemmapStorage, same rows, median of the per-round ratios (the "
                "sides alternating)",
                None if "unavailable" in writes else writes[name]["ratio_first"],
                1.0,
                ">=",
                writes.get("unavailable"),
            )
            for name in ("state", "image")
        ),
        target(
            "image-row writes vs write() of the same bytes into fresh files (the limit)",
            "rows/s of add_trajectories + flush / rows/s of write() of every array's bytes into "
            "its own new file, median of the per-round ratios (the sides alternating)",
            None if "unavailable" in writes else writes["image"]["ratio_vs_write_limit"]["median"],
            0.5,
            ">=",
            writes.get("unavailable"),
        ),
        target(
            "peak RSS of that view, MB",
            "ru_maxrss of that process (the import of torch included)",
            results["open"]["peak_rss_mb"],
            300,
            "<=",
        ),
    ]
