"""Disk-backed sampling: a local store, a small cache and a larger window, so most rows miss."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fsspec

from benchmarks.accounting import CountingByteSource, NeededReads, StoreGeometry
from benchmarks.baselines import RangeReader
from benchmarks.draws import DrawSequence, TrackedBuffer, gather_rows, same_rows
from benchmarks.limits import retire
from benchmarks.measure import add_all, add_latency, interleaved, nbytes, row_bytes, stats, timed
from benchmarks.page_cache import evict, process_read_bytes
from benchmarks.settings import Settings
from benchmarks.store_size import disk_usage
from benchmarks.torchrl_peer import TorchRLPeer, torchrl_missing
from benchmarks.workloads import Workload, trajectory_sequence
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory import tree
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

__all__ = ["DiskRun", "run_disk"]


class DiskRun:
    """The stores, buffers and draws of one workload's disk-backed modes, under ``root``."""

    def __init__(self, workload: Workload, settings: Settings, root: str) -> None:
        self.workload, self.settings, self.root = workload, settings, Path(root)
        self.trajectories = trajectory_sequence(workload, settings)
        self.row_bytes = row_bytes(self.trajectories[0])
        self.window = settings.window or workload.window
        window = self.trajectories[-self.window :]
        self.flats = [flatten_trajectory(t, validate(t)) for t in window]
        ids = list(range(len(self.trajectories)))
        self.window_ids = ids[-self.window :]
        self.cached = set(ids[-settings.cache :])
        counts = [validate(t).num_samples for t in window]
        self.draws = DrawSequence(counts, workload.batch, settings.seed)
        self.zarr_root, self.pt_root = str(self.root / "zarr"), str(self.root / "pt")
        self.counted_reads = CountingByteSource()  # what the Zarr layout's own reads asked for
        self.zarr, self.writes = self._write(self.zarr_root, "zarr")
        self.pt, self.writes_pt = self._write(self.pt_root, "pt")
        spec = validate(self.trajectories[0])
        fs = fsspec.filesystem("file")
        self.geometry = StoreGeometry(fs, self.zarr_root, list(spec.schema), spec.T, spec.B)
        self.reader = RangeReader(self.zarr_root)

    def _write(self, root: str, fmt: str) -> tuple[TrackedBuffer, dict[str, Any]]:
        """The store at ``root`` written by a timed buffer (the writer's MB/s), then each
        add's latency against a clone, paired, in a second store (the clones would slow
        the first one's adds below the writer's pace)."""
        options = {"byte_source": self.counted_reads} if fmt == "zarr" else {}
        buffer = self._buffer(root, fmt, options)
        raw = nbytes(v for t in self.trajectories for v in t.tensors().values())
        start = time.perf_counter()
        for trajectory in self.trajectories:
            buffer.add_trajectories([trajectory])
        buffer.flush()
        seconds = time.perf_counter() - start
        with self._buffer(f"{root}-adds", fmt, {}) as paired:
            adds, copies = add_all(paired, self.trajectories)
        retire(f"{root}-adds")
        writes = {
            "add": add_latency(adds, copies),
            "writer": {"raw_mb": raw / 1e6, "seconds": seconds, "mb_s": raw / 1e6 / seconds},
            "disk": disk_usage(root, self.trajectories, fmt),
        }
        return TrackedBuffer(buffer, self.workload.batch), writes

    def _buffer(self, root: str, fmt: str, options: dict[str, Any]) -> TrajectoryReplayBuffer:
        """An ``auto_save`` buffer at ``root`` whose queue holds every trajectory."""
        return TrajectoryReplayBuffer(
            seed=self.settings.seed,
            cache_size=self.settings.cache,
            sample_window_size=self.window,
            auto_save=True,
            auto_save_path=root,
            trajectory_format=fmt,
            max_pending_writes=len(self.trajectories) + 1,  # the call, not the backpressure
            layout_options=options,
        )

    def needed(self, k: int) -> NeededReads:
        """What the ``k``-th batch's missed rows need from the Zarr store."""
        positions, rows = self.draws.at(k)
        missed: dict[int, list[int]] = {}
        for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
            tid = self.window_ids[position]
            if tid not in self.cached:
                missed.setdefault(tid, []).append(row)
        return self.geometry.needed(missed)

    def check_same_rows(self) -> bool:
        """One batch from each buffer equals the rows the draw names."""
        k = self.zarr.calls
        if self.pt.calls != k:
            raise RuntimeError(f"buffers out of step: zarr at draw {k}, pt at {self.pt.calls}")
        expected = gather_rows(self.flats, *self.draws.at(k))
        zarr_ok = same_rows(tree.flatten(self.zarr.sample()), expected)
        return same_rows(tree.flatten(self.pt.sample()), expected) and zarr_ok

    def close(self) -> None:
        """Close the buffers and the range reader."""
        self.reader.close()
        self.zarr.buffer.close()
        self.pt.buffer.close()


