"""The Zarr v3 ``sharding_indexed`` format, as rbzarr writes and reads it without zarr.

A shard is one object holding every inner chunk of an array, followed by its *index*
(``index_location: "end"``): for each inner chunk, in C order of the inner-chunk grid, a
little-endian ``uint64`` offset and ``uint64`` byte count, then the little-endian crc32c of
those bytes (``index_codecs: [bytes(little), crc32c]``).  ``2**64 - 1`` in both marks an
empty inner chunk; rbzarr never writes one, so reading one is damage.  Zarr 3.1.6 reads these
shards (and rbzarr reads zarr's): ``tests/test_shards.py`` checks both directions byte for
byte.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import google_crc32c
import numpy as np
from zarr.codecs import ShardingCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.dtype import parse_data_type

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.zarr.codec import Codec

DTYPE_ATTR = "torch_dtype"  # the array attribute naming the torch dtype

__all__ = [
    "EMPTY",
    "decode_index",
    "encode_index",
    "index_size",
    "sharded_metadata",
]

EMPTY = 2**64 - 1
_ENTRY = np.dtype("<u8")


def index_size(chunks: int) -> int:
    """Bytes of the index of a shard with ``chunks`` inner chunks (16 each, plus 4)."""
    return 16 * chunks + 4


def encode_index(offsets: Sequence[int], nbytes: Sequence[int]) -> bytes:
    """The index of a shard: ``(offset, nbytes)`` per inner chunk, then their crc32c."""
    if len(offsets) == 1:  # one inner chunk (every uncompressed shard): no arrays to build
        raw = struct.pack("<QQ", int(offsets[0]), int(nbytes[0]))
        return raw + google_crc32c.value(raw).to_bytes(4, "little")
    pairs = np.empty((len(offsets), 2), dtype=_ENTRY)
    pairs[:, 0] = offsets
    pairs[:, 1] = nbytes
    raw = pairs.tobytes()
    return raw + google_crc32c.value(raw).to_bytes(4, "little")


def decode_index(raw: bytes, chunks: int, data_end: int, where: str) -> np.ndarray:
    """Parse and check a shard index; returns ``int64 [chunks, 2]`` (offset, nbytes)."""
    if len(raw) != index_size(chunks):
        raise CorruptStoreError(
            f"{where}: shard index holds {len(raw)} bytes, expected {index_size(chunks)}"
        )
    body, stored = raw[:-4], int.from_bytes(raw[-4:], "little")
    if google_crc32c.value(body) != stored:
        raise CorruptStoreError(f"{where}: shard index fails its crc32c checksum")
    pairs = np.frombuffer(body, dtype=_ENTRY).reshape(chunks, 2)
    if bool((pairs == EMPTY).any()):
        raise CorruptStoreError(f"{where}: shard index marks an inner chunk as missing")
    ends = pairs[:, 0] + pairs[:, 1]
    if chunks and (bool((ends < pairs[:, 0]).any()) or int(ends.max()) > data_end):
        raise CorruptStoreError(
            f"{where}: shard index points past the shard's data ({data_end} bytes)"
        )
    return pairs.astype(np.int64)


@functools.lru_cache(maxsize=256)
def sharded_metadata(
    shape: Sequence[int],
    dtype: np.dtype[Any],
    inner: Sequence[int],
    codec: Codec,
    torch_dtype: str,
    dimension_names: tuple[str, ...],
    separator: str = "/",
    image: str = "",
) -> bytes:
    """The ``zarr.json`` of an array stored as one shard of ``inner``-shaped chunks, its
    chunk keys joined by ``separator``, each encoded by ``codec`` (an image codec's frames
    lie as ``image``: ``"hwc"`` or ``"chw"``).

    Documents are cached for the process: trajectories of one schema share them, whichever
    buffer writes them.
    """
    return _sharded_metadata(
        tuple(shape), dtype, tuple(inner), codec, torch_dtype, dimension_names, separator, image
    )


# zarr's metadata objects (their codecs' caches, the indented JSON encoder) are reference
# cycles: made once per schema here, not once per buffer, they are not left to the collector.
@functools.lru_cache(maxsize=512)
def _sharded_metadata(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    inner: tuple[int, ...],
    codec: Codec,
    torch_dtype: str,
    dimension_names: tuple[str, ...],
    separator: str,
    image: str,
) -> bytes:
    """:func:`sharded_metadata`, cached."""
    chain = codec.shard_codecs(dtype, image)
    sharding = ShardingCodec(chunk_shape=inner, codecs=chain)
    data_type = parse_data_type(dtype, zarr_format=3)
    metadata = ArrayV3Metadata(
        shape=shape,
        data_type=data_type,
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": tuple(shape)}},
        chunk_key_encoding={"name": "default", "configuration": {"separator": separator}},
        fill_value=data_type.default_scalar(),
        codecs=(sharding,),
        attributes={DTYPE_ATTR: torch_dtype},
        dimension_names=tuple(dimension_names),
    )
    document = metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]
    return bytes(document.to_bytes())
