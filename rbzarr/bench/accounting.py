"""Byte accounting: what a batch of rows needs to read from a Zarr store.

The needed bytes of a batch come from the store's public format only: each array's Zarr v3
metadata (``zarr.json``: shape, chunk grid, chunk key encoding, ``sharding_indexed``
configuration) and, for sharded arrays, the shard index (``offset, nbytes`` little-endian
uint64 pairs per inner chunk, C order, then a crc32c; ``2**64 - 1`` marks an empty chunk).
A row ``(t, b)`` of a ``[T, B, ...]`` array needs every inner chunk (or, unsharded, every
chunk file) that holds part of it: those are the *chunks*.  Inside an uncompressed inner
chunk the row is one contiguous run of bytes (C order, time and env outermost), so its
*pieces* are just those bytes; in a compressed one the piece is the whole inner chunk.
Adjacent or overlapping byte ranges of one object coalesce.  A disk reads whole pages, so
the least a truly cold batch can read is its pieces rounded out to pages (``page_bytes``).

What the layout's reads actually ask for is counted by :class:`CountingByteSource`, a
wrapper around the layout's byte source (``layout_options={"byte_source": ...}``).
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.trajectory.model import raw_time_rows

__all__ = [
    "ArrayGeometry",
    "ByteRange",
    "CountingByteSource",
    "NeededReads",
    "StoreGeometry",
    "coalesce",
]

EMPTY = 2**64 - 1
PAGE = mmap.PAGESIZE
ByteRange = tuple[str, int, int]  # object path, start, stop


@dataclass(frozen=True)
class ArrayGeometry:
    """Where the chunks of one array live, read from its ``zarr.json``.

    Parameters
    ----------
    path
        The array's path below the store root, e.g. ``trajectories/0/rewards``.
    shape
        The array's shape (``[T(+E), B, ...]``).
    chunks
        The chunk (for a sharded array: shard) shape.
    inner
        The inner chunk shape of a sharded array; ``None`` when unsharded.
    index_at_end
        Whether the shard index follows the inner chunks (else it leads).
    index_bytes
        Size of a shard's index, its crc32c included; 0 when unsharded.
    key_prefix, separator
        How chunk keys are spelt: ``"c/"`` and ``"/"`` for Zarr's default encoding.
    itemsize
        Bytes per element of the array's data type.
    uncompressed
        Whether the inner chunks are stored raw (codecs ``["bytes"]`` only).
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    inner: tuple[int, ...] | None
    index_at_end: bool
    index_bytes: int
    key_prefix: str
    separator: str
    itemsize: int = 1
    uncompressed: bool = False

    @classmethod
    def from_metadata(cls, path: str, metadata: Mapping[str, Any]) -> ArrayGeometry:
        """Geometry of the array at ``path`` from its parsed ``zarr.json``.

        Parameters
        ----------
        path
            The array's path below the store root.
        metadata
            The parsed ``zarr.json`` document of the array.

        Returns
        -------
        ArrayGeometry
            The chunk grid, key encoding and (if sharded) shard configuration.
        """
        chunks = tuple(metadata["chunk_grid"]["configuration"]["chunk_shape"])
        encoding = metadata.get("chunk_key_encoding", {"name": "default"})
        default = encoding.get("name") == "default"
        separator = encoding.get("configuration", {}).get("separator", "/" if default else ".")
        inner, at_end, index_bytes, uncompressed = None, True, 0, False
        first = metadata["codecs"][0]
        if first["name"] == "sharding_indexed":
            config = first["configuration"]
            inner = tuple(config["chunk_shape"])
            at_end = config.get("index_location", "end") == "end"
            count = math.prod(c // i for c, i in zip(chunks, inner, strict=True))
            checksum = any(c["name"] == "crc32c" for c in config.get("index_codecs", []))
            index_bytes = 16 * count + (4 if checksum else 0)
            uncompressed = [c["name"] for c in config.get("codecs", [])] == ["bytes"]
        return cls(
            path=path,
            shape=tuple(metadata["shape"]),
            chunks=chunks,
            inner=inner,
            index_at_end=at_end,
            index_bytes=index_bytes,
            key_prefix=f"c{separator}" if default else "",
            separator=separator,
            itemsize=np.dtype(metadata["data_type"]).itemsize,
            uncompressed=uncompressed,
        )

    def object_key(self, coords: Sequence[int]) -> str:
        """The store key of the chunk (or shard) at grid ``coords``.

        Parameters
        ----------
        coords
            The chunk's grid coordinates, one per dimension.

        Returns
        -------
        str
            E.g. ``trajectories/0/rewards/c/0/0``.
        """
        return f"{self.path}/{self.key_prefix}{self.separator.join(map(str, coords))}"

    def outer_trailing(self) -> list[tuple[int, ...]]:
        """Grid coordinates of the chunks (shards) along the trailing (per-row) dimensions.

        Returns
        -------
        list of tuple of int
            Every coordinate tuple of the trailing grid, in C order (``[()]`` for none).
        """
        return _grid(self.shape[2:], self.chunks[2:])

    def inner_trailing(self) -> list[tuple[int, ...]]:
        """Grid coordinates of a shard's inner chunks along the trailing dimensions.

        Returns
        -------
        list of tuple of int
            Every coordinate tuple of the trailing inner grid, in C order.
        """
        assert self.inner is not None
        return _grid(self.chunks[2:], self.inner[2:])


class CountingByteSource(ByteSource):
    """Counts the requests and bytes of the zarr layout's shard reads, then reads through
    ``inner``: each ``pread`` and each remote range is a request, memory-map gathers count
    bytes only (reset the counters freely)."""

    def __init__(self, inner: ByteSource | None = None) -> None:
        self.inner = ByteSource() if inner is None else inner
        self.requests = 0
        self.bytes = 0

    def gather(self, rows: np.ndarray, elements: np.ndarray) -> np.ndarray:
        # docstring inherited
        found = self.inner.gather(rows, elements)
        self.bytes += found.nbytes
        return found

    def pread(self, fd: int, nbytes: int, offset: int) -> bytes:
        # docstring inherited
        data = self.inner.pread(fd, nbytes, offset)
        self.requests += 1
        self.bytes += len(data)
        return data

    def cat_ranges(
        self, fs: Any, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None]
    ) -> list[Any]:
        # docstring inherited
        found = self.inner.cat_ranges(fs, paths, starts, ends)
        self.requests += len(paths)
        self.bytes += sum(len(data) for data in found if isinstance(data, bytes))
        return found


