"""Byte accounting: what a batch of rows needs to read from a Zarr store.

From the public format only: each array's ``zarr.json`` (its copy in its group's consolidated
document) and, when sharded, the shard index
(``offset, nbytes`` uint64 pairs per inner chunk, C order, then a crc32c; ``2**64 - 1``: empty).
A row's piece is its contiguous bytes in an uncompressed chunk, else the whole chunk.  A
``next_obs`` key stored once (its description in the group's ``rbzarr_layout`` names
``same_as`` and ``explicit``: :mod:`rbzarr.storage.zarr.next_obs`) needs its own stored row
for the elements it lists and the ``curr_obs`` row of the next step for the others.

What the layout's reads ask for is counted by :class:`CountingByteSource`, a wrapper
around the layout's byte source (``layout_options={"byte_source": ...}``).
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.next_obs import split_elements
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
    """Where the chunks of one array live, read from its ``zarr.json``."""

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
        """Geometry of the array at ``path`` from its parsed ``zarr.json``."""
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
        """The store key of the chunk (or shard) at grid ``coords``."""
        return f"{self.path}/{self.key_prefix}{self.separator.join(map(str, coords))}"

    def outer_trailing(self) -> list[tuple[int, ...]]:
        """Grid coordinates of the chunks (shards) along the trailing (per-row) dimensions."""
        return _grid(self.shape[2:], self.chunks[2:])

    def inner_trailing(self) -> list[tuple[int, ...]]:
        """Grid coordinates of a shard's inner chunks along the trailing dimensions."""
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
        # Large batches pread on the worker pool: the counters are shared between threads.
        self._lock = threading.Lock()

    def _count(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes

    def gather(self, rows: np.ndarray, elements: np.ndarray) -> np.ndarray:
        # docstring inherited
        found = self.inner.gather(rows, elements)
        self._count(0, found.nbytes)
        return found

    def gather_into(self, rows: np.ndarray, elements: np.ndarray, out: np.ndarray) -> None:
        # docstring inherited
        self.inner.gather_into(rows, elements, out)
        self._count(0, out.nbytes)  # the whole batch's rows: its scratch rows included

    def pread(self, fd: int, nbytes: int, offset: int) -> bytes:
        # docstring inherited
        data = self.inner.pread(fd, nbytes, offset)
        self._count(1, len(data))
        return data

    def cat_ranges(
        self, fs: Any, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None]
    ) -> list[Any]:
        # docstring inherited
        found = self.inner.cat_ranges(fs, paths, starts, ends)
        self._count(len(paths), sum(len(data) for data in found if isinstance(data, bytes)))
        return found


def _grid(extent: Sequence[int], block: Sequence[int]) -> list[tuple[int, ...]]:
    counts = [math.ceil(n / b) for n, b in zip(extent, block, strict=True)]
    return list(itertools.product(*(range(c) for c in counts)))


@dataclass
class NeededReads:
    """What a batch needs: whole chunks (``ranges``) and the rows' own bytes (``pieces``), each
    distinct and sorted.
    """

    chunks: int = 0
    bytes: int = 0
    piece_bytes: int = 0
    page_bytes: int = 0
    ranges: list[ByteRange] = field(default_factory=list)
    pieces: list[ByteRange] = field(default_factory=list)

    def coalesced(self) -> list[ByteRange]:
        """:func:`coalesce` of the needed chunk ranges."""
        return coalesce(self.ranges)

    def coalesced_pieces(self) -> list[ByteRange]:
        """:func:`coalesce` of the needed pieces: the requests an exact reader makes."""
        return coalesce(self.pieces)


def coalesce(ranges: Iterable[ByteRange]) -> list[ByteRange]:
    """Distinct ranges per object, with adjacent or overlapping ones merged."""
    merged: list[ByteRange] = []
    for path, start, stop in sorted(set(ranges)):
        if merged and merged[-1][0] == path and start <= merged[-1][2]:
            merged[-1] = (path, merged[-1][1], max(stop, merged[-1][2]))
        else:
            merged.append((path, start, stop))
    return merged


