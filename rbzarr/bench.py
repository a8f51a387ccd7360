"""Sampling and write benchmarks behind ``rbzarr bench``, against baselines and limits.

Workloads (synthetic, deterministic):

* ``state``: ``T=64, B=32``; 42 float32 ``curr_obs/state`` and ``next_obs/state``, 8 float32
  actions, rewards, ``T+1``-row dones, log-probs and values;
* ``image``: ``T=32, B=16``; ``3x84x84`` uint8 ``curr_obs/image`` and ``next_obs/image``
  (flat regions, a moving square, sparse noise) plus the same per-step scalars;
* ``atari``: real frames from ``ale-py`` when it and its ROMs are installed, else skipped.

Modes, each measured with :meth:`TrajectoryReplayBuffer.sample`:

* ``hot``: every trajectory in the cache (``auto_save=False``), beside three references: the
  memory-bandwidth *limit* (one ``index_select`` of the same bytes from one contiguous
  tensor), an RLinf-style hot path (whole trajectories kept as dicts; flatten and index each
  touched one) and, for ``state``, a per-row Python loop;
* ``cold-zarr``: ``auto_save`` to a local Zarr store with a small cache and a larger window,
  so most rows miss.  Bytes read are counted by a store wrapper and compared with the
  compressed size of the chunks that hold the missed rows (recomputed from the seeded draw);
  the *limit* is reading and decoding those same chunk files, with no zarr and no gather;
* ``cold-pt``: the same with ``trajectory_format="pt"``, which loads each missed
  trajectory's whole file (RLinf's way).

Writes: ``add_trajectories`` call latency against a ``clone`` of the same trajectory, and
writer MB/s (raw bytes / time until ``flush`` returns).  Storage: bytes on disk per sample
and the compression ratio per key.  Results go to one JSON file, a PNG chart and a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import torch
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

import rbzarr
from rbzarr.buffer import TrajectoryReplayBuffer
from rbzarr.sampler import draw
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES
from rbzarr.trajectory import Trajectory, flatten_trajectory, raw_time_rows, validate

__all__ = [
    "CountingStore",
    "Settings",
    "Workload",
    "image_trajectory",
    "main",
    "run",
    "state_trajectory",
    "workloads",
]

RESULTS_DIR = Path("benchmarks") / "results"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LIMIT_CAP_BYTES = 1 << 30  # the hot-limit tensor holds at most this much (well past any LLC)


# -- workloads --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Workload:
    """A named trajectory generator: ``make(seed)`` returns one ``[T, B, ...]`` trajectory."""

    name: str
    T: int
    B: int
    batch: int
    make: Callable[[int], Trajectory]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much work one run does (see :func:`main` for the flags that set it)."""

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


def _scalars(generator: torch.Generator, T: int, B: int, actions: int) -> dict[str, Any]:
    return {
        "actions": torch.randn(T, B, actions, generator=generator),
        "rewards": torch.randn(T, B, generator=generator),
        "dones": torch.rand(T + 1, B, generator=generator) < 0.02,
        "prev_logprobs": torch.randn(T, B, generator=generator),
        "prev_values": torch.randn(T, B, generator=generator),
    }


def state_trajectory(seed: int, T: int = 64, B: int = 32) -> Trajectory:
    """A state trajectory: 42 float32 observations (smooth, as from a simulator), 8 actions."""
    generator = torch.Generator().manual_seed(seed)
    state = torch.cumsum(0.05 * torch.randn(T + 1, B, 42, generator=generator), dim=0)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={"state": state[:T].clone()},
        next_obs={"state": state[1:].clone()},
        **_scalars(generator, T, B, 8),
    )


