"""Sampled rows of zarr-layout trajectories, read into preallocated batch blocks.

Rows of several trajectories land in one call: layout-2 shards through a
:class:`~rbzarr.storage.shard_trajectory.RowBatch` (memory-map gathers, ``pread`` or one
round of byte ranges), arrays that zarr reads (layout 1, or kind ``"zarr"``) through
:func:`rbzarr.storage.zarr_chunks.read_rows`, their chunks fetched in one concurrent round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from zarr.core.array import AsyncArray
from zarr.core.sync import sync

from rbzarr.dtypes import from_numpy, to_numpy
from rbzarr.errors import CorruptStoreError
from rbzarr.storage import shard_trajectory as sharded
from rbzarr.storage import zarr_chunks as chunk_io
from rbzarr.storage.layout import Entry
from rbzarr.storage.location import Location
from rbzarr.storage.shard_remote import IOStats
from rbzarr.storage.zarr_handles import Opened, time_and_envs, trajectory_id
from rbzarr.trajectory import raw_time_rows

__all__ = ["check_keys", "read_rows_into", "zarr_arrays"]


def read_rows_into(
    location: Location,
    opened: Sequence[Opened],
    requests: Sequence[tuple[Entry, torch.Tensor, int]],
    keys: Sequence[str],
    out: Mapping[str, torch.Tensor],
    stats: IOStats,
) -> None:
    """Fill ``out[key][start:start + len(rows)]`` for each request ``(entry, rows, start)``.

    ``opened`` holds the handles of each request's trajectory.  At most one gather or one
    batch of pieces per (trajectory, key); every remote range in one round.
    """
    views: dict[str, np.ndarray] = {}
    batch = sharded.RowBatch(views, stats)
    plain: list[Any] = []
    for (entry, rows, start), handles in zip(requests, opened, strict=True):
        check_keys(handles, keys, location.url, sampled=True)
        steps, envs, T, B = _steps_and_envs(entry, rows)
        arrays = zarr_arrays(handles, keys)
        plain.extend((arrays[key], key, steps, envs, T, start) for key in arrays)
        if not isinstance(handles, sharded.ShardedTrajectory):
            continue
        elements: dict[int, np.ndarray] = {}
        for key in keys:
            if key in arrays:
                continue
            length = handles.shape(key)[0]
            if length not in elements:
                raw = steps if length == T else raw_time_rows(torch.from_numpy(steps), T, length)
                elements[length] = np.asarray(raw) * B + envs
            if key not in views:
                views[key] = _byte_view(out[key])
            batch.add(handles, key, elements[length], start, start + len(steps))
    batch.run(location.fs)
    _read_plain(plain, out)


def _read_plain(reads: list[Any], out: Mapping[str, torch.Tensor]) -> None:
    if not reads:
        return
    blocks = sync(
        chunk_io.gather(
            *(
                chunk_io.read_rows(array, torch.from_numpy(steps), envs, T)
                for array, _, steps, envs, T, _ in reads
            )
        )
    )
    for (_, key, steps, _, _, start), block in zip(reads, blocks, strict=True):
        target = out[key][start : start + len(steps)]
        target.copy_(from_numpy(block, target.dtype))


def check_keys(opened: Opened, keys: Sequence[str], url: str, sampled: bool = False) -> None:
    """Refuse keys the trajectory lacks, and (``sampled``) keys without ``[T, B]`` rows."""
    for key in keys:
        if key not in opened.dtypes:
            raise CorruptStoreError(
                f"{url}/{opened.group} has no field {key!r}; it holds {sorted(opened.dtypes)}"
            )
        shape = opened.shape(key)
        if sampled and len(shape) < 2:
            raise ValueError(
                f"field {key!r} of {url}/{opened.group} has shape {shape}; only [T, B, ...] "
                "fields can be read by rows"
            )


def zarr_arrays(opened: Opened, keys: Sequence[str]) -> dict[str, AsyncArray[Any]]:
    """The handles of those ``keys`` that zarr reads."""
    return {key: opened.arrays[key] for key in keys if key in opened.arrays}


def _steps_and_envs(entry: Entry, rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray, int, int]:
    T, B = time_and_envs(entry)
    flat = torch.as_tensor(rows, dtype=torch.int64).reshape(-1).numpy()
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= T * B):
        raise IndexError(
            f"trajectory {trajectory_id(entry)}: rows must be in [0, {T * B}), "
            f"got min {int(flat.min())}, max {int(flat.max())}"
        )
    steps, envs = np.divmod(flat, B)
    return steps, envs, T, B


def _byte_view(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as writable uint8 rows ``[len, row_bytes]`` (its own memory)."""
    array = to_numpy(tensor)
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat.view(np.uint8)