class StoreGeometry:
    """The chunk layout of a store's trajectories, for computing what rows need."""

    def __init__(self, fs: Any, root: str, keys: Sequence[str], T: int, B: int) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.keys = list(keys)
        self.T, self.B = T, B
        self._arrays: dict[tuple[int, str], ArrayGeometry] = {}
        self._groups: dict[int, dict[str, Any]] = {}
        self._descriptions: dict[int, dict[str, Any]] = {}
        # Where each trajectory's arrays are: its group (or its pack), member, members.
        self._places: dict[int, tuple[str, int, int]] = {}
        self._indexes: dict[str, np.ndarray | None] = {}

    def array(self, tid: int, key: str) -> ArrayGeometry:
        """The geometry of array ``key`` of trajectory ``tid`` (read once; a pack member's
        is its pack's array)."""
        found = self._arrays.get((tid, key))
        if found is None:
            metadata = self._members(tid).get(key)
            path = f"{self._places[tid][0]}/{key}"
            if metadata is None:  # a store written before its group consolidated documents
                metadata = json.loads(self.fs.cat_file(f"{self.root}/{path}/zarr.json"))
            found = self._arrays[(tid, key)] = ArrayGeometry.from_metadata(path, metadata)
        return found

    def _members(self, tid: int) -> dict[str, Any]:
        """The documents trajectory ``tid``'s group consolidates (read once)."""
        if tid not in self._groups:
            self._read_group(tid)
        return self._groups[tid]

    def _description(self, tid: int, key: str) -> dict[str, Any]:
        """The layout's description of array ``key`` of trajectory ``tid`` (``{}``: none)."""
        if tid not in self._descriptions:
            self._read_group(tid)
        return self._descriptions[tid].get(key) or {}

    def _read_group(self, tid: int) -> None:
        """Read trajectory ``tid``'s group document (and a pack member's pack's, which holds
        its rows): its members and its arrays' descriptions."""
        path = f"trajectories/{tid}"
        group = json.loads(self.fs.cat_file(f"{self.root}/{path}/zarr.json"))
        layout = (group.get("attributes") or {}).get("rbzarr_layout") or {}
        pack = layout.get("pack")
        if pack is None:
            self._places[tid] = (path, 0, 1)
        else:
            self._places[tid] = (pack["group"], pack["member"], pack["members"])
            group = json.loads(self.fs.cat_file(f"{self.root}/{pack['group']}/zarr.json"))
            layout = (group.get("attributes") or {}).get("rbzarr_layout") or {}
        consolidated = group.get("consolidated_metadata") or {}
        self._groups[tid] = consolidated.get("metadata") or {}
        self._descriptions[tid] = layout.get("arrays") or {}

    def needed(self, rows_by_id: Mapping[int, Sequence[int]]) -> NeededReads:
        """The chunks and byte ranges that the flat rows ``{trajectory id: rows}`` need."""
        out = NeededReads()
        for tid, rows in rows_by_id.items():
            flat = np.asarray(list(rows), dtype=np.int64)
            for key in self.keys:
                self._add_key(out, tid, key, flat)
        out.ranges, out.pieces = sorted(set(out.ranges)), sorted(set(out.pieces))
        out.chunks = len(out.ranges)
        out.bytes = sum(stop - start for _, start, stop in out.ranges)
        out.piece_bytes = sum(stop - start for _, start, stop in out.pieces)
        pages = coalesce(
            (key, start // PAGE * PAGE, -(-stop // PAGE) * PAGE) for key, start, stop in out.pieces
        )
        out.page_bytes = sum(stop - start for _, start, stop in pages)
        return out

    def _add_key(self, out: NeededReads, tid: int, key: str, flat: np.ndarray) -> None:
        """What flat rows ``flat`` (``t * B + b``) of trajectory ``tid`` need of ``key`` (a
        pack member's rows are those of the pack, a trajectory of ``members * T`` steps,
        from its ``member * T``-th step on)."""
        self.array(tid, key)  # reads the group: where its rows are
        _, member, members = self._places[tid]
        self._add_rows(out, tid, key, flat + member * self.T * self.B, members * self.T)

    def _add_rows(self, out: NeededReads, tid: int, key: str, flat: np.ndarray, T: int) -> None:
        """What flat rows ``flat`` of ``key``'s stored array, of ``T`` steps, need."""
        array = self.array(tid, key)
        description = self._description(tid, key)
        if description.get("explicit") is None:
            times = raw_time_rows(flat // self.B, T, array.shape[0])
            self._add(out, array, times, flat % self.B)
            return
        # Stored once: listed elements are rows [m, 0] of its own array, the others are
        # the same_as (curr_obs) row of the next step.
        explicit = np.asarray(description["explicit"], dtype=np.int64)
        _, stored, borrowed = split_elements(explicit, self.B, flat)
        self._add(out, array, stored, np.zeros_like(stored))
        if len(borrowed):
            self._add_rows(out, tid, description["same_as"], borrowed, T)

    def _add(
        self, out: NeededReads, array: ArrayGeometry, times: np.ndarray, envs: np.ndarray
    ) -> None:
        """The chunks (and pieces) holding the raw rows ``(times, envs)`` of ``array``."""
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
