"""Sampled rows of zarr-layout trajectories, read into preallocated batch blocks.

Rows of several trajectories land in one call: shards through the layout's
:class:`~rbzarr.storage.zarr.byte_source.ByteSource` (memory-map gathers here, ``pread`` or
one round of byte ranges through a :class:`~rbzarr.storage.zarr.sharded.RowBatch`), arrays
that zarr reads (layout 1, or kind ``"zarr"``) through :func:`rbzarr.storage.zarr.arrays.read_rows`,
all of them in one concurrent round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from zarr.core.array import AsyncArray

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.deadlines import sync
from rbzarr.storage.documents import Entry
from rbzarr.storage.location import Location
from rbzarr.storage.zarr import arrays
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.handles import time_and_envs, trajectory_id
from rbzarr.storage.zarr.sharded import RowBatch, ShardedTrajectory
from rbzarr.trajectory.dtypes import byte_rows, from_numpy

__all__ = ["check_keys", "read_rows_into", "reset_row_elements", "zarr_arrays"]


def read_rows_into(
    location: Location,
    opened: Sequence[ShardedTrajectory],
    requests: Sequence[tuple[Entry, torch.Tensor, torch.Tensor]],
    keys: Sequence[str],
    out: Mapping[str, torch.Tensor],
    source: ByteSource,
) -> None:
    """Fill rows ``positions`` of ``out[key]`` for each request ``(entry, rows, positions)``.

    ``opened`` holds the handles of each request's trajectory.  At most one gather or one
    batch of pieces per (trajectory, key); every remote range in one round.  Rows of small
    uncompressed keys are gathered from memory maps here directly: this loop is the cost
    of a warm batch, so it does no more per (trajectory, key) than one numpy gather.
    """
    views = {key: byte_rows(out[key]) for key in keys}
    batch = RowBatch(views, source)
    plain: list[Any] = []
    wanted = tuple(keys)
    deferred: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for (entry, rows, where), handles in zip(requests, opened, strict=True):
        plan = handles.plans.get(wanted)
        if plan is None:
            check_keys(handles, keys, location.url, sampled=True)
            plan = handles.plans[wanted] = _row_plan(handles, keys)
        flat, T, B = _checked_rows(entry, rows)
        positions = where.numpy()
        elements = {0: flat}
        for key, local, epochs, array in plan:
            if array is not None:
                plain.append((array, key, flat // B, flat % B, T, where))
                continue
            if epochs not in elements:
                elements[epochs] = reset_row_elements(flat, T, B, epochs)
            if local is None:
                batch.add(handles, key, elements[epochs], positions)
            elif local.prefetches:
                local.prefetch(elements[epochs])
                deferred.append((views[key], positions, local.rows, elements[epochs]))
            else:
                views[key][positions] = source.gather(local.rows, elements[epochs])
    for view, targets, mapped, chosen in deferred:  # after every prefetch was issued
        view[targets] = source.gather(mapped, chosen)
    batch.run(location.fs)
    _read_plain(plain, out, location.url)


def _row_plan(handles: ShardedTrajectory, keys: Sequence[str]) -> list[tuple[str, Any, int, Any]]:
    """Per key: ``(key, memory-mapped local shard or None, reset epochs, zarr array or
    None)``."""
    by_zarr = zarr_arrays(handles, keys)
    plan: list[tuple[str, Any, int, Any]] = []
    for key in keys:
        if key in by_zarr:
            plan.append((key, None, 0, by_zarr[key]))
            continue
        local = handles.local.get(key)
        mapped = None if local is None or local.rows is None else local
        plan.append((key, mapped, handles.shape(key)[0] - handles.T, None))
    return plan


def reset_row_elements(flat: np.ndarray, T: int, B: int, epochs: int) -> np.ndarray:
    """Elements ``raw_t * B + b`` of flat rows in a field with ``T + epochs`` raw rows.

    The numpy counterpart of :func:`rbzarr.trajectory.model.raw_time_rows`: each of the
    ``epochs`` episodes of ``T // epochs`` steps has one extra (reset) row.
    """
    if epochs <= 0:
        return flat
    steps = flat // B
    return flat + (steps // (T // epochs) + 1) * B


def _read_plain(reads: list[Any], out: Mapping[str, torch.Tensor], url: str) -> None:
    """Rows of the arrays zarr reads, every array's selection in one concurrent round."""
    if not reads:
        return
    blocks = sync(
        arrays.gather(
            *(
                arrays.read_rows(array, torch.from_numpy(steps), envs, T, f"{url}/{array.path}")
                for array, _, steps, envs, T, _ in reads
            )
        )
    )
    for (_, key, _, _, _, where), block in zip(reads, blocks, strict=True):
        out[key].index_copy_(0, where, from_numpy(block, out[key].dtype))


def check_keys(
    opened: ShardedTrajectory, keys: Sequence[str], url: str, sampled: bool = False
) -> None:
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


def zarr_arrays(opened: ShardedTrajectory, keys: Sequence[str]) -> dict[str, AsyncArray[Any]]:
    """The handles of those ``keys`` that zarr reads."""
    return {key: opened.arrays[key] for key in keys if key in opened.arrays}


def _checked_rows(entry: Entry, rows: torch.Tensor) -> tuple[np.ndarray, int, int]:
    """The flat rows as numpy, with the entry's ``T, B``."""
    T, B = time_and_envs(entry)
    flat = torch.as_tensor(rows, dtype=torch.int64).reshape(-1).numpy()
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= T * B):
        raise IndexError(
            f"trajectory {trajectory_id(entry)}: rows must be in [0, {T * B}), "
            f"got min {int(flat.min())}, max {int(flat.max())}"
        )
    return flat, T, B
