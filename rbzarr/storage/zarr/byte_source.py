"""Where the zarr layout's row reads get their bytes: one seam for local and remote shards.

Every row read of a shard asks a :class:`ByteSource`: a gather out of a local memory map, a
``pread`` of a local shard, or a round of byte ranges of remote objects (fsspec's
``cat_ranges``, concurrent on its event loop, or obstore's client where the location allows:
:mod:`rbzarr.storage.io.object_ranges`).  Wrap one to observe its reads, as zarr's
``LoggingStore`` wraps a store; the benchmark counts requests and bytes that way
(``benchmarks/accounting.py``, outside the package).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.object_ranges import ObjectRanges

__all__ = ["ByteSource"]


class ByteSource:
    """Reads shard bytes as asked: memory-map gathers, local ``pread``, remote ranges.

    Parameters
    ----------
    remote
        obstore's client for the remote ranges, or ``None``: the filesystem's ``cat_ranges``.
    """

    def __init__(self, remote: ObjectRanges | None = None) -> None:
        self.remote = remote

    def gather(self, rows: np.ndarray, elements: np.ndarray) -> np.ndarray:
        """Rows ``elements`` of a memory-mapped shard's ``[count, row_bytes]`` uint8 rows."""
        return rows[elements]

    def gather_into(self, rows: np.ndarray, elements: np.ndarray, out: np.ndarray) -> None:
        """:meth:`gather` into ``out`` (no gathered copy; ``elements`` are checked already)."""
        np.take(rows, elements, out=out, mode="clip")

    def pread(self, fd: int, nbytes: int, offset: int) -> bytes:
        """``nbytes`` at ``offset`` of an open local shard."""
        return os.pread(fd, nbytes, offset)

    def cat_ranges(
        self, fs: Any, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None]
    ) -> list[Any]:
        """Byte ranges of objects on ``fs`` in one round; a failed one is its exception."""
        bounded = [end for end in ends if end is not None]
        if self.remote is not None and len(bounded) == len(ends) and self.remote.usable():
            return self.remote.cat_ranges(paths, starts, bounded)
        moved = sum(end - start for start, end in zip(starts, ends, strict=True) if end is not None)
        deadline = deadline_options(fs, moved)
        return list(
            fs.cat_ranges(list(paths), list(starts), list(ends), on_error="return", **deadline)
        )