def image_frames(generator: torch.Generator, steps: int, envs: int) -> torch.Tensor:
    """``[steps, envs, 3, 84, 84]`` uint8 frames: 7x7-pixel flat blocks, a square moving
    across them and noise on 5% of the pixels."""
    blocks = torch.randint(0, 8, (envs, 3, 12, 12), generator=generator, dtype=torch.uint8) * 32
    base = blocks.repeat_interleave(7, dim=-1).repeat_interleave(7, dim=-2)
    frames = base.unsqueeze(0).repeat(steps, 1, 1, 1, 1)
    start = torch.randint(0, 70, (envs, 2), generator=generator)
    for t in range(steps):
        for b in range(envs):
            y, x = ((start[b] + 2 * t) % 70).tolist()
            frames[t, b, :, y : y + 14, x : x + 14] = 255
    noisy = torch.rand(frames.shape, generator=generator) < 0.05
    noise = torch.randint(0, 16, frames.shape, generator=generator, dtype=torch.uint8)
    return frames + noise * noisy


def image_trajectory(seed: int, T: int = 32, B: int = 16) -> Trajectory:
    """An image trajectory: ``3x84x84`` uint8 curr/next observations, 8 actions."""
    generator = torch.Generator().manual_seed(seed)
    frames = image_frames(generator, T + 1, B)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={"image": frames[:T].clone()},
        next_obs={"image": frames[1:].clone()},
        **_scalars(generator, T, B, 8),
    )


def atari_workload(T: int = 32, B: int = 16, batch: int = 256) -> Workload:
    """Frames of ALE Pong (grayscale ``1x210x160``) under random actions, ``B`` episodes.

    Raises :class:`ImportError` or :class:`RuntimeError` when ale-py or its ROMs are missing;
    nothing is downloaded.
    """
    import ale_py  # noqa: PLC0415  (optional; usually not installed)
    import gymnasium  # noqa: PLC0415

    gymnasium.register_envs(ale_py)
    try:
        env = gymnasium.make("ALE/Pong-v5", obs_type="grayscale")
    except gymnasium.error.Error as exc:
        raise RuntimeError(f"ALE/Pong-v5 is not available: {exc}") from exc
    columns = []
    for b in range(B):
        obs, _ = env.reset(seed=b)
        frames = [torch.from_numpy(np.asarray(obs))]
        for _ in range(T):
            obs, *_ = env.step(env.action_space.sample())
            frames.append(torch.from_numpy(np.asarray(obs)))
        columns.append(torch.stack(frames))
    env.close()
    recorded = torch.stack(columns, dim=1).unsqueeze(2)  # [T+1, B, 1, 210, 160]

    def make(seed: int) -> Trajectory:
        generator = torch.Generator().manual_seed(seed)
        frames = torch.roll(recorded, shifts=seed % B, dims=1)
        return Trajectory(
            max_episode_length=T,
            model_weights_id=f"w{seed}",
            curr_obs={"image": frames[:T].clone()},
            next_obs={"image": frames[1:].clone()},
            **_scalars(generator, T, B, 1),
        )

    return Workload("atari", T, B, batch, make)


def workloads(
    names: Iterable[str], state_batch: int, image_batch: int
) -> tuple[list[Workload], list[str]]:
    """The named workloads, and a note for each one skipped."""
    found: list[Workload] = []
    notes: list[str] = []
    for name in names:
        if name == "state":
            found.append(Workload("state", 64, 32, state_batch, state_trajectory))
        elif name == "image":
            found.append(Workload("image", 32, 16, image_batch, image_trajectory))
        elif name == "atari":
            try:
                found.append(atari_workload(batch=image_batch))
            except (ImportError, RuntimeError, OSError) as exc:
                notes.append(f"atari skipped: {type(exc).__name__}: {exc}")
        else:
            raise ValueError(f"unknown workload {name!r}; expected state, image or atari")
    return found, notes


