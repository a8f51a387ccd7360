"""Layout v2 reads: rows of shards, straight from the files (or byte ranges of objects).

A shard opens once per trajectory (its size checked, its index read and checked) and is
cached with the trajectory's handles.  Reading rows then costs:

* **uncompressed arrays**: nothing but numpy gathers out of read-only memory maps,
  straight into the batch's output rows.  Each shard is mapped at a bay of a reserved
  address range shared by every shard of its row size (:mod:`rbzarr.storage.zarr.regions`),
  so a batch gathers each key once for all its trajectories; a shard that finds no bay
  (not Linux, or its reservation failed) keeps a map of its own, one gather per
  (trajectory, key), and one past the map budget a descriptor.  Every map is
  marked ``MADV_RANDOM``, small rows' too: a cold row read then faults in that row's pages
  only, not the kernel's read-around window (``read_ahead_kb`` of the device, centred on
  the fault), so a cold small row does not read its whole shard.  A batch first asks for
  all its large rows (at least :data:`PREFETCH_ROW_BYTES`) with ``MADV_WILLNEED``, so the
  kernel reads them in parallel; warm, that costs one syscall per row, which small rows
  do not pay;
* **compressed inner chunks**: one ``os.pread`` and one zstd decode per distinct chunk,
  into the output row when an inner chunk is one row.  The descriptor is advised
  ``POSIX_FADV_RANDOM`` (:func:`_advise_random`): a cold read of a few neighbouring inner
  chunks reads their pages, not the read-ahead the kernel would start after them.

Reads and decodes are spread over a small thread pool only for batches of at least
:data:`THREADED_PIECES` pieces: for fewer, handing the copies to the pool costs more than
the copies.

On object stores the same *pieces* (offset, length, target) become byte ranges, coalesced
and fetched in one concurrent round (:mod:`rbzarr.storage.zarr.remote`).

Handles are fork-safe: a memory map and a file descriptor read with ``pread`` (no shared
file position) stay valid in a forked child.  Files are replaced by rename, never rewritten
in place, so an open map never sees a trajectory rewritten under it; the layout drops the
handles of a trajectory it writes or deletes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from rbzarr.errors import CodecUnavailableError, CorruptStoreError
from rbzarr.storage.io import thread_pool
from rbzarr.storage.io.files import open_regular
from rbzarr.storage.zarr import regions, shard_index
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.codec import Decoder
from rbzarr.storage.zarr.codecs import zstd_into
from rbzarr.storage.zarr.spec import ArraySpec

__all__ = [
    "PREFETCH_ROW_BYTES",
    "LocalShard",
    "Piece",
    "RowRead",
    "decode_whole",
    "decoder",
    "frames_to_decode",
    "land",
    "plan_rows",
    "read_local",
]

# Rows at least this large are prefetched with MADV_WILLNEED before a batch gathers them.
PREFETCH_ROW_BYTES = 4096
# A batch with at least this many compressed pieces is read on the worker pool.
THREADED_PIECES = 1024
# A batch with at least this many frames to decode (image codecs) is read on the pool.
THREADED_FRAMES = 8


@dataclass
class Piece:
    """``nbytes`` at ``offset`` of a shard, landing in ``target`` (decoded if compressed).

    Parameters
    ----------
    offset
        Where the bytes start in the shard.
    nbytes
        How many bytes to read.
    target
        The uint8 array the bytes (or their decoded chunk) fill exactly.
    decode
        Decodes the bytes into ``target`` (:func:`decoder`); ``None``: they are copied.
    """

    offset: int
    nbytes: int
    target: np.ndarray
    decode: Decoder | None


@dataclass
class RowRead:
    """The pieces that fill one output block, and what to do once they have landed.

    Parameters
    ----------
    where
        Names the array in errors.
    pieces
        The pieces to read.
    finish
        Called once every piece has landed (copies repeated rows, or moves rows out of
        decoded chunks); ``None`` when there is nothing to do.
    """

    where: str
    pieces: list[Piece]
    finish: Callable[[], None] | None = None


class LocalShard:
    """An open local shard: its checked index, a descriptor or a memory map.

    An uncompressed array of at least two dimensions is memory-mapped (``rows``: one uint8
    row per element ``raw_t * B + b``; ``bay``: where it sits in a region, if it does),
    unless the map budget is spent; other shards keep a descriptor read with ``pread``.

    Parameters
    ----------
    path
        The shard file's path (:attr:`path` follows a cached copy renamed into place).
    spec
        The array it holds.
    where
        Names the array in errors.

    Raises
    ------
    CorruptStoreError
        The file is missing, has the wrong size or a damaged index.
    UnsafePathError
        A FIFO, socket or device is there (never opened).
    """

    def __init__(self, path: str, spec: ArraySpec, where: str) -> None:
        self.path = path
        self.spec = spec
        self.where = where
        try:
            fd = open_regular(path)
        except (FileNotFoundError, IsADirectoryError):
            raise CorruptStoreError(f"{where}: the shard is missing") from None
        # Closed when the last reader lets go of this object (a thread may still be reading).
        self._closer = weakref.finalize(self, os.close, fd)
        self.fd = fd
        _advise_random(fd)
        size = os.fstat(fd).st_size
        if size != spec.shard_bytes:
            self._closer()
            state = "truncated" if size < spec.shard_bytes else "larger than written"
            raise CorruptStoreError(
                f"{where}: the shard holds {size} bytes, expected {spec.shard_bytes} ({state})"
            )
        isize = shard_index.index_size(spec.chunks)
        try:
            self.index = spec.check_index(os.pread(fd, isize, spec.index_offset), where)
        except CorruptStoreError:
            self._closer()
            raise
        self.rows: np.ndarray | None = None
        self.bay: regions.Bay | None = None
        self._map: mmap.mmap | None = None
        if spec.coder.in_place and len(spec.shape) >= 2:
            self._map_rows(fd, size)

    def _map_rows(self, fd: int, size: int) -> None:
        """Map the rows into a region bay, else into a map of their own; none once
        :data:`regions.MAP_BUDGET` is spent (then ``pread``)."""
        spec = self.spec
        count = spec.data_bytes // spec.row_bytes
        self.bay = regions.place(fd, size, spec.row_bytes)
        if self.bay is not None:
            weakref.finalize(self, self.bay.release)
            first = self.bay.first_row
            self.rows = self.bay.region.rows[first : first + count]
        elif (budget := regions.MAP_BUDGET).take(1):
            weakref.finalize(self, budget.give, 1)
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            mapped.madvise(mmap.MADV_RANDOM)
            if spec.row_bytes >= PREFETCH_ROW_BYTES:
                self._map = mapped
            self.rows = np.frombuffer(mapped, np.uint8, spec.data_bytes).reshape(count, -1)
        else:
            return
        self._closer()  # the map keeps its own descriptor

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` helps."""
        return self._map is not None

    def prefetch(self, elements: np.ndarray) -> None:
        """Ask the kernel to start reading rows ``elements`` (``MADV_WILLNEED``), so the
        pages of a cold batch arrive in parallel instead of one fault at a time.

        Only for shards whose :attr:`prefetches` is true.
        """
        assert self._map is not None
        size = self.spec.row_bytes
        for element in np.unique(elements).tolist():
            start = element * size
            page = start - start % mmap.PAGESIZE
            self._map.madvise(mmap.MADV_WILLNEED, page, start + size - page)

    def read(self, piece: Piece, source: ByteSource) -> None:
        """Land one piece of this shard: read from ``source``, then decoded when compressed."""
        land(piece, source.pread(self.fd, piece.nbytes, piece.offset), self.where)


