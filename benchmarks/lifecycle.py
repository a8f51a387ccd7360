"""The ``lifecycle`` suite: checkpoints of a zarr store that copy nothing (manifests and pins).

Cases:

* ``local``: a store of 100 embodied trajectories (two ``3x128x128`` uint8 cameras, a 32-d
  state, RLinf-shaped ``[T, B, ...]``), window 100: ``save_checkpoint(path)`` (a manifest and
  its pin) timed over a few saves, with the bytes it wrote (the manifest's folder and the pin
  file), against ``save_checkpoint(path, copy=True)`` (RLinf's copy, what every save cost
  before);
* ``large``: the same save of a window of 100 in a store of 10^6 trajectories (a log written
  directly, data only for the window: :func:`benchmarks.scale.synthetic_store`);
* ``identical``: ``load_checkpoint`` of the manifest and of the copy into fresh buffers, then
  10 ``sample(256)`` each: equal or not;
* ``s3``: the save on moto behind the 20 ms proxy, 100 embodied trajectories (smaller T and
  B: the requests do not depend on the bytes): the requests it makes;
* ``gc``: ``rbzarr gc --keep-last n/2`` of stores of 10^4 and 10^5 tiny trajectories (their
  log written directly, data for every one): milliseconds per deleted trajectory;
* ``retention``: a buffer with ``retention`` = the last 1,000 adds 10^5 tiny trajectories
  (2 x 10^4 quick): the store's bytes over the kept trajectories' after each 10^4, and the
  collection's milliseconds per removed trajectory in the first and the last 10^4.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import target
from benchmarks.s3 import load_s3_server, proxied_bucket
from benchmarks.scale import synthetic_store, tiny
from benchmarks.workloads import embodied_trajectory
from rbzarr import Retention, TrajectoryReplayBuffer
from rbzarr.analysis.collect import collect_store
from rbzarr.storage.index.collector import SlotCollector
from rbzarr.storage.index.pins import FOLDER as PINS
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.trajectory import tree

__all__ = ["lifecycle_targets", "run_lifecycle"]

WINDOW = 100
SAVES = 5
T, B = 8, 4


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _fill(buffer: TrajectoryReplayBuffer, count: int, T: int, B: int) -> None:
    for k in range(count):
        buffer.add_trajectories([embodied_trajectory(k, T, B)])
    buffer.flush()


def _saves(buffer: TrajectoryReplayBuffer, root: Path, store: Path) -> dict[str, Any]:
    """``SAVES`` manifest saves: median seconds, bytes of one (manifest folder + pin)."""
    seconds, written = [], []
    for k in range(SAVES):
        pins_before = _folder_bytes(store / PINS) if (store / PINS).exists() else 0
        start = time.perf_counter()
        buffer.save_checkpoint(root / f"manifest-{k}")
        seconds.append(time.perf_counter() - start)
        pin_bytes = _folder_bytes(store / PINS) - pins_before
        written.append(_folder_bytes(root / f"manifest-{k}") + pin_bytes)
    return {"seconds": statistics.median(seconds), "bytes": max(written), "saves": SAVES}


def local_figures(root: Path, count: int) -> dict[str, Any]:
    """Manifest saves (and one copy) of a window of ``count`` embodied trajectories."""
    store = root / "store"
    with TrajectoryReplayBuffer(
        seed=0, sample_window_size=WINDOW, auto_save=True, auto_save_path=store, cache_size=0
    ) as buffer:
        _fill(buffer, count, T, B)
        result: dict[str, Any] = {"trajectories": count, "T": T, "B": B}
        result["store_bytes"] = _folder_bytes(store / "trajectories")
        result["manifest"] = _saves(buffer, root, store)
        start = time.perf_counter()
        buffer.save_checkpoint(root / "copy", copy=True)
        result["copy"] = {
            "seconds": time.perf_counter() - start,
            "bytes": _folder_bytes(root / "copy"),
        }
        result["identical"] = identical_draws(root / "manifest-0", root / "copy")
    return result


def identical_draws(manifest: Path, copy: Path) -> bool:
    """Whether loads of ``manifest`` and ``copy`` draw the same 10 ``sample(256)``."""
    loaded = []
    for path in (manifest, copy):
        buffer = TrajectoryReplayBuffer(seed=1, sample_window_size=WINDOW, cache_size=0)
        buffer.load_checkpoint(path)
        loaded.append(buffer)
    for _ in range(10):
        got, want = (tree.flatten(buffer.sample(256)) for buffer in loaded)
        if list(got) != list(want) or not all(torch.equal(got[k], want[k]) for k in want):
            return False
    return True


def large_figures(root: Path, count: int) -> dict[str, Any]:
    """A manifest save of the window of 100 in a store of ``count`` trajectories."""
    store = root / "large"
    synthetic_store(Location.from_url(store), count)
    with TrajectoryReplayBuffer(
        sample_window_size=WINDOW, auto_save=True, auto_save_path=store, cache_size=0
    ) as buffer:
        buffer.load_checkpoint(store)
        return {"store_trajectories": count, **_saves(buffer, root, store)}


def s3_figures(count: int) -> dict[str, Any]:
    """The requests of a manifest save on moto behind the 20 ms proxy."""
    server = load_s3_server()
    if isinstance(server, str):
        return {"unavailable": server}
    with proxied_bucket(server, "lifecycle") as (_, proxy, bucket, options):
        url = f"s3://{bucket}/store"
        with TrajectoryReplayBuffer(
            sample_window_size=WINDOW,
            auto_save=True,
            auto_save_path=url,
            cache_size=0,
            storage_options=options,
        ) as buffer:
            proxy.slow_down(0.0)
            _fill(buffer, count, 2, 2)
            proxy.slow_down(0.02)
            proxy.reset_log()
            start = time.perf_counter()
            buffer.save_checkpoint(f"s3://{bucket}/checkpoint")
            seconds = time.perf_counter() - start
            requests = proxy.requests
    return {
        "delay_s": 0.02,
        "trajectories": count,
        "seconds": seconds,
        "requests": len(requests),
        "by_method": dict(Counter(r.method for r in requests)),
    }


def gc_figures(root: Path, sizes: tuple[int, ...]) -> dict[str, Any]:
    """A collection of half of each store: ms per deleted trajectory (wall and CPU), by
    store size."""
    result = {}
    for count in sizes:
        store = root / f"gc-{count}"
        synthetic_store(Location.from_url(store), count, data=count)
        start, cpu = time.perf_counter(), time.process_time()
        plan = collect_store(str(store), count // 2)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        result[str(count)] = {
            "deleted": len(plan.deleted),
            "seconds": seconds,
            "ms_per_deleted": 1000 * seconds / len(plan.deleted),
            "cpu_ms_per_deleted": 1000 * cpu / len(plan.deleted),
        }
    return result


RETAINED = 1_000
STRETCH = 10_000  # the stretches whose collection cost is compared (the first, the last)


def retention_figures(
    root: Path, count: int, retained: int = RETAINED, stretch: int = STRETCH
) -> dict[str, Any]:
    """``count`` tiny trajectories added (50 per flush) by a buffer with ``retention`` = the
    last ``retained`` (grace 0), a checkpoint pinning a window of 100 early on: the store's
    bytes against the retained and pinned trajectories' bytes after every ``stretch`` past
    the first,
    and the collection's milliseconds (wall and the writer thread's CPU) per removed
    trajectory in the first and the last stretch (the collector's calls timed on the
    writer thread, which makes them)."""
    store = root / "retention"
    spent = [0.0, 0.0]  # wall and CPU seconds of the writer thread in the collector
    timed = {name: getattr(SlotCollector, name) for name in ("collect", "delete_expired")}

    def timing(call: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                spent[1] += time.thread_time() - cpu

        return wrapped

    ratios: list[float] = []
    stretches: dict[str, dict[str, float]] = {}
    marks: dict[int, tuple[float, float, int]] = {}
    try:
        for name, call in timed.items():
            setattr(SlotCollector, name, timing(call))
        with TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=store,
            sample_window_size=WINDOW,
            cache_size=5,
            retention=Retention(last=retained, grace=0),
        ) as buffer:
            for i in range(count):
                buffer.add_trajectories([tiny(i)])
                if i == 2 * WINDOW:
                    buffer.flush()
                    buffer.save_checkpoint(root / "retention-ckpt")
                if i % 50 == 49:
                    buffer.flush()
                if (i + 1) % stretch == 0:
                    buffer.flush()
                    marks[i + 1] = (*spent, buffer.trajectory_counter - buffer.size)
                    if i + 1 > stretch:
                        ratios.append(_store_ratio(store))
    finally:
        for name, call in timed.items():
            setattr(SlotCollector, name, call)
    for label, end in (("first", stretch), ("last", count)):
        start = end - stretch
        seconds, cpu, removed = (
            marks[end][k] - marks.get(start, (0.0, 0.0, 0))[k] for k in range(3)
        )
        stretches[label] = {
            "added_before": start,
            "removed": int(removed),
            "ms_per_removed": 1000 * seconds / max(removed, 1),
            "cpu_ms_per_removed": 1000 * cpu / max(removed, 1),
        }
    return {
        "added": count,
        "retained": retained,
        "stretch": stretch,
        "store_over_kept": ratios,
        "store_over_kept_max": max(ratios, default=0.0),
        "collection": stretches,
    }


def _store_ratio(store: Path) -> float:
    """The store's bytes (every file) over the bytes of the trajectories it lists."""
    listed = read_store_documents(Location.from_url(store)).trajectory_index["trajectory_id_list"]
    kept = sum(_folder_bytes(store / "trajectories" / str(i)) for i in listed)
    return _folder_bytes(store) / kept