# -- measuring --------------------------------------------------------------------------
class CountingStore(WrapperStore[Store]):
    """A store wrapper that records the key and size of every read (writes pass through)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.reads: list[tuple[str, int]] = []

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        self.reads.append((key, 0 if value is None else len(value)))
        return value


def _timed(fn: Callable[[], object], calls: int, budget_s: float) -> list[float]:
    """Latencies of ``fn`` after one warm-up call: ``calls`` calls, fewer (at least 3) when
    they would exceed ``budget_s``."""
    fn()
    latencies: list[float] = []
    spent = 0.0
    while len(latencies) < calls and (len(latencies) < 3 or spent < budget_s):
        start = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - start)
        spent += latencies[-1]
    return latencies


def _stats(latencies: Sequence[float], rows: int, row_bytes: int) -> dict[str, float]:
    """Throughput from the median call (robust on a shared machine) and from the mean."""
    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    rows_s = rows / p50
    return {
        "calls": len(ordered),
        "rows_s": rows_s,
        "rows_s_mean": rows * len(ordered) / sum(ordered),
        "mb_s": rows_s * row_bytes / 1e6,
        "p50_ms": 1e3 * p50,
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
    }


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _row_bytes(trajectory: Trajectory) -> int:
    flat = flatten_trajectory(trajectory, validate(trajectory))
    return sum(t[0].numel() * t.element_size() for t in flat.values())


def _sequence(workload: Workload, settings: Settings) -> list[Trajectory]:
    """``settings.trajectories`` trajectories cycling over ``settings.pool`` distinct ones
    (the buffer copies each, so repeats cost no memory here)."""
    pool = [workload.make(settings.seed + i) for i in range(settings.pool)]
    return [pool[i % len(pool)] for i in range(settings.trajectories)]


def _add_all(
    buffer: TrajectoryReplayBuffer, trajectories: Sequence[Trajectory]
) -> dict[str, float]:
    """Add one trajectory per call; return p50/p99 call latency against a ``clone``."""
    adds, copies = [], []
    for trajectory in trajectories:
        start = time.perf_counter()
        buffer.add_trajectories([trajectory])
        adds.append(time.perf_counter() - start)
        start = time.perf_counter()
        cloned = [value.clone() for value in trajectory.tensors().values()]
        copies.append(time.perf_counter() - start)
        del cloned
    add_p50, copy_p50 = statistics.median(adds), statistics.median(copies)
    return {
        "add_p50_ms": 1e3 * add_p50,
        "add_p99_ms": 1e3 * sorted(adds)[math.ceil(0.99 * len(adds)) - 1],
        "memcpy_p50_ms": 1e3 * copy_p50,
        "add_vs_memcpy": add_p50 / copy_p50,
    }


# -- hot --------------------------------------------------------------------------------
def run_hot(workload: Workload, settings: Settings) -> dict[str, Any]:
    """Sampling with every trajectory cached, and its references (see the module docs)."""
    trajectories = _sequence(workload, settings)
    row_bytes = _row_bytes(trajectories[0])
    buffer = TrajectoryReplayBuffer(
        seed=settings.seed, sample_window_size=len(trajectories), auto_save=False
    )
    adds = _add_all(buffer, trajectories)
    latencies = _timed(lambda: buffer.sample(workload.batch), settings.hot_calls, settings.budget_s)
    result: dict[str, Any] = {
        "row_bytes": row_bytes,
        "add": adds,
        "buffer": _stats(latencies, workload.batch, row_bytes),
    }
    buffer.close()
    rows = len(trajectories) * workload.T * workload.B
    result["limit"] = _hot_limit(rows, row_bytes, workload.batch, settings)
    result["rlinf_style"] = _rlinf_hot(trajectories, workload, settings, row_bytes)
    if workload.name == "state":
        result["per_row_loop"] = _per_row_loop(trajectories, workload, settings, row_bytes)
    result["vs_limit"] = result["limit"]["rows_s"] / result["buffer"]["rows_s"]
    result["speedup_vs_rlinf_style"] = result["buffer"]["rows_s"] / result["rlinf_style"]["rows_s"]
    return result


def _hot_limit(rows: int, row_bytes: int, batch: int, settings: Settings) -> dict[str, Any]:
    """One ``index_select`` of ``batch`` random rows of ``row_bytes`` from one tensor."""
    rows = min(rows, max(batch, LIMIT_CAP_BYTES // row_bytes))
    table = torch.empty((rows, row_bytes), dtype=torch.uint8).fill_(7)  # touch every page
    generator = torch.Generator().manual_seed(settings.seed)

    def gather() -> torch.Tensor:
        return table.index_select(0, torch.randint(0, rows, (batch,), generator=generator))

    stats = _stats(_timed(gather, settings.hot_calls, settings.budget_s), batch, row_bytes)
    return {**stats, "table_rows": rows}


def _draws(
    trajectories: Sequence[Trajectory], batch: int, seed: int
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    counts = torch.tensor([validate(t).num_samples for t in trajectories], dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    return lambda: draw(batch, counts, generator)


def _rlinf_hot(
    trajectories: Sequence[Trajectory], workload: Workload, settings: Settings, row_bytes: int
) -> dict[str, Any]:
    """Whole trajectories kept as they came; a batch flattens and indexes each touched one,
    then concatenates per key and restores the draw order."""
    kept = [_copy(t) for t in trajectories]
    next_draw = _draws(kept, workload.batch, settings.seed)

    def sample() -> dict[str, torch.Tensor]:
        positions, rows = next_draw()
        parts: dict[str, list[torch.Tensor]] = {}
        order = []
        for position in torch.unique(positions).tolist():
            where = (positions == position).nonzero().squeeze(1)
            flat = flatten_trajectory(kept[position], validate(kept[position]))
            for key, value in flat.items():
                parts.setdefault(key, []).append(value.index_select(0, rows[where]))
            order.append(where)
        inverse = torch.argsort(torch.cat(order))
        return {key: torch.cat(values)[inverse] for key, values in parts.items()}

    latencies = _timed(sample, settings.hot_calls, settings.budget_s)
    return _stats(latencies, workload.batch, row_bytes)


def _per_row_loop(
    trajectories: Sequence[Trajectory], workload: Workload, settings: Settings, row_bytes: int
) -> dict[str, Any]:
    """Index every sampled row of every key separately in Python, then stack."""
    flats = [flatten_trajectory(t, validate(t)) for t in (_copy(t) for t in trajectories)]
    next_draw = _draws(trajectories, workload.batch, settings.seed)
    keys = list(flats[0])

    def sample() -> dict[str, torch.Tensor]:
        positions, rows = next_draw()
        pairs = list(zip(positions.tolist(), rows.tolist(), strict=True))
        return {key: torch.stack([flats[p][key][r] for p, r in pairs]) for key in keys}

    calls = max(3, settings.hot_calls // 10)
    return _stats(_timed(sample, calls, settings.budget_s), workload.batch, row_bytes)


def _copy(trajectory: Trajectory) -> Trajectory:
    return dataclasses.replace(
        trajectory,
        curr_obs={k: v.clone() for k, v in trajectory.curr_obs.items()},
        next_obs={k: v.clone() for k, v in trajectory.next_obs.items()},
        **{
            name: getattr(trajectory, name).clone()
            for name in ("actions", "rewards", "dones", "prev_logprobs", "prev_values")
            if getattr(trajectory, name) is not None
        },
    )


# -- cold -------------------------------------------------------------------------------
def run_cold(
    workload: Workload,
    settings: Settings,
    trajectory_format: str,
    root: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    compressed: bool = True,
) -> dict[str, Any]:
    """Sampling through a small cache from a local store in ``root`` (see the module docs)."""
    trajectories = _sequence(workload, settings)
    row_bytes = _row_bytes(trajectories[0])
    counting = CountingStore(LocalStore(root)) if trajectory_format == "zarr" else None
    options: dict[str, Any] = {}
    if counting is not None:
        options = {"store": counting, "chunk_bytes": chunk_bytes}
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
    raw = _nbytes(v for t in trajectories for v in t.tensors().values())
    start = time.perf_counter()
    adds = _add_all(buffer, trajectories)
    buffer.flush()
    write_s = time.perf_counter() - start
    result: dict[str, Any] = {
        "row_bytes": row_bytes,
        "add": adds,
        "write": {"raw_mb": raw / 1e6, "seconds": write_s, "mb_s": raw / 1e6 / write_s},
        "disk": _disk_usage(root, trajectories, trajectory_format),
    }
    reads: list[list[tuple[str, int]]] = []

    def sample() -> None:
        if counting is not None:
            counting.reads.clear()
        buffer.sample(workload.batch)
        if counting is not None:
            reads.append(list(counting.reads))

    latencies = _timed(sample, settings.cold_calls, settings.budget_s)
    buffer.close()
    reads = reads[1:]  # drop the warm-up call, as _timed does
    result["buffer"] = _stats(latencies, workload.batch, row_bytes)
    ids = list(range(len(trajectories)))
    needed = _needed_bytes(
        root, trajectories, ids, workload, settings, trajectory_format, len(latencies)
    )
    result["needed_bytes_per_batch"] = statistics.mean(needed)
    if counting is not None:
        result["bytes_read_per_batch"] = statistics.mean(sum(n for _, n in r) for r in reads)
        result["read_vs_needed"] = result["bytes_read_per_batch"] / result["needed_bytes_per_batch"]
        result["limit"] = _cold_limit(root, reads, workload.batch, row_bytes)
        result["vs_limit"] = result["limit"]["rows_s"] / result["buffer"]["rows_s"]
    else:
        result["bytes_read_per_batch"] = result["needed_bytes_per_batch"]
    return result


def _disk_usage(root: str, trajectories: Sequence[Trajectory], fmt: str) -> dict[str, Any]:
    """Bytes on disk per sample, and (zarr) the compression ratio per key."""
    samples = sum(validate(t).num_samples for t in trajectories)
    if fmt != "zarr":
        stored = sum(f.stat().st_size for f in Path(root).glob("trajectory_*.pt"))
        return {"bytes_per_sample": stored / samples, "ratio": _ratio(trajectories, None, stored)}
    ratios, total = {}, 0
    for key in trajectories[0].tensors():
        stored = sum(
            f.stat().st_size
            for f in Path(root, "trajectories").glob(f"*/{key}/c/**/*")
            if f.is_file()
        )
        total += stored
        ratios[key] = _ratio(trajectories, key, stored)
    return {
        "bytes_per_sample": total / samples,
        "ratio": _ratio(trajectories, None, total),
        "ratio_per_key": ratios,
    }


def _ratio(trajectories: Sequence[Trajectory], key: str | None, stored: int) -> float:
    raw = _nbytes(v for t in trajectories for k, v in t.tensors().items() if key in (None, k))
    return raw / stored


def _needed_bytes(
    root: str,
    trajectories: Sequence[Trajectory],
    ids: list[int],
    workload: Workload,
    settings: Settings,
    fmt: str,
    calls: int,
) -> list[int]:
    """Per batch, the compressed bytes that the missed rows need: the chunks holding them
    (zarr) or the whole files of the missed trajectories (pt).

    The draws are recomputed from the seed: the buffer's window is the last ``window`` ids,
    its cache the last ``cache`` ones, and every ``sample`` is one :func:`draw`.
    """
    window = ids[-settings.window :] if settings.window > 0 else ids
    cached = set(ids[-settings.cache :])
    next_draw = _draws([trajectories[i] for i in window], workload.batch, settings.seed)
    files = {
        int(f.name.split("_")[1]): f.stat().st_size for f in Path(root).glob("trajectory_*.pt")
    }
    arrays = _chunk_geometry(root, trajectories[0]) if fmt == "zarr" else {}
    out = []
    # One warm-up call precedes the ``calls`` timed ones; counting starts after it.
    draws = [next_draw() for _ in range(calls + 1)][1:]
    for positions, rows in draws:
        missed: dict[int, list[int]] = {}
        for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
            if window[position] not in cached:
                missed.setdefault(window[position], []).append(row)
        if fmt != "zarr":
            out.append(sum(files[tid] for tid in missed))
            continue
        total = 0
        for tid, flat_rows in missed.items():
            steps = torch.tensor(flat_rows) // workload.B
            for key, (length, k, suffix) in arrays.items():
                for chunk in torch.unique(raw_time_rows(steps, workload.T, length) // k).tolist():
                    total += os.path.getsize(
                        os.path.join(root, "trajectories", str(tid), key, f"c/{chunk}{suffix}")
                    )
        out.append(total)
    return out


def _chunk_geometry(root: str, trajectory: Trajectory) -> dict[str, tuple[int, int, str]]:
    """Per sampled key: raw row count, chunk length along time, chunk-key suffix."""
    out = {}
    for key in validate(trajectory).schema:
        array = zarr.open_array(
            store=LocalStore(root, read_only=True), path=f"trajectories/0/{key}"
        )
        out[key] = (int(array.shape[0]), int(array.chunks[0]), "/0" * (array.ndim - 1))
    return out


def _cold_limit(
    root: str, reads: list[list[tuple[str, int]]], batch: int, row_bytes: int
) -> dict[str, Any]:
    """Read and decode (zstd) the chunk files each batch read, on one thread per CPU, with
    no zarr and no gather: the floor of what a cold batch costs."""
    zstd = numcodecs.Zstd()

    def load(key: str) -> int:
        data = Path(root, key).read_bytes()
        return len(zstd.decode(data)) if data[:4] == ZSTD_MAGIC else len(data)

    latencies = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for keys in reads:
            chunks = sorted({key for key, _ in keys if "/c/" in key})
            start = time.perf_counter()
            list(pool.map(load, chunks))
            latencies.append(time.perf_counter() - start)
    return _stats(latencies, batch, row_bytes)


# -- a whole run ------------------------------------------------------------------------
def run(
    names: Sequence[str],
    settings: Settings,
    state_batch: int = 1024,
    image_batch: int = 256,
    workdir: str | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every mode of the named workloads; return the JSON-ready results document."""
    found, notes = workloads(names, state_batch, image_batch)
    results: dict[str, Any] = {}
    threads = torch.get_num_threads()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    try:
        for workload in found:
            results[workload.name] = _run_workload(workload, settings, workdir, progress)
    finally:
        torch.set_num_threads(threads)
    return {
        "benchmark": "sampling",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": _machine(),
        "versions": _versions(),
        "settings": {
            **dataclasses.asdict(settings),
            "state_batch": state_batch,
            "image_batch": image_batch,
            "workloads": list(names),
        },
        "results": results,
        "targets": targets(results),
        "notes": notes,
    }