def _advise_random(fd: int) -> None:
    """Tell the kernel a shard is read at random (``POSIX_FADV_RANDOM``): a cold ``pread``
    then reads its own pages only, not a read-ahead window after them (``read_ahead_kb`` of
    the device, MiBs on some disks), which reads of neighbouring inner chunks would start.
    Advice only: where the platform lacks it or refuses it, reads go on as before."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    with contextlib.suppress(OSError):
        advise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def land(piece: Piece, data: bytes | memoryview, where: str) -> None:
    """Put fetched bytes in their target, decoding compressed ones."""
    if len(data) != piece.nbytes:
        raise CorruptStoreError(f"{where}: the shard ended early (truncated)")
    if piece.decode is None:
        piece.target[...] = np.frombuffer(data, np.uint8).reshape(piece.target.shape)
        return
    try:
        piece.decode(data, piece.target)
    except CorruptStoreError:
        raise
    except ImportError as exc:  # the codec's package is missing here: that is not damage
        raise CodecUnavailableError(
            f"{where}: this process cannot decode it (the data is not damaged): {exc}"
        ) from exc
    except Exception as exc:  # zstd's and every image codec's own errors
        raise CorruptStoreError(f"{where}: an inner chunk does not decode: {exc}") from exc


def decoder(spec: ArraySpec) -> Decoder | None:
    """How an inner chunk of ``spec``'s array is decoded into its uint8 target: the one
    place a compressed or encoded chunk becomes values (``None``: stored raw)."""
    return spec.coder.decoder(tuple(spec.shape[2:]), spec.image)


def frames_to_decode(pieces: Iterable[Piece]) -> bool:
    """Whether at least :data:`THREADED_FRAMES` of ``pieces`` are frames to decode (worth
    the worker pool: a frame costs ~0.1 ms, the hop ~0.01 ms)."""
    count = 0
    for piece in pieces:
        if piece.decode is not None and piece.decode is not zstd_into:
            count += 1
            if count >= THREADED_FRAMES:
                return True
    return False


def plan_rows(
    spec: ArraySpec,
    index: np.ndarray,
    elements: np.ndarray,
    out: np.ndarray,
    positions: np.ndarray,
    where: str,
) -> RowRead:
    """The pieces that put rows ``elements`` into rows ``positions`` of ``out``.

    Each distinct row (uncompressed) or inner chunk (compressed) is read once.
    """
    if spec.coder.in_place:
        unique, first, inverse = _distinct(elements)
        base = int(index[0, 0])
        pieces = [
            Piece(base + e * spec.row_bytes, spec.row_bytes, out[p], None)
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

    decode = decoder(spec)
    pieces = [
        Piece(int(offset), int(nbytes), target, decode)
        for (offset, nbytes), target in zip(index[unique].tolist(), targets, strict=True)
    ]
    return RowRead(where, pieces, finish)


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    unique, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    return unique, first, inverse


def _copy_repeats(
    out: np.ndarray, positions: np.ndarray, first: np.ndarray, inverse: np.ndarray
) -> Callable[[], None] | None:
    """Rows drawn more than once are read once, then copied to their other positions (only
    those: a batch's every row copied again would cost as much as reading it)."""
    if len(first) == len(positions):
        return None
    repeated = np.ones(len(positions), dtype=bool)
    repeated[first] = False
    targets, sources = positions[repeated], positions[first[inverse[repeated]]]

    def finish() -> None:
        out[targets] = out[sources]

    return finish


def read_local(reads: list[tuple[LocalShard, RowRead]], source: ByteSource) -> None:
    """Land every piece of the ``(shard, read)`` pairs (on the pool when there are many, or
    several frames to decode), then finish each read."""
    work = [(shard, piece) for shard, read in reads for piece in read.pieces]
    threaded = len(work) >= THREADED_PIECES or frames_to_decode(p for _, p in work)
    thread_pool.run_all(lambda job: job[0].read(job[1], source), work, threaded)
    for _, read in reads:
        if read.finish is not None:
            read.finish()


def decode_whole(spec: ArraySpec, shard: bytes, where: str) -> np.ndarray:
    """A whole array from its shard's bytes (the index checked), in the stored dtype."""
    if len(shard) != spec.shard_bytes:
        state = "truncated" if len(shard) < spec.shard_bytes else "larger than written"
        raise CorruptStoreError(
            f"{where}: the shard holds {len(shard)} bytes, expected {spec.shard_bytes} ({state})"
        )
    index = spec.check_index(shard[spec.index_offset :], where)
    view = memoryview(shard)
    if spec.coder.in_place:
        flat = np.frombuffer(view[: spec.data_bytes], np.uint8).copy()
        return flat.view(spec.dtype).reshape(spec.shape)
    chunks = np.empty((spec.chunks, spec.chunk_bytes), dtype=np.uint8)
    decode = decoder(spec)
    pieces = [
        Piece(offset, nbytes, target, decode)
        for target, (offset, nbytes) in zip(chunks, index.tolist(), strict=True)
    ]
    thread_pool.run_all(
        lambda piece: land(piece, view[piece.offset : piece.offset + piece.nbytes], where),
        pieces,
        spec.coder.is_image,
    )
    return _from_inner_chunks(chunks, spec)


def _from_inner_chunks(chunks: np.ndarray, spec: ArraySpec) -> np.ndarray:
    """Inverse of the writer's chunking: ``(k,)`` or ``(k, 1, *trailing)`` inner chunks."""
    k, rows = spec.inner[0], spec.shape[0]
    values = chunks.view(spec.dtype)
    if len(spec.shape) == 1:
        return values.reshape(spec.shape)
    blocks = values.reshape(rows // k, spec.envs, k, -1).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).reshape(spec.shape)