def _grid(extent: Sequence[int], block: Sequence[int]) -> list[tuple[int, ...]]:
    counts = [math.ceil(n / b) for n, b in zip(extent, block, strict=True)]
    return list(itertools.product(*(range(c) for c in counts)))


@dataclass
class NeededReads:
    """What a batch needs: whole chunks (``ranges``) and the rows' own bytes (``pieces``),
    each distinct and sorted.

    Parameters
    ----------
    chunks, bytes
        The number of distinct chunk ranges, and their bytes.
    piece_bytes
        The distinct pieces' bytes.
    page_bytes
        The bytes of the pages holding the pieces (pieces rounded out to pages, coalesced).
    ranges
        The distinct ``(key, start, stop)`` chunk ranges, sorted.
    pieces
        The distinct ``(key, start, stop)`` pieces, sorted.
    """

    chunks: int = 0
    bytes: int = 0
    piece_bytes: int = 0
    page_bytes: int = 0
    ranges: list[ByteRange] = field(default_factory=list)
    pieces: list[ByteRange] = field(default_factory=list)

    def coalesced(self) -> list[ByteRange]:
        """:func:`coalesce` of the needed chunk ranges.

        Returns
        -------
        list of ByteRange
            The chunk ranges, adjacent or overlapping ones of an object merged.
        """
        return coalesce(self.ranges)

    def coalesced_pieces(self) -> list[ByteRange]:
        """:func:`coalesce` of the needed pieces: the requests an exact reader makes.

        Returns
        -------
        list of ByteRange
            The pieces, adjacent or overlapping ones of an object merged.
        """
        return coalesce(self.pieces)


def coalesce(ranges: Iterable[ByteRange]) -> list[ByteRange]:
    """Distinct ranges per object, with adjacent or overlapping ones merged.

    Parameters
    ----------
    ranges
        ``(key, start, stop)`` byte ranges, in any order, repeats allowed.

    Returns
    -------
    list of ByteRange
        Sorted by key and start.
    """
    merged: list[ByteRange] = []
    for path, start, stop in sorted(set(ranges)):
        if merged and merged[-1][0] == path and start <= merged[-1][2]:
            merged[-1] = (path, merged[-1][1], max(stop, merged[-1][2]))
        else:
            merged.append((path, start, stop))
    return merged


