"""Layout v2 reads on object stores: byte ranges of exactly the needed pieces.

Every piece of a batch (rows of uncompressed shards, inner chunks of compressed ones) is a
byte range of one object.  Ranges that touch (one ends where the next starts) are coalesced,
then all of them are fetched with one ``cat_ranges`` call of the layout's
:class:`~rbzarr.storage.zarr.byte_source.ByteSource`: fsspec runs them
concurrently on its event loop, so a batch costs one round trip per concurrency-limit's
worth of ranges.  Shard indexes are fetched the same way, once, when a trajectory opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.local import Piece, RowRead, land
from rbzarr.storage.zarr.spec import ArraySpec, check_document

__all__ = ["RemoteShard", "coalesce", "fetch_rows", "open_remote"]


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
    """

    spec: ArraySpec
    path: str
    where: str
    index: np.ndarray


def open_remote(
    fs: Any, shards: Sequence[tuple[str, ArraySpec, str]], source: ByteSource
) -> list[RemoteShard]:
    """Fetch and check the indexes of ``shards`` (``(path, spec, where)``) in one round.

    Each read asks for one byte past the written size, so a shard of the wrong size is
    caught by the same request: too few bytes come back (truncated) or one too many.  The
    arrays' ``zarr.json`` documents are fetched and checked in the same round.
    """
    if not shards:
        return []
    paths = [path for path, _, _ in shards]
    starts: list[int] = [spec.index_offset for _, spec, _ in shards]
    ends: list[int | None] = [spec.shard_bytes + 1 for _, spec, _ in shards]
    # The arrays' documents come in the same round (whole objects: no HEAD first).
    documents = [path.rsplit("/c/", 1)[0] + "/zarr.json" for path in paths]
    results = source.cat_ranges(
        fs, paths + documents, starts + [0] * len(paths), ends + [None] * len(paths)
    )
    opened = []
    for (path, spec, where), result, document in zip(
        shards, results[: len(paths)], results[len(paths) :], strict=True
    ):
        missing = isinstance(document, FileNotFoundError)
        check_document(None if missing else _checked(document, where), spec, where)
        data = _checked(result, where)
        expected = spec.shard_bytes - spec.index_offset
        if len(data) != expected:
            state = "truncated" if len(data) < expected else "larger than written"
            raise CorruptStoreError(f"{where}: the shard is not {spec.shard_bytes} bytes ({state})")
        opened.append(RemoteShard(spec, path, where, spec.check_index(bytes(data), where)))
    return opened


def _checked(data: Any, where: str) -> bytes:
    """A ``cat_ranges`` result, or the error it stands for."""
    if isinstance(data, FileNotFoundError):
        raise CorruptStoreError(f"{where}: the shard is missing") from data
    if isinstance(data, BaseException):
        if _is_bad_range(data):
            raise CorruptStoreError(f"{where}: the shard is truncated ({data})") from data
        raise data
    return bytes(data)


def _is_bad_range(error: BaseException) -> bool:
    """Whether an object store refused a range past the object's end (HTTP 416)."""
    text = f"{type(error).__name__} {error}"
    return any(mark in text for mark in ("InvalidRange", "416", "range is not satisfiable"))


@dataclass
class _Range:
    """Coalesced pieces of one object: ``[start, end)``."""

    path: str
    start: int
    end: int
    members: list[tuple[Piece, str]]


def coalesce(pieces: Sequence[tuple[str, Piece, str]]) -> list[_Range]:
    """Merge pieces into byte ranges: touching or overlapping pieces of one object become one."""
    ranges: list[_Range] = []
    for path, piece, where in sorted(pieces, key=lambda item: (item[0], item[1].offset)):
        last = ranges[-1] if ranges else None
        if last is not None and last.path == path and piece.offset <= last.end:
            last.end = max(last.end, piece.offset + piece.nbytes)
            last.members.append((piece, where))
        else:
            end = piece.offset + piece.nbytes
            ranges.append(_Range(path, piece.offset, end, [(piece, where)]))
    return ranges


def fetch_rows(fs: Any, reads: Sequence[tuple[RemoteShard, RowRead]], source: ByteSource) -> None:
    """Fetch every piece of the ``(shard, read)`` pairs (coalesced, one ``cat_ranges``
    round), land them, then finish each read."""
    ranges = coalesce(
        [(shard.path, piece, shard.where) for shard, read in reads for piece in read.pieces]
    )
    if ranges:
        results = source.cat_ranges(
            fs, [r.path for r in ranges], [r.start for r in ranges], [r.end for r in ranges]
        )
        for found, data in zip(ranges, results, strict=True):
            blob = memoryview(_checked(data, found.members[0][1]))
            for piece, where in found.members:
                begin = piece.offset - found.start
                land(piece, blob[begin : begin + piece.nbytes], where)
    for _, read in reads:
        if read.finish is not None:
            read.finish()