def run_disk(
    workload: Workload, settings: Settings, root: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """The write figures and the ``warm`` / ``cold`` modes the workload asks for."""
    say(f"[{workload.name}] writing stores")
    run = DiskRun(workload, settings, root)
    try:
        result: dict[str, Any] = {"writes": run.writes, "writes_pt": run.writes_pt}
        result["same_rows"] = run.check_same_rows()
        if "warm" in workload.modes:
            say(f"[{workload.name}] warm")
            result["warm"] = _warm(run)
        if "cold" in workload.modes:
            say(f"[{workload.name}] cold")
            result["cold"] = _cold(run)
    finally:
        run.close()
    return result


def _needed_summary(run: DiskRun, calls: Sequence[int]) -> dict[str, Any]:
    needed = [run.needed(k) for k in calls]
    return {
        "bytes_per_batch": statistics.mean(n.bytes for n in needed),
        "chunks_per_batch": statistics.mean(n.chunks for n in needed),
        "ranges_per_batch": statistics.mean(len(n.coalesced()) for n in needed),
        "piece_bytes_per_batch": statistics.mean(n.piece_bytes for n in needed),
        "page_bytes_per_batch": statistics.mean(n.page_bytes for n in needed),
        "piece_ranges_per_batch": statistics.mean(len(n.coalesced_pieces()) for n in needed),
    }


def _warm(run: DiskRun) -> dict[str, Any]:
    settings, batch, per_row = run.settings, run.workload.batch, run.row_bytes
    calls, budget = settings.warm_calls, settings.budget_s
    first = run.zarr.calls
    before = (run.counted_reads.requests, run.counted_reads.bytes)
    peer = _torchrl_peer(run)
    if peer is None:
        zarr_latencies = timed(run.zarr.sample, calls, budget)
        out: dict[str, Any] = _torchrl_unavailable()
    else:
        # Call for call with the buffer, on the same draws (the warm-up call included).
        # TorchRL's own ReplayBuffer.sample (random rows) in the same rounds.
        batches = iter(range(first, first + 2 * calls + 2))
        zarr_latencies, peer_latencies, sample_latencies = interleaved(
            [
                run.zarr.sample,
                lambda: peer.get(peer.indices(*run.draws.at(next(batches)))),
                lambda: peer.sample(run.workload.batch),
            ],
            calls,
            budget,
        )
        out = _torchrl_warm(run, peer, first, peer_latencies, sample_latencies)
    timed_calls = range(first + 1, first + 1 + len(zarr_latencies))
    out["zarr"] = stats(zarr_latencies, batch, per_row)
    out["zarr"].update(_layout_reads(run, before, len(zarr_latencies) + 1))
    out["needed"] = _needed_summary(run, timed_calls)
    # The same batches as the buffer's (same count, no budget), so both stay in step.
    out["pt"] = stats(timed(run.pt.sample, len(zarr_latencies), float("inf")), batch, per_row)
    return out


def _layout_reads(run: DiskRun, before: tuple[int, int], calls: int) -> dict[str, float]:
    """Requests and bytes the layout's reads asked for per call (warm-up included)."""
    return {
        "layout_requests_per_batch": (run.counted_reads.requests - before[0]) / calls,
        "layout_bytes_per_batch": (run.counted_reads.bytes - before[1]) / calls,
    }


def _torchrl_peer(run: DiskRun) -> TorchRLPeer | None:
    """The window's rows in a ``LazyMemmapStorage`` (``None`` without torchrl)."""
    if torchrl_missing() is not None:
        return None
    return TorchRLPeer(run.flats, scratch_dir=str(run.root / "torchrl"))


def _torchrl_unavailable() -> dict[str, Any]:
    missing = torchrl_missing()
    return {
        "torchrl_memmap": {"unavailable": missing},
        "torchrl_sample": {"unavailable": missing},
    }


def _torchrl_warm(
    run: DiskRun, peer: TorchRLPeer, first: int, latencies: list[float], sampled: list[float]
) -> dict[str, Any]:
    batch, per_row = run.workload.batch, run.row_bytes
    expected = gather_rows(run.flats, *run.draws.at(first))
    checked = same_rows(peer.get(peer.indices(*run.draws.at(first))), expected)
    memmap = {"storage": peer.kind, "same_rows": checked, **stats(latencies, batch, per_row)}
    return {"torchrl_memmap": memmap, "torchrl_sample": stats(sampled, batch, per_row)}


def _timed_cold(
    fn: Callable[[], object], roots: Sequence[str], calls: int, budget_s: float, whole: bool
) -> tuple[list[float], list[int], str]:
    """Latencies and disk bytes read of ``calls`` calls of ``fn``, the page cache emptied before
    each (the eviction is not timed), after one warm-up call.
    """
    fn()
    latencies: list[float] = []
    read: list[int] = []
    method = "none"
    while len(latencies) < calls and (len(latencies) < 3 or sum(latencies) < budget_s):
        method = evict(roots, whole)
        before = process_read_bytes()
        start = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - start)
        after = process_read_bytes()
        read.append(-1 if before is None or after is None else after - before)
    return latencies, read, method