def _run_workload(
    workload: Workload,
    settings: Settings,
    workdir: str | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    progress(f"[{workload.name}] hot")
    entry: dict[str, Any] = {"T": workload.T, "B": workload.B, "batch": workload.batch}
    entry["hot"] = run_hot(workload, settings)
    for fmt in ("zarr", "pt"):
        progress(f"[{workload.name}] cold-{fmt}")
        with tempfile.TemporaryDirectory(dir=workdir) as root:
            entry[f"cold_{fmt}"] = run_cold(workload, settings, fmt, root)
    entry["cold_zarr_vs_pt"] = (
        entry["cold_zarr"]["buffer"]["rows_s"] / entry["cold_pt"]["buffer"]["rows_s"]
    )
    if workload.name == "image" and settings.chunk_sweep:
        entry["chunk_sweep"] = _chunk_sweep(workload, settings, entry, workdir, progress)
    return entry


def _chunk_sweep(
    workload: Workload,
    settings: Settings,
    entry: dict[str, Any],
    workdir: str | None,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    rows = [_sweep_row(DEFAULT_CHUNK_BYTES, True, entry["cold_zarr"])]
    for chunk_bytes, compressed in settings.chunk_sweep:
        codec = "zstd-1" if compressed else "none"
        progress(f"[{workload.name}] cold-zarr chunk_bytes={chunk_bytes} codec={codec}")
        with tempfile.TemporaryDirectory(dir=workdir) as root:
            cold = run_cold(workload, settings, "zarr", root, chunk_bytes, compressed)
        rows.append(_sweep_row(chunk_bytes, compressed, cold))
    return rows


def _sweep_row(chunk_bytes: int, compressed: bool, cold: dict[str, Any]) -> dict[str, Any]:
    return {
        "chunk_bytes": chunk_bytes,
        "codec": "zstd-1" if compressed else "none",
        "rows_s": cold["buffer"]["rows_s"],
        "p50_ms": cold["buffer"]["p50_ms"],
        "limit_rows_s": cold["limit"]["rows_s"],
        "bytes_read_per_batch": cold["bytes_read_per_batch"],
        "write_mb_s": cold["write"]["mb_s"],
        "ratio": cold["disk"]["ratio"],
    }


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's performance targets, each with the measured value and whether it holds."""
    out = []

    def check(name: str, value: float, bound: float, higher_is_better: bool) -> None:
        met = value >= bound if higher_is_better else value <= bound
        out.append({"target": name, "value": round(value, 3), "bound": bound, "met": met})

    for workload, entry in results.items():
        if workload != "state":
            check(
                f"{workload}: hot within 1.5x of memory bandwidth",
                entry["hot"]["vs_limit"],
                1.5,
                False,
            )
        check(f"{workload}: cold zarr >= 3x pt rows/s", entry["cold_zarr_vs_pt"], 3.0, True)
        check(
            f"{workload}: bytes read <= 2x touched chunks",
            entry["cold_zarr"]["read_vs_needed"],
            2.0,
            False,
        )
        check(
            f"{workload}: add_trajectories (auto_save) within 2x memcpy",
            entry["cold_zarr"]["add"]["add_vs_memcpy"],
            2.0,
            False,
        )
        check(f"{workload}: writer >= 200 MB/s", entry["cold_zarr"]["write"]["mb_s"], 200.0, True)
    return out


def _machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
    }


def _versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zarr": zarr.__version__,
        "numcodecs": numcodecs.__version__,
        "numpy": np.__version__,
        "rbzarr": rbzarr.__version__,
    }