class StoreGeometry:
    """The chunk layout of a store's trajectories, for computing what rows need.

    Parameters
    ----------
    fs
        An fsspec filesystem that reads the store directly (not through a counting proxy).
    root
        The store's root path on ``fs``.
    keys
        The sampled keys (flat paths such as ``curr_obs/image``).
    T, B
        The trajectories' time and environment sizes.
    """

    def __init__(self, fs: Any, root: str, keys: Sequence[str], T: int, B: int) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.keys = list(keys)
        self.T, self.B = T, B
        self._arrays: dict[tuple[int, str], ArrayGeometry] = {}
        self._indexes: dict[str, np.ndarray | None] = {}

    def array(self, tid: int, key: str) -> ArrayGeometry:
        """The geometry of array ``key`` of trajectory ``tid`` (read once).

        Parameters
        ----------
        tid
            The trajectory id.
        key
            The flat key, e.g. ``curr_obs/image``.

        Returns
        -------
        ArrayGeometry
            Read from the array's ``zarr.json`` on first use, then remembered.
        """
        found = self._arrays.get((tid, key))
        if found is None:
            path = f"trajectories/{tid}/{key}"
            metadata = json.loads(self.fs.cat_file(f"{self.root}/{path}/zarr.json"))
            found = self._arrays[(tid, key)] = ArrayGeometry.from_metadata(path, metadata)
        return found

    def needed(self, rows_by_id: Mapping[int, Sequence[int]]) -> NeededReads:
        """The chunks and byte ranges that the flat rows ``{trajectory id: rows}`` need.

        Parameters
        ----------
        rows_by_id
            Flat (sampled) row numbers per trajectory id; row ``r`` is step ``r // B``,
            environment ``r % B``.

        Returns
        -------
        NeededReads
            The distinct chunks, pieces and their bytes over every sampled key.
        """
        out = NeededReads()
        for tid, rows in rows_by_id.items():
            flat = torch.as_tensor(list(rows), dtype=torch.int64)
            steps, envs = flat // self.B, (flat % self.B).numpy()
            for key in self.keys:
                self._add(out, self.array(tid, key), steps, envs)
        out.ranges, out.pieces = sorted(set(out.ranges)), sorted(set(out.pieces))
        out.chunks = len(out.ranges)
        out.bytes = sum(stop - start for _, start, stop in out.ranges)
        out.piece_bytes = sum(stop - start for _, start, stop in out.pieces)
        pages = coalesce(
            (key, start // PAGE * PAGE, -(-stop // PAGE) * PAGE) for key, start, stop in out.pieces
        )
        out.page_bytes = sum(stop - start for _, start, stop in pages)
        return out

    def _add(
        self, out: NeededReads, array: ArrayGeometry, steps: torch.Tensor, envs: np.ndarray
    ) -> None:
        times = raw_time_rows(steps, self.T, array.shape[0]).numpy()
        for t, b in np.unique(np.stack([times, envs], axis=1), axis=0).tolist():
            outer = (t // array.chunks[0], b // array.chunks[1])
            for rest in array.outer_trailing():
                key = array.object_key((*outer, *rest))
                if array.inner is None:
                    self._add_file(out, key)
                else:
                    self._add_inner(out, array, key, t % array.chunks[0], b % array.chunks[1])

    def _add_inner(self, out: NeededReads, array: ArrayGeometry, key: str, t: int, b: int) -> None:
        """The inner chunks (and pieces) of shard ``key`` holding its local row ``(t, b)``."""
        assert array.inner is not None
        index = self._shard_index(key, array)
        if index is None:
            return
        grid = [c // i for c, i in zip(array.chunks, array.inner, strict=True)]
        run = math.prod(array.inner[2:]) * array.itemsize
        local = (t % array.inner[0]) * array.inner[1] + b % array.inner[1]
        for inner_rest in array.inner_trailing():
            position = int(
                np.ravel_multi_index((t // array.inner[0], b // array.inner[1], *inner_rest), grid)
            )
            offset, size = (int(v) for v in index[position])
            if offset == EMPTY:
                continue
            out.ranges.append((key, offset, offset + size))
            start = offset + local * run if array.uncompressed else offset
            out.pieces.append((key, start, start + run if array.uncompressed else offset + size))

    def _add_file(self, out: NeededReads, key: str) -> None:
        path = f"{self.root}/{key}"
        if self.fs.exists(path):
            whole = (key, 0, int(self.fs.size(path)))
            out.ranges.append(whole)
            out.pieces.append(whole)

    def _shard_index(self, key: str, array: ArrayGeometry) -> np.ndarray | None:
        if key not in self._indexes:
            path = f"{self.root}/{key}"
            if not self.fs.exists(path):
                self._indexes[key] = None
            else:
                size = int(self.fs.size(path))
                start = size - array.index_bytes if array.index_at_end else 0
                raw = self.fs.cat_file(path, start=start, end=start + array.index_bytes)
                pairs = np.frombuffer(raw[: array.index_bytes - (array.index_bytes % 16)], "<u8")
                self._indexes[key] = pairs.reshape(-1, 2)
        return self._indexes[key]
