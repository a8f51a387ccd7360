"""Layout v2 reads: rows of shards, straight from the files (or byte ranges of objects).

A shard opens once per trajectory (its size checked, its index read and checked) and is
cached with the trajectory's handles.  Reading rows then costs:

* **uncompressed arrays**: nothing but one numpy gather per (trajectory, key) out of a
  read-only memory map of the shard, straight into the batch's output rows.  Every map is
  marked ``MADV_RANDOM``, small rows' too: a cold row read then faults in that row's pages
  only, not the kernel's read-around window (``read_ahead_kb`` of the device, 8 MiB here,
  centred on the fault).  Without it one 128-byte state row read its whole 64 KiB shard:
  a truly cold embodied batch (64 rows) read 18.5 MB for 12.2 MB of row pages, and 12.2 MB
  with it, no slower (same-process A/B, ``fincore`` per shard).  A batch first asks for
  all its large rows (at least :data:`PREFETCH_ROW_BYTES`) with ``MADV_WILLNEED``, so the
  kernel reads them in parallel; warm, that costs one syscall per row, which small rows
  do not pay;
* **compressed inner chunks**: one ``os.pread`` and one zstd decode per distinct chunk,
  into the output row when an inner chunk is one row.

Reads and decodes are spread over a small thread pool only for batches of at least
:data:`THREADED_PIECES` pieces: measured on 2 shared cores, handing 512 image rows to
the pool made a warm batch 1.4x slower than one thread (``/tmp/probe2.py image``,
``RBZ_*`` variants, one run): the hop costs more than the copies.

On object stores the same *pieces* (offset, length, target) become byte ranges, coalesced
and fetched in one concurrent round (:mod:`rbzarr.storage.shard_remote`).

Handles are fork-safe: a memory map and a file descriptor read with ``pread`` (no shared
file position) stay valid in a forked child.  Files are replaced by rename, never rewritten
in place, so an open map never sees a trajectory rewritten under it; the layout drops the
handles of a trajectory it writes or deletes.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numcodecs import zstd

from rbzarr.errors import CorruptStoreError
from rbzarr.storage import shard_format, workers

__all__ = [
    "PREFETCH_ROW_BYTES",
    "ArraySpec",
    "check_document",
    "LocalShard",
    "Piece",
    "RowRead",
    "decode_whole",
    "gather_mapped",
    "land",
    "parse_specs",
    "plan_rows",
    "read_local",
]

# Rows at least this large are prefetched with MADV_WILLNEED before a batch gathers them.
PREFETCH_ROW_BYTES = 4096
# A batch with at least this many compressed pieces is read on the worker pool.
THREADED_PIECES = 1024
KINDS = ("mapped", "chunked")


@dataclass(frozen=True)
class ArraySpec:
    """One stored array as its trajectory group's attributes describe it."""

    key: str
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    inner: tuple[int, ...]
    shard_bytes: int

    @classmethod
    def parse(cls, key: str, description: Any, where: str) -> ArraySpec:
        """Check and convert a description written by :mod:`rbzarr.storage.shard_writer`."""
        try:
            spec = cls(
                key=key,
                kind=str(description["kind"]),
                shape=tuple(int(d) for d in description["shape"]),
                dtype=np.dtype(str(description["dtype"])),
                inner=tuple(int(d) for d in description["inner"]),
                shard_bytes=int(description["shard_bytes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: unreadable layout description: {exc}") from exc
        grid_ok = len(spec.inner) == len(spec.shape) and all(
            i > 0 and s % i == 0 for s, i in zip(spec.shape, spec.inner, strict=False)
        )
        if spec.kind not in KINDS or not spec.shape or not grid_ok:
            raise CorruptStoreError(f"{where}: invalid layout description {description!r}")
        return spec

    @property
    def chunks(self) -> int:
        """Number of inner chunks."""
        return math.prod(s // i for s, i in zip(self.shape, self.inner, strict=True))

    @property
    def envs(self) -> int:
        """``B`` (1 for a 1-D array)."""
        return self.shape[1] if len(self.shape) >= 2 else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one row ``(t, b)``."""
        return math.prod(self.shape[2:]) * self.dtype.itemsize

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one decoded inner chunk."""
        return math.prod(self.inner) * self.dtype.itemsize

    @property
    def data_bytes(self) -> int:
        """Bytes of the whole array, uncompressed."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def index_offset(self) -> int:
        """Where the index starts in the shard."""
        return self.shard_bytes - shard_format.index_size(self.chunks)

    def check_index(self, raw: bytes, where: str) -> np.ndarray:
        """Parse the shard's index bytes; a mapped array must be one chunk at offset 0."""
        index = shard_format.decode_index(raw, self.chunks, self.index_offset, where)
        if self.kind == "mapped" and index.tolist() != [[0, self.data_bytes]]:
            raise CorruptStoreError(
                f"{where}: shard index {index.tolist()} does not describe the uncompressed "
                f"array ([0, {self.data_bytes}])"
            )
        return index


def check_document(raw: bytes | None, spec: ArraySpec, where: str) -> None:
    """Refuse an array's ``zarr.json`` that is missing, unparsable or describes other data
    than its group's layout description (plain zarr readers rely on it)."""
    name = f"{where}/zarr.json"
    if raw is None:
        raise CorruptStoreError(f"{name} is missing")
    try:
        document = json.loads(raw)
        sharding = document["codecs"][0]
        inner = sharding["configuration"]["chunk_shape"]
        agrees = (
            document.get("node_type") == "array"
            and tuple(document["shape"]) == spec.shape
            and sharding["name"] == "sharding_indexed"
            and tuple(inner) == spec.inner
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise CorruptStoreError(f"{name} is not a valid array document: {exc}") from exc
    if not agrees:
        raise CorruptStoreError(f"{name} disagrees with its trajectory's layout description")


@dataclass
class Piece:
    """``nbytes`` at ``offset`` of a shard, landing in ``target`` (decoded if compressed)."""

    offset: int
    nbytes: int
    target: np.ndarray
    compressed: bool


@dataclass
class RowRead:
    """The pieces that fill one output block, and what to do once they have landed."""

    where: str
    pieces: list[Piece]
    finish: Callable[[], None] | None = None


class LocalShard:
    """An open local shard: its checked index, a descriptor and (small rows) a memory map.

    Raises :class:`CorruptStoreError` naming ``where`` when the file is missing, has the
    wrong size or a damaged index.
    """

    def __init__(self, path: str, spec: ArraySpec, where: str) -> None:
        self.spec = spec
        self.where = where
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptStoreError(f"{where}: the shard is missing") from None
        # Closed when the last reader lets go of this object (a thread may still be reading).
        self._closer = weakref.finalize(self, os.close, fd)
        self.fd = fd
        size = os.fstat(fd).st_size
        if size != spec.shard_bytes:
            self._closer()
            state = "truncated" if size < spec.shard_bytes else "larger than written"
            raise CorruptStoreError(
                f"{where}: the shard holds {size} bytes, expected {spec.shard_bytes} ({state})"
            )
        isize = shard_format.index_size(spec.chunks)
        try:
            self.index = spec.check_index(os.pread(fd, isize, spec.index_offset), where)
        except CorruptStoreError:
            self._closer()
            raise
        self.rows: np.ndarray | None = None
        self._map: mmap.mmap | None = None
        if spec.kind == "mapped" and len(spec.shape) >= 2:
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            mapped.madvise(mmap.MADV_RANDOM)
            if spec.row_bytes >= PREFETCH_ROW_BYTES:
                self._map = mapped
            count = spec.data_bytes // spec.row_bytes
            self.rows = np.frombuffer(mapped, np.uint8, spec.data_bytes).reshape(count, -1)
            self._closer()  # the map keeps its own descriptor

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` helps: large rows, read through a memory map."""
        return self._map is not None

    def prefetch(self, elements: np.ndarray) -> None:
        """Ask the kernel to start reading rows ``elements`` (``MADV_WILLNEED``), so the
        pages of a cold batch arrive in parallel instead of one fault at a time."""
        assert self._map is not None
        size = self.spec.row_bytes
        for element in np.unique(elements).tolist():
            start = element * size
            page = start - start % mmap.PAGESIZE
            self._map.madvise(mmap.MADV_WILLNEED, page, start + size - page)

    def read(self, piece: Piece) -> None:
        """Land one piece: ``pread``, then decode when compressed."""
        land(piece, os.pread(self.fd, piece.nbytes, piece.offset), self.where)


def land(piece: Piece, data: bytes | memoryview, where: str) -> None:
    """Put fetched bytes in their target, decoding compressed ones."""
    if len(data) != piece.nbytes:
        raise CorruptStoreError(f"{where}: the shard ended early (truncated)")
    if not piece.compressed:
        piece.target[...] = np.frombuffer(data, np.uint8).reshape(piece.target.shape)
        return
    try:
        zstd.decompress(data, piece.target)
    except (RuntimeError, ValueError) as exc:
        raise CorruptStoreError(f"{where}: an inner chunk does not decode: {exc}") from exc


def plan_rows(
    spec: ArraySpec,
    index: np.ndarray,
    elements: np.ndarray,
    out: np.ndarray,
    positions: np.ndarray,
    where: str,
) -> RowRead:
    """The pieces that put rows ``elements`` (``raw_t * B + b``) into rows ``positions`` of
    ``out`` (uint8 ``[n, row_bytes]``), each distinct row or inner chunk read once."""
    if spec.kind == "mapped":
        unique, first, inverse = _distinct(elements)
        base = int(index[0, 0])
        pieces = [
            Piece(base + e * spec.row_bytes, spec.row_bytes, out[p], False)
            for e, p in zip(unique.tolist(), positions[first].tolist(), strict=True)
        ]
        return RowRead(where, pieces, _copy_repeats(out, positions, first, inverse))
    k = spec.inner[0]
    steps, envs = np.divmod(elements, spec.envs)
    chunk_ids = (steps // k) * spec.envs + envs
    unique, first, inverse = _distinct(chunk_ids)
    finish: Callable[[], None] | None
    if k == 1:
        targets = [out[p] for p in positions[first].tolist()]
        finish = _copy_repeats(out, positions, first, inverse)
    else:
        decoded = np.empty((len(unique), k, spec.row_bytes), dtype=np.uint8)
        targets = list(decoded.reshape(len(unique), -1))
        within = steps % k

        def finish() -> None:
            out[positions] = decoded[inverse, within]

    pieces = [
        Piece(int(offset), int(nbytes), target, True)
        for (offset, nbytes), target in zip(index[unique].tolist(), targets, strict=True)
    ]
    return RowRead(where, pieces, finish)


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    unique, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    return unique, first, inverse


def _copy_repeats(
    out: np.ndarray, positions: np.ndarray, first: np.ndarray, inverse: np.ndarray
) -> Callable[[], None] | None:
    """Rows drawn more than once are read once, then copied to their other positions."""
    if len(first) == len(positions):
        return None

    def finish() -> None:
        out[positions] = out[positions[first[inverse]]]

    return finish


def read_local(reads: list[tuple[LocalShard, RowRead]]) -> None:
    """Land every piece of ``reads`` (on the pool when there are many), then finish each."""
    work = [(shard, piece) for shard, read in reads for piece in read.pieces]
    workers.run_all(lambda job: job[0].read(job[1]), work, len(work) >= THREADED_PIECES)
    for _, read in reads:
        if read.finish is not None:
            read.finish()


def gather_mapped(
    shard: LocalShard, elements: np.ndarray, out: np.ndarray, positions: np.ndarray
) -> None:
    """Rows ``elements`` of a memory-mapped shard into rows ``positions`` of ``out``."""
    assert shard.rows is not None
    out[positions] = shard.rows[elements]


def decode_whole(spec: ArraySpec, shard: bytes, where: str) -> np.ndarray:
    """A whole array from its shard's bytes (the index checked), in the stored dtype."""
    if len(shard) != spec.shard_bytes:
        state = "truncated" if len(shard) < spec.shard_bytes else "larger than written"
        raise CorruptStoreError(
            f"{where}: the shard holds {len(shard)} bytes, expected {spec.shard_bytes} ({state})"
        )
    index = spec.check_index(shard[spec.index_offset :], where)
    view = memoryview(shard)
    if spec.kind == "mapped":
        flat = np.frombuffer(view[: spec.data_bytes], np.uint8).copy()
        return flat.view(spec.dtype).reshape(spec.shape)
    chunks = np.empty((spec.chunks, spec.chunk_bytes), dtype=np.uint8)
    for target, (offset, nbytes) in zip(chunks, index.tolist(), strict=True):
        land(Piece(offset, nbytes, target, True), view[offset : offset + nbytes], where)
    return _from_inner_chunks(chunks, spec)


def _from_inner_chunks(chunks: np.ndarray, spec: ArraySpec) -> np.ndarray:
    """Inverse of the writer's chunking: ``(k,)`` or ``(k, 1, *trailing)`` inner chunks."""
    k, rows = spec.inner[0], spec.shape[0]
    values = chunks.view(spec.dtype)
    if len(spec.shape) == 1:
        return values.reshape(spec.shape)
    blocks = values.reshape(rows // k, spec.envs, k, -1).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).reshape(spec.shape)


def parse_specs(layout: Mapping[str, Any], where: str) -> dict[str, ArraySpec | None]:
    """The specs of a v2 group's arrays (``None`` for those zarr reads)."""
    arrays = layout.get("arrays")
    if not isinstance(arrays, dict):
        raise CorruptStoreError(f"{where}: layout description without arrays")
    return {
        key: (
            None
            if isinstance(d, dict) and d.get("kind") == "zarr"
            else ArraySpec.parse(key, d, f"{where}/{key}")
        )
        for key, d in arrays.items()
    }
