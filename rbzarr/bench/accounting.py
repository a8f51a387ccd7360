"""Byte accounting: what a store holds on disk and what a batch of rows needs to read.

The needed bytes of a batch come from the store's public format only: each array's Zarr v3
metadata (``zarr.json``: shape, chunk grid, chunk key encoding, ``sharding_indexed``
configuration) and, for sharded arrays, the shard index (``offset, nbytes`` little-endian
uint64 pairs per inner chunk, C order, then a crc32c; ``2**64 - 1`` marks an empty chunk).
A row ``(t, b)`` of a ``[T, B, ...]`` array needs every inner chunk (or, unsharded, every
chunk file) that holds part of it; adjacent byte ranges of one object coalesce.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbzarr.bench.measure import nbytes
from rbzarr.trajectory import Trajectory, raw_time_rows, validate

__all__ = ["ArrayGeometry", "ByteRange", "NeededReads", "StoreGeometry", "coalesce", "disk_usage"]

EMPTY = 2**64 - 1
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

    @classmethod
    def from_metadata(cls, path: str, metadata: Mapping[str, Any]) -> ArrayGeometry:
        """Geometry of the array at ``path`` from its parsed ``zarr.json``."""
        chunks = tuple(metadata["chunk_grid"]["configuration"]["chunk_shape"])
        encoding = metadata.get("chunk_key_encoding", {"name": "default"})
        default = encoding.get("name") == "default"
        separator = encoding.get("configuration", {}).get("separator", "/" if default else ".")
        inner, at_end, index_bytes = None, True, 0
        first = metadata["codecs"][0]
        if first["name"] == "sharding_indexed":
            config = first["configuration"]
            inner = tuple(config["chunk_shape"])
            at_end = config.get("index_location", "end") == "end"
            count = math.prod(c // i for c, i in zip(chunks, inner, strict=True))
            checksum = any(c["name"] == "crc32c" for c in config.get("index_codecs", []))
            index_bytes = 16 * count + (4 if checksum else 0)
        return cls(
            path=path,
            shape=tuple(metadata["shape"]),
            chunks=chunks,
            inner=inner,
            index_at_end=at_end,
            index_bytes=index_bytes,
            key_prefix=f"c{separator}" if default else "",
            separator=separator,
        )

    def object_key(self, coords: Sequence[int]) -> str:
        """The store key of the chunk (or shard) at grid ``coords``."""
        return f"{self.path}/{self.key_prefix}{self.separator.join(map(str, coords))}"

    def trailing_grid(self, block: Sequence[int]) -> list[tuple[int, ...]]:
        """Every grid coordinate of the trailing (per-row) dimensions for ``block`` sizes."""
        counts = [math.ceil(n / b) for n, b in zip(self.chunks[2:], block[2:], strict=True)]
        return list(itertools.product(*(range(c) for c in counts)))


@dataclass
class NeededReads:
    """The byte ranges a batch needs, before and after coalescing."""

    chunks: int = 0
    bytes: int = 0
    ranges: list[ByteRange] = field(default_factory=list)

    def coalesced(self) -> list[ByteRange]:
        """:func:`coalesce` of the needed ranges."""
        return coalesce(self.ranges)


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
        """The geometry of array ``key`` of trajectory ``tid`` (read once)."""
        found = self._arrays.get((tid, key))
        if found is None:
            path = f"trajectories/{tid}/{key}"
            metadata = json.loads(self.fs.cat_file(f"{self.root}/{path}/zarr.json"))
            found = self._arrays[(tid, key)] = ArrayGeometry.from_metadata(path, metadata)
        return found

    def needed(self, rows_by_id: Mapping[int, Sequence[int]]) -> NeededReads:
        """The chunks and byte ranges that the flat rows ``{trajectory id: rows}`` need."""
        out = NeededReads()
        for tid, rows in rows_by_id.items():
            flat = torch.as_tensor(list(rows), dtype=torch.int64)
            steps, envs = flat // self.B, (flat % self.B).numpy()
            for key in self.keys:
                self._add(out, self.array(tid, key), steps, envs)
        out.bytes = sum(stop - start for _, start, stop in set(out.ranges))
        out.chunks = len(set(out.ranges))
        return out

    def _add(
        self, out: NeededReads, array: ArrayGeometry, steps: torch.Tensor, envs: np.ndarray
    ) -> None:
        times = raw_time_rows(steps, self.T, array.shape[0]).numpy()
        outer = np.stack([times // array.chunks[0], envs // array.chunks[1]], axis=1)
        if array.inner is None:
            for t, b in np.unique(outer, axis=0).tolist():
                for rest in array.trailing_grid(array.chunks):
                    self._add_file(out, array.object_key((t, b, *rest)))
            return
        inner = np.stack(
            [
                (times % array.chunks[0]) // array.inner[0],
                (envs % array.chunks[1]) // array.inner[1],
            ],
            axis=1,
        )
        grid = [c // i for c, i in zip(array.chunks, array.inner, strict=True)]
        for t, b, ti, bi in np.unique(np.concatenate([outer, inner], axis=1), axis=0).tolist():
            for rest in array.trailing_grid(array.chunks):
                key = array.object_key((t, b, *rest))
                index = self._shard_index(key, array)
                if index is None:
                    continue
                for inner_rest in array.trailing_grid(array.inner):
                    position = int(np.ravel_multi_index((ti, bi, *inner_rest), grid))
                    offset, size = (int(v) for v in index[position])
                    if offset != EMPTY:
                        out.ranges.append((key, offset, offset + size))

    def _add_file(self, out: NeededReads, key: str) -> None:
        path = f"{self.root}/{key}"
        if self.fs.exists(path):
            out.ranges.append((key, 0, int(self.fs.size(path))))

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


def disk_usage(root: str, trajectories: Sequence[Trajectory], fmt: str) -> dict[str, Any]:
    """Bytes on disk (allocated blocks of every file of the store, and their sizes), per
    sample, the compression ratio, and (zarr) the ratio per key."""
    samples = sum(validate(t).num_samples for t in trajectories)
    raw = nbytes(v for t in trajectories for v in t.tensors().values())
    files = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
    allocated = sum(f.stat().st_blocks * 512 for f in files)
    apparent = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {
        "files": len(files),
        "raw_bytes": raw,
        "allocated_bytes": allocated,
        "apparent_bytes": apparent,
        "allocated_vs_raw": allocated / raw,
        "bytes_per_sample": apparent / samples,
        "ratio": raw / apparent,
    }
    if fmt == "zarr":
        out["ratio_per_key"] = {
            key: _ratio(trajectories, key, root) for key in trajectories[0].tensors()
        }
    return out


def _ratio(trajectories: Sequence[Trajectory], key: str, root: str) -> float:
    stored = sum(
        f.stat().st_size
        for f in Path(root, "trajectories").glob(f"*/{key}/**/*")
        if f.is_file() and f.name != "zarr.json"
    )
    raw = nbytes(t.tensors()[key] for t in trajectories)
    return raw / stored