def _cold(run: DiskRun) -> dict[str, Any]:
    settings, batch, per_row = run.settings, run.workload.batch, run.row_bytes
    calls, budget = settings.cold_calls, settings.budget_s
    roots, whole = [run.zarr_root, run.pt_root], settings.drop_caches
    first = run.zarr.calls
    before = (run.counted_reads.requests, run.counted_reads.bytes)
    latencies, read, method = _timed_cold(run.zarr.sample, roots, calls, budget, whole)
    timed_calls = range(first + 1, first + 1 + len(latencies))
    needed = _needed_summary(run, timed_calls)
    out: dict[str, Any] = {"evict_method": method, "needed": needed}
    out["zarr"] = {
        **stats(latencies, batch, per_row),
        "bytes_read_per_batch": statistics.mean(read),
        **_layout_reads(run, before, len(latencies) + 1),
    }
    out["read_vs_needed"] = out["zarr"]["bytes_read_per_batch"] / needed["page_bytes_per_batch"]
    latencies, read, _ = _timed_cold(run.pt.sample, roots, len(timed_calls), float("inf"), whole)
    out["pt"] = {**stats(latencies, batch, per_row), "bytes_read_per_batch": statistics.mean(read)}
    batches = itertools.cycle([run.needed(k).coalesced_pieces() for k in timed_calls])
    latencies, read, _ = _timed_cold(
        lambda: run.reader.read(next(batches)), roots, len(timed_calls), float("inf"), whole
    )
    out["limit"] = {
        **stats(latencies, batch, per_row),
        "bytes_read_per_batch": statistics.mean(read),
    }
    return out
