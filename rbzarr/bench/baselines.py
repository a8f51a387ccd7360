"""What the buffer is measured against: physical limits and other ways to sample.

* *hot limit*: one ``index_select`` of the same row bytes from one contiguous tensor;
* *rlinf-style hot*: whole trajectories kept as they came; a batch flattens and indexes each
  touched one, then concatenates per key and restores the draw order;
* *per-row loop*: Python indexing of every sampled row of every key, then ``stack``;
* *cold limit*: reading and decoding the chunk files a batch read, with no zarr, no gather.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numcodecs
import torch

from rbzarr.bench.measure import clone_trajectory, stats, timed
from rbzarr.sampler import draw
from rbzarr.trajectory import Trajectory, flatten_trajectory, validate

__all__ = ["cold_limit", "draws", "hot_limit", "per_row_loop", "rlinf_hot"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LIMIT_CAP_BYTES = 1 << 30  # the hot-limit tensor holds at most this much (well past any LLC)


def hot_limit(
    rows: int, bytes_per_row: int, batch: int, calls: int, budget_s: float, seed: int
) -> dict[str, Any]:
    """One ``index_select`` of ``batch`` random rows of ``bytes_per_row`` from one tensor."""
    rows = min(rows, max(batch, LIMIT_CAP_BYTES // bytes_per_row))
    table = torch.empty((rows, bytes_per_row), dtype=torch.uint8).fill_(7)  # touch every page
    generator = torch.Generator().manual_seed(seed)

    def gather() -> torch.Tensor:
        return table.index_select(0, torch.randint(0, rows, (batch,), generator=generator))

    return {**stats(timed(gather, calls, budget_s), batch, bytes_per_row), "table_rows": rows}


def draws(
    trajectories: Sequence[Trajectory], batch: int, seed: int
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The buffer's draws over ``trajectories`` (its window), call after call, from ``seed``."""
    counts = torch.tensor([validate(t).num_samples for t in trajectories], dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    return lambda: draw(batch, counts, generator)


def rlinf_hot(
    trajectories: Sequence[Trajectory],
    batch: int,
    calls: int,
    budget_s: float,
    seed: int,
    bytes_per_row: int,
) -> dict[str, Any]:
    """Whole trajectories kept as they came; flatten and index each touched one per batch."""
    kept = [clone_trajectory(t) for t in trajectories]
    next_draw = draws(kept, batch, seed)

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

    return stats(timed(sample, calls, budget_s), batch, bytes_per_row)


def per_row_loop(
    trajectories: Sequence[Trajectory],
    batch: int,
    calls: int,
    budget_s: float,
    seed: int,
    bytes_per_row: int,
) -> dict[str, Any]:
    """Index every sampled row of every key separately in Python, then stack."""
    flats = [flatten_trajectory(t, validate(t)) for t in map(clone_trajectory, trajectories)]
    next_draw = draws(trajectories, batch, seed)
    keys = list(flats[0])

    def sample() -> dict[str, torch.Tensor]:
        positions, rows = next_draw()
        pairs = list(zip(positions.tolist(), rows.tolist(), strict=True))
        return {key: torch.stack([flats[p][key][r] for p, r in pairs]) for key in keys}

    return stats(timed(sample, calls, budget_s), batch, bytes_per_row)


def cold_limit(
    root: str, reads: list[list[tuple[str, int]]], batch: int, bytes_per_row: int
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
    return stats(latencies, batch, bytes_per_row)
