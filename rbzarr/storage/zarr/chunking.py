"""Chunk and codec policy of the zarr layout (layout 2).

**One shard per array** (:func:`plan_key`).  Every array of a trajectory is one
object, a Zarr v3 ``sharding_indexed`` shard holding the whole array; what varies per key
is the inner chunking and the codec:

* **unconfigured keys (not image-like): uncompressed, one inner chunk** (kind
  ``"mapped"``).  The shard's data is then the array's C-order bytes at offset 0, so a
  sampled row ``(t, b)`` is read in place: gathered out of a memory map of the file
  locally (no decode, no syscall per row), one byte range per run of adjacent rows on
  object stores.  This covers small per-step keys (rewards, dones, actions, states) and
  raw images alike;
* **keys given a ``ZstdCodec``** (kind ``"chunked"``): inner chunks of ``k`` steps of one
  env, ``(k, 1, *trailing)``, ``k`` the largest divisor of the row count with ``k`` rows in
  at most :data:`INNER_CHUNK_BYTES` (64 KiB).  An image row (21 KB for ``3x84x84``) is its
  own inner chunk, so a sampled row decodes only its own bytes; rewards get 64 KiB runs;
* **image codecs** (kind ``"image"``; unconfigured image-like keys get ``"lossless"``, see
  :mod:`rbzarr.storage.zarr.codecs`): one frame per inner chunk, ``(1, 1, *trailing)``,
  each an image codec's stream, so a sampled row decodes only its own frame;
* any other codec (kind ``"zarr"``), and 0-d or zero-size arrays: regular chunks written
  and read through zarr's pipeline (correct, with zarr's per-chunk overhead).

**Why uncompressed by default.**  A sampled image row then costs a copy out of a memory
map, where a compressed one costs a decode of its chunk, several times slower than the
copy on one core; and the writer must keep up with image rollouts, faster than zstd-1
encodes on one core.  So the default trades disk (images stored raw) for reads at
memory-map speed and writes at copy speed; ``python -m benchmarks`` measures both against
the peers (``docs/benchmarks.md``).  Compression is one argument away:
``codecs={"curr_obs/image": ZstdCodec(level=1)}``; real frames compress less than the
benchmarks' synthetic ones.

**Arrays zarr writes** (kind ``"zarr"``) get regular chunks of ``k`` whole time steps and
every environment, ``(k, B, *trailing)`` (:func:`chunk_shape`): ``k_max`` the most steps
that fit in ``chunk_bytes`` (default 512 KiB; at least one step), ``k`` the largest divisor
of the row count in ``[k_max / 2, k_max]`` when there is one, else the even split
``ceil(rows / ceil(rows / k_max))`` (zarr pads a short last chunk to full size).  Their
compressor is the codec's ``zarr_compressor()``: the caller's zarr codec object, zstd at the
codec's level, none for ``"raw"``, and ``zstd`` level 1 otherwise (nothing configured, or an
image codec on a 0-d or zero-size array).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rbzarr.storage.zarr.codecs import INNER_CHUNK_BYTES, RAW, Codec, Zstd, choose_codec

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "INNER_CHUNK_BYTES",
    "KeyPlan",
    "chunk_shape",
    "plan_key",
]

DEFAULT_CHUNK_BYTES = 512 * 2**10


@dataclass(frozen=True)
class KeyPlan:
    """How layout v2 stores one array (see the module docs).

    Parameters
    ----------
    kind
        ``"mapped"`` (one uncompressed inner chunk, the whole array: read in place),
        ``"chunked"`` (zstd inner chunks), ``"image"`` (one frame per inner chunk, each an
        image codec's stream), all three the codec's own kind, or ``"zarr"`` (any other
        codec, and 0-d or zero-size arrays: regular chunks written and read by zarr's
        pipeline).
    inner
        The inner chunk shape: the whole array for ``"mapped"``, ``(k, 1, *trailing)`` for
        ``"chunked"``, ``(1, 1, *trailing)`` for ``"image"``, empty for ``"zarr"``.
    codec
        The key's codec (:mod:`rbzarr.storage.zarr.codecs`).
    image
        ``"hwc"`` or ``"chw"``: how an ``"image"`` plan's frames lie, else ``""``.
    """

    kind: str
    inner: tuple[int, ...] = ()
    codec: Codec = RAW
    image: str = ""

    @property
    def by_zarr(self) -> bool:
        """Whether zarr's pipeline writes and reads the array (kind ``"zarr"``)."""
        return self.kind == "zarr"


def chunk_shape(shape: Sequence[int], itemsize: int, chunk_bytes: int) -> tuple[int, ...]:
    """The chunk shape of an array of ``shape``: ``(k, *shape[1:])``, see the module docs.

    Zero-length dimensions get a chunk length of 1 (zarr needs positive chunk lengths); a
    0-d array has the empty chunk shape.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    if not shape:
        return ()
    trailing = tuple(max(1, int(d)) for d in shape[1:])
    step_bytes = math.prod(trailing) * itemsize
    rows = max(1, int(shape[0]))
    most = max(1, min(rows, chunk_bytes // step_bytes))
    divisors = [k for k in range(most, (most + 1) // 2 - 1, -1) if rows % k == 0]
    steps = divisors[0] if divisors else -(-rows // -(-rows // most))
    return (steps, *trailing)


def plan_key(
    shape: Sequence[int], dtype: np.dtype[Any], codecs: Mapping[str, Codec], key: str
) -> KeyPlan:
    """The layout v2 plan of array ``key`` of ``shape`` and numpy ``dtype`` (see the module
    docs); ``codecs`` are parsed specs (:func:`~rbzarr.storage.zarr.codecs.parse_codecs`)."""
    if not shape or 0 in shape:
        return KeyPlan("zarr", codec=codecs.get(key, codecs.get("default", Zstd(1))))
    codec = choose_codec(codecs, key, shape, dtype)
    return KeyPlan(
        codec.kind, codec.inner(shape, dtype), codec=codec, image=codec.layout(shape, dtype)
    )