# -- reporting --------------------------------------------------------------------------
def table(document: dict[str, Any]) -> str:
    """The results as a plain-text table (one line per measured variant)."""
    head = f"{'workload':<8} {'variant':<22} {'rows/s':>11} {'MB/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    lines = [head, "-" * len(head)]
    for workload, entry in document["results"].items():
        for variant, stats in _variants(entry):
            lines.append(
                f"{workload:<8} {variant:<22} {stats['rows_s']:>11,.0f} {stats['mb_s']:>9,.0f} "
                f"{stats['p50_ms']:>8.2f} {stats['p99_ms']:>8.2f}"
            )
        for fmt in ("zarr", "pt"):
            cold = entry[f"cold_{fmt}"]
            add, disk = cold["add"], cold["disk"]
            lines.append(
                f"{workload:<8} {fmt:<5} read/batch {cold['bytes_read_per_batch'] / 1e6:,.2f} MB "
                f"(needed {cold['needed_bytes_per_batch'] / 1e6:,.2f} MB); add p50 "
                f"{add['add_p50_ms']:.2f} ms vs clone {add['memcpy_p50_ms']:.2f} ms; "
                f"writer {cold['write']['mb_s']:,.0f} MB/s; "
                f"disk {disk['bytes_per_sample']:,.0f} B/sample, ratio {disk['ratio']:.2f}"
            )
        ratios = entry["cold_zarr"]["disk"]["ratio_per_key"]
        lines.append(
            f"{workload:<8} ratio per key: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        )
        for row in entry.get("chunk_sweep", []):
            lines.append(
                f"{workload:<8} chunk_bytes {row['chunk_bytes']:>8} {row['codec']:<6}: "
                f"{row['rows_s']:>6,.0f} rows/s (limit {row['limit_rows_s']:,.0f}), "
                f"{row['bytes_read_per_batch'] / 1e6:,.1f} MB read/batch, "
                f"writer {row['write_mb_s']:,.0f} MB/s, ratio {row['ratio']:.2f}"
            )
    lines.append("targets:")
    for target in document["targets"]:
        mark = "met " if target["met"] else "MISS"
        lines.append(f"  [{mark}] {target['target']}: {target['value']} (bound {target['bound']})")
    lines.extend(f"note: {note}" for note in document["notes"])
    return "\n".join(lines)


def _variants(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    hot, zarr_cold, pt_cold = entry["hot"], entry["cold_zarr"], entry["cold_pt"]
    found = [
        ("hot buffer", hot["buffer"]),
        ("hot limit (index_select)", hot["limit"]),
        ("hot rlinf-style", hot["rlinf_style"]),
    ]
    if "per_row_loop" in hot:
        found.append(("hot per-row loop", hot["per_row_loop"]))
    return [
        *found,
        ("cold zarr", zarr_cold["buffer"]),
        ("cold limit (read+decode)", zarr_cold["limit"]),
        ("cold pt (whole files)", pt_cold["buffer"]),
    ]


def plot(document: dict[str, Any], path: Path) -> None:
    """A PNG of rows/s per variant (log scale), one panel per workload."""
    import matplotlib  # noqa: PLC0415  (optional: the analysis extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    entries = document["results"]
    figure, axes = plt.subplots(len(entries), 1, figsize=(9, 3 * len(entries)), squeeze=False)
    for axis, (workload, entry) in zip(axes[:, 0], entries.items(), strict=True):
        names, stats = zip(*_variants(entry), strict=True)
        axis.barh(names, [s["rows_s"] for s in stats], color="tab:blue")
        axis.set_xscale("log")
        axis.invert_yaxis()
        axis.set_title(f"{workload} (T={entry['T']}, B={entry['B']}, batch {entry['batch']})")
        axis.set_xlabel("sampled rows/s")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# -- command line -----------------------------------------------------------------------
QUICK = Settings(
    trajectories=6,
    window=5,
    cache=2,
    pool=2,
    hot_calls=20,
    cold_calls=5,
    budget_s=1.0,
    chunk_sweep=(),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rbzarr bench", description="Sampling and write throughput against baselines."
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="a tiny run (< 20 s) for smoke tests")
    add("--workloads", default="state,image,atari", help="comma-separated: state,image,atari")
    add("--out", type=Path, default=RESULTS_DIR / "sampling.json", help="JSON results file")
    add("--plot", type=Path, default=None, help="PNG chart (default: --out with .png)")
    add("--no-plot", action="store_true", help="skip the chart")
    add("--trajectories", type=int, help="trajectories added per mode (default 100)")
    add("--window", type=int, help="sample_window_size of the cold modes (default 100)")
    add("--cache", type=int, help="cache_size of the cold modes (default 5)")
    add("--pool", type=int, help="distinct trajectories generated and cycled (default 8)")
    add("--hot-calls", type=int, help="sample() calls per hot variant (default 200)")
    add("--cold-calls", type=int, help="sample() calls per cold variant (default 30)")
    add("--budget", type=float, help="seconds at most per timed variant (default 6)")
    add("--state-batch", type=int, default=1024, help="rows per state sample() (default 1024)")
    add("--image-batch", type=int, default=256, help="rows per image sample() (default 256)")
    add(
        "--chunk-sweep",
        help="extra cold image runs: comma-separated chunk_bytes, ':none' for no compression "
        "(default 262144,262144:none; '' for none)",
    )
    add(
        "--threads",
        type=int,
        help="torch intra-op threads (default 1: stable on a busy machine; 0 keeps torch's)",
    )
    add("--workdir", help="directory for the temporary stores (default: the system's)")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else Settings()
    changes: dict[str, Any] = {
        field: getattr(args, field)
        for field in (
            "trajectories",
            "window",
            "cache",
            "pool",
            "hot_calls",
            "cold_calls",
            "threads",
        )
        if getattr(args, field) is not None
    }
    if args.budget is not None:
        changes["budget_s"] = args.budget
    if args.chunk_sweep is not None:
        changes["chunk_sweep"] = tuple(
            (int(v.partition(":")[0]), v.partition(":")[2] != "none")
            for v in args.chunk_sweep.split(",")
            if v.strip()
        )
    settings = dataclasses.replace(base, **changes)
    if settings.cache <= 0 or settings.trajectories <= 0 or settings.pool <= 0:
        raise ValueError("--trajectories, --cache and --pool must be positive")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark from command-line arguments; write JSON and PNG, print a table."""
    args = _parser().parse_args(argv)
    settings = _settings(args)
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    state_batch, image_batch = (128, 32) if args.quick else (args.state_batch, args.image_batch)
    document = run(names, settings, state_batch, image_batch, args.workdir)
    print(table(document))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not args.no_plot:
        chart = args.plot or args.out.with_suffix(".png")
        plot(document, chart)
        print(f"wrote {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
