"""Arrays that zarr itself reads: every array of a layout-1 trajectory, and layout-2 arrays
of kind ``"zarr"`` (0-d, zero-size, or a codec other than zstd).

Only zarr's public indexing is used (``AsyncArray.getitem`` and orthogonal selections), so
whatever zarr can open reads.  This is slower than the shard reader; for layout-1 stores it
is the upgrade path: ``rbzarr export`` rewrites them in layout 2, and checkpoints of them
are written in layout 2.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from zarr.core.array import AsyncArray

from rbzarr.errors import CorruptStoreError

__all__ = ["gather", "read_rows", "read_whole"]


async def gather(*awaitables: Any) -> list[Any]:
    """``asyncio.gather`` whose first failure cancels the rest and waits for them (reads
    still in flight would otherwise outlive the call that raised)."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def read_whole(array: AsyncArray[Any], where: str) -> np.ndarray:
    """All of ``array`` (writable); ``where`` names it in errors."""
    try:
        return np.array(await array.getitem(...))
    except (RuntimeError, ValueError) as exc:
        raise CorruptStoreError(f"{where}: a chunk does not decode: {exc}") from exc


async def read_rows(
    array: AsyncArray[Any], raw: np.ndarray, envs: np.ndarray, where: str
) -> np.ndarray:
    """Rows ``(raw, envs)`` of a ``[T(+E), B, ...]`` array (``raw``: stored time rows, reset
    rows counted): one orthogonal selection of the distinct time rows, then a gather."""
    if raw.size == 0 or 0 in array.shape[2:]:
        return np.empty((raw.size, *array.shape[2:]), dtype=array.dtype)
    times, inverse = np.unique(raw, return_inverse=True)
    selection: tuple[Any, ...] = (times, *([slice(None)] * (array.ndim - 1)))
    try:
        block = np.asarray(await array.get_orthogonal_selection(selection))
    except (RuntimeError, ValueError) as exc:
        raise CorruptStoreError(f"{where}: a chunk does not decode: {exc}") from exc
    return np.ascontiguousarray(block[inverse, envs])
