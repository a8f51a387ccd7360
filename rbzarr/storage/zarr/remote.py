"""Layout v2 reads on object stores: byte ranges of the needed pieces, few requests.

Every piece of a batch (rows of uncompressed shards, inner chunks of compressed ones) is a
byte range of one object.  Ranges of one object closer than the layout's ``range_gap`` are
coalesced (the bytes between come along: on an object store a request costs more than
moving a few hundred KiB), then all of them are fetched with one ``cat_ranges`` call of the
layout's :class:`~rbzarr.storage.zarr.byte_source.ByteSource`: fsspec runs them
concurrently on its event loop, so a batch costs one round trip per concurrency-limit's
worth of ranges.  Shard indexes are fetched the same way, once, when a trajectory opens;
a shard of at most :data:`WHOLE_SHARD_BYTES` is fetched whole by that same request and
kept with the trajectory's handles, so its rows cost no request at all.  A shard of at most
:data:`INLINE_SHARD_BYTES` needs not even that: its group's layout description carries a
copy (:func:`inline_copy`, read by :func:`open_inline`), so opening it costs no request.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io import thread_pool
from rbzarr.storage.io.backends import refused_range
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.local import Piece, RowRead, frames_to_decode, land
from rbzarr.storage.zarr.spec import ArraySpec

__all__ = [
    "DEFAULT_RANGE_GAP",
    "INLINE",
    "INLINE_SHARD_BYTES",
    "WHOLE_SHARD_BYTES",
    "RemoteShard",
    "checked_bytes",
    "coalesce",
    "fetch_rows",
    "inline_copy",
    "open_inline",
    "open_remote",
]

# Shards at most this large are fetched whole when their trajectory opens.
WHOLE_SHARD_BYTES = 128 << 10
# Shards at most this large are also copied (base64) into their group's layout description.
INLINE_SHARD_BYTES = 16 << 10
# The key of that copy in an array's description.
INLINE = "inline"
# Ranges of one object at most this far apart are fetched as one: about what one request's
# latency is worth in bytes on one connection (20 ms at ~100 MB/s on S3; on moto a request
# costs ~4 ms of server CPU, its bytes next to nothing).
DEFAULT_RANGE_GAP = 2 << 20


@dataclass(frozen=True)
class RemoteShard:
    """A shard on an object store: its path and its checked index.

    Parameters
    ----------
    spec
        The array the shard holds.
    path
        The shard object's path on the filesystem.
    where
        Names the array in errors (``<url>/trajectories/<id>/<key>``).
    index
        The checked shard index, ``int64 [chunks, 2]`` (offset, nbytes).
    data
        The whole shard, for a small one (:data:`WHOLE_SHARD_BYTES`); ``None`` otherwise.
    """

    spec: ArraySpec
    path: str
    where: str
    index: np.ndarray
    data: bytes | None = None


def open_remote(
    fs: Any, shards: Sequence[tuple[str, ArraySpec, str]], source: ByteSource
) -> list[RemoteShard]:
    """Fetch and check the indexes of ``shards`` (``(path, spec, where)``) in one round.

    Each read asks for one byte past the written size, so a shard of the wrong size is
    caught by the same request: too few bytes come back (truncated) or one too many.  A
    small shard is fetched whole by that request.  rbzarr reads by the group's layout
    description and the checked index; the arrays' own ``zarr.json`` documents (what plain
    zarr reads) are checked by ``verify`` and by local opens, not here: on an object store
    each would cost a request.
    """
    if not shards:
        return []
    paths = [path for path, _, _ in shards]
    starts = [_first_byte(spec) for _, spec, _ in shards]
    ends: list[int | None] = [spec.shard_bytes + 1 for _, spec, _ in shards]
    results = source.cat_ranges(fs, paths, starts, ends)
    opened = []
    for (path, spec, where), result, start in zip(shards, results, starts, strict=True):
        data = checked_bytes(result, where)
        expected = spec.shard_bytes - start
        if len(data) != expected:
            state = "truncated" if len(data) < expected else "larger than written"
            raise CorruptStoreError(f"{where}: the shard is not {spec.shard_bytes} bytes ({state})")
        index = spec.check_index(data[spec.index_offset - start :], where)
        whole = data if start == 0 else None
        opened.append(RemoteShard(spec, path, where, index, whole))
    return opened


def inline_copy(parts: Sequence[Any]) -> str | None:
    """The copy of a shard (its ``parts``, buffers) a layout description carries, or ``None``
    for a shard larger than :data:`INLINE_SHARD_BYTES`."""
    if sum(memoryview(part).nbytes for part in parts) > INLINE_SHARD_BYTES:
        return None
    return base64.b64encode(b"".join(parts)).decode("ascii")


def open_inline(
    description: Mapping[str, Any], spec: ArraySpec, path: str, where: str
) -> RemoteShard | None:
    """The shard a layout description carries a copy of, checked as a fetched one is (its
    size, its index); ``None`` when it carries none.

    Raises
    ------
    CorruptStoreError
        The copy is not base64, not the shard's size, or its index does not check.
    """
    text = description.get(INLINE)
    if text is None:
        return None
    try:
        data = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CorruptStoreError(
            f"{where}: its layout description's copy is damaged: {exc}"
        ) from exc
    if len(data) != spec.shard_bytes:
        raise CorruptStoreError(
            f"{where}: its layout description's copy holds {len(data)} bytes, not "
            f"{spec.shard_bytes}"
        )
    index = spec.check_index(data[spec.index_offset :], where)
    return RemoteShard(spec, path, where, index, data)


def _first_byte(spec: ArraySpec) -> int:
    """Where the open request starts: 0 (the whole shard) for a small one, else its index."""
    return 0 if spec.shard_bytes <= WHOLE_SHARD_BYTES else spec.index_offset


def checked_bytes(data: Any, where: str) -> bytes:
    """A ``cat_ranges`` result, or the error it stands for."""
    if isinstance(data, FileNotFoundError):
        raise CorruptStoreError(f"{where}: the shard is missing") from data
    if isinstance(data, BaseException):
        if refused_range(data):
            raise CorruptStoreError(f"{where}: the shard is truncated ({data})") from data
        raise data
    return bytes(data)


@dataclass
class _Range:
    """Coalesced pieces of one object: ``[start, end)``."""

    path: str
    start: int
    end: int
    members: list[tuple[Piece, str]]


def coalesce(pieces: Sequence[tuple[str, Piece, str]], gap: int = 0) -> list[_Range]:
    """Merge pieces into byte ranges: pieces of one object at most ``gap`` bytes apart
    (touching or overlapping ones always) become one."""
    ranges: list[_Range] = []
    for path, piece, where in sorted(pieces, key=lambda item: (item[0], item[1].offset)):
        last = ranges[-1] if ranges else None
        if last is not None and last.path == path and piece.offset <= last.end + gap:
            last.end = max(last.end, piece.offset + piece.nbytes)
            last.members.append((piece, where))
        else:
            end = piece.offset + piece.nbytes
            ranges.append(_Range(path, piece.offset, end, [(piece, where)]))
    return ranges


def fetch_rows(
    fs: Any,
    reads: Sequence[tuple[RemoteShard, RowRead]],
    source: ByteSource,
    gap: int = DEFAULT_RANGE_GAP,
) -> None:
    """Fetch every piece of the ``(shard, read)`` pairs (coalesced within ``gap``, one
    ``cat_ranges`` round; pieces of shards held whole cost nothing), land them, then finish
    each read."""
    remote: list[tuple[str, Piece, str]] = []
    fetched: list[tuple[Piece, memoryview, str]] = []  # landed together: decodes on the pool
    for shard, read in reads:
        if shard.data is None:
            remote.extend((shard.path, piece, shard.where) for piece in read.pieces)
            continue
        held = memoryview(shard.data)
        fetched.extend(
            (piece, held[piece.offset : piece.offset + piece.nbytes], shard.where)
            for piece in read.pieces
        )
    ranges = coalesce(remote, gap)
    if ranges:
        results = source.cat_ranges(
            fs, [r.path for r in ranges], [r.start for r in ranges], [r.end for r in ranges]
        )
        for found, data in zip(ranges, results, strict=True):
            blob = memoryview(checked_bytes(data, found.members[0][1]))
            for piece, where in found.members:
                begin = piece.offset - found.start
                fetched.append((piece, blob[begin : begin + piece.nbytes], where))
    threaded = frames_to_decode(piece for piece, _, _ in fetched)
    thread_pool.run_all(lambda job: land(*job), fetched, threaded)
    for _, read in reads:
        if read.finish is not None:
            read.finish()