def run_lifecycle(quick: bool, workdir: str | None) -> dict[str, Any]:
    """Every figure of the suite (see the module docs)."""
    with tempfile.TemporaryDirectory(dir=workdir) as work:
        root = Path(work)
        (root / "local").mkdir()
        (root / "large").mkdir()
        local = local_figures(root / "local", 20 if quick else WINDOW)
        large = large_figures(root / "large", 100_000 if quick else 1_000_000)
        collected = gc_figures(root, (1_000, 10_000) if quick else (10_000, 100_000))
        retained = (
            retention_figures(root, 2_000, 100, 1_000)
            if quick
            else retention_figures(root, 10 * STRETCH)
        )
    return {
        "local": local,
        "large": large,
        "gc": collected,
        "retention": retained,
        "s3": s3_figures(20 if quick else WINDOW),
        "notes": (
            "bytes: the manifest's folder plus the pin file; the large store's log is written "
            "directly with data for the window only; on S3 the trajectories are 2x2 steps "
            "(the requests of a save do not depend on their size)"
        ),
    }


def lifecycle_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the suite, evaluated on ``results``."""
    local, large, s3 = results["local"], results["large"], results["s3"]
    retention = results["retention"]
    collection = retention["collection"]
    n = local["trajectories"]
    small, big = sorted(results["gc"], key=int)
    return [
        target(
            f"save_checkpoint ms, window of {n} image trajectories, local",
            "median of the manifest saves (pin + manifest); RLinf's copy in results.local.copy",
            1000 * local["manifest"]["seconds"],
            50,
            "<=",
        ),
        target(
            f"save_checkpoint KiB written, window of {n} image trajectories, local",
            "the manifest's folder plus its pin file",
            local["manifest"]["bytes"] / 1024,
            64,
            "<=",
        ),
        target(
            f"save_checkpoint ms, window of 100 in a store of {large['store_trajectories']:,}",
            "median of the manifest saves: no cost grows with the store",
            1000 * large["seconds"],
            50,
            "<=",
        ),
        target(
            f"save_checkpoint KiB written, store of {large['store_trajectories']:,}",
            "the manifest's folder plus its pin file",
            large["bytes"] / 1024,
            64,
            "<=",
        ),
        target(
            "save_checkpoint requests on S3 (moto, 20 ms proxy)",
            "the save path's listing (GETs), the pin's and the manifest's PUTs",
            s3.get("requests"),
            5,
            "<=",
            s3.get("unavailable"),
        ),
        target(
            "load_checkpoint of a manifest draws what the copy draws (1 = identical)",
            "10 sample(256) after loading each into a fresh buffer",
            1.0 if local["identical"] else 0.0,
            1,
            ">=",
        ),
        target(
            f"gc CPU ms per deleted trajectory at {int(big):,} vs at {int(small):,}",
            "CPU seconds of rbzarr gc --keep-last n/2 of tiny trajectories (reads the index, "
            "rewrites the log once, then one delete each; wall times in results.gc)",
            results["gc"][big]["cpu_ms_per_deleted"] / results["gc"][small]["cpu_ms_per_deleted"],
            1.2,
            "<=",
        ),
        target(
            f"retention = last {retention['retained']:,} of {retention['added']:,} tiny "
            "trajectories: store bytes over the retained and pinned trajectories' bytes",
            f"the largest ratio after every stretch of {retention['stretch']:,} past the first "
            "(every file of the store: data, index, records, pins)",
            retention["store_over_kept_max"],
            1.2,
            "<=",
        ),
        target(
            "retention: collection CPU ms per removed trajectory, the last "
            f"{retention['stretch']:,} of {retention['added']:,} vs the first",
            "CPU seconds of the collector's calls on the writer thread (record, log rewrite, "
            "deletes; wall times in results.retention.collection)",
            collection["last"]["cpu_ms_per_removed"] / collection["first"]["cpu_ms_per_removed"],
            1.2,
            "<=",
        ),
    ]
