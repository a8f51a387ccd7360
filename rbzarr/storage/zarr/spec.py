"""How a layout-2 trajectory group describes its arrays, and the checks of a description.

The group's ``rbzarr_layout`` attribute describes every array rbzarr reads itself (written
by :mod:`rbzarr.storage.zarr.encode`); :class:`ArraySpec` is one such description, checked
and converted, with the sizes a reader derives from it.  :func:`check_document` holds an
array's ``zarr.json`` to the description, since plain zarr readers rely on the document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.zarr import shard_index
from rbzarr.storage.zarr.codec import Codec
from rbzarr.storage.zarr.codecs import RAW, image_layout, stored_codec

__all__ = ["FILL", "KINDS", "MAX_CHUNK_BYTES", "ArraySpec", "check_document", "parse_specs"]

# The key of a description that marks an array whose every element is the fill value (its
# bytes all zero): no shard object is stored (zarr reads a missing chunk as the fill value)
# and the description carries its shard's copy (``inline``), which rbzarr reads.
FILL = "fill"
# The kinds of array a layout description names for rbzarr's own readers.
KINDS = ("mapped", "chunked", "image")
# The largest decoded inner chunk a description may ask for (rbzarr writes ~64 KiB ones, or
# one row): a codec is never asked to fill more than this per chunk.
MAX_CHUNK_BYTES = 64 << 20
# A compressed array decodes to at most this many times its shard's bytes, once past
# MAX_RATIO_FLOOR (rbzarr's ~64 KiB zstd chunks of zeros decode ~2000x their bytes).
MAX_RATIO = 4096
MAX_RATIO_FLOOR = 64 << 20
# Every dimension is below this (an int64, as numpy and torch hold shapes).
MAX_DIM = 2**63
# numpy kinds of the dtypes rbzarr stores: bool, signed, unsigned, float, complex.
NUMERIC_KINDS = frozenset("biufc")


@dataclass(frozen=True)
class ArraySpec:
    """One stored array as its trajectory group's attributes describe it.

    Parameters
    ----------
    key
        The flat key (``"curr_obs/image"``).
    kind
        ``"mapped"`` (uncompressed, one inner chunk), ``"chunked"`` (zstd inner chunks) or
        ``"image"`` (one frame per inner chunk, encoded by an image codec).
    shape
        The raw array's shape, ``[T(+E), B, ...]`` or ``[T]``.
    dtype
        The stored numpy dtype (little endian).
    inner
        The inner chunk shape (it divides ``shape``).
    shard_bytes
        The shard object's size, index included.
    separator
        The chunk key separator: the shard is ``c.0.0...`` (``"."``) or, in groups whose
        description names none, ``c/0/0/...`` (``"/"``).
    codec
        The codec spec of a ``"chunked"`` or ``"image"`` array (``"zstd:1"``, ``"qoi"``).
    image
        How an ``"image"`` array's frames lie: ``"hwc"`` or ``"chw"``.
    psnr
        The PSNR a lossy codec measured at encode (dB), else ``None``.
    same_as
        For a ``next_obs`` key stored once (:mod:`rbzarr.storage.zarr.next_obs`): the
        ``curr_obs`` key its other rows are read from, else ``""``.
    rows
        ``(T, B)`` of a key stored once, else ``()``.
    explicit
        The sorted elements ``t * B + b`` a key stored once holds (row ``m`` holds
        ``explicit[m]``), else ``None``.
    coder
        The codec ``kind`` and ``codec`` name (:func:`~rbzarr.storage.zarr.codecs.stored_codec`).
    fill
        Every element is the fill value: no shard object is stored, the description
        carries the shard (:data:`FILL`).
    """

    key: str
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    inner: tuple[int, ...]
    shard_bytes: int
    separator: str = "/"
    codec: str = ""
    image: str = ""
    psnr: float | None = None
    same_as: str = ""
    rows: tuple[int, ...] = ()
    explicit: np.ndarray | None = field(default=None, compare=False)
    coder: Codec = field(default=RAW, compare=False)
    fill: bool = False

    @classmethod
    def parse(cls, key: str, description: Any, where: str) -> ArraySpec:
        """Check and convert a description written by :mod:`rbzarr.storage.zarr.encode`."""
        try:
            spec = cls(
                key=key,
                kind=str(description["kind"]),
                shape=tuple(int(d) for d in description["shape"]),
                dtype=np.dtype(str(description["dtype"])),
                inner=tuple(int(d) for d in description["inner"]),
                shard_bytes=int(description["shard_bytes"]),
                separator=str(description.get("separator", "/")),
                codec=str(description.get("codec", "")),
                image=str(description.get("image", "")),
                psnr=None if description.get("psnr") is None else float(description["psnr"]),
                same_as=str(description.get("same_as", "")),
                rows=tuple(int(d) for d in description.get("rows", ())),
                explicit=_explicit(description.get("explicit")),
                fill=description.get(FILL, False) is True,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: unreadable layout description: {exc}") from exc
        grid_ok = len(spec.inner) == len(spec.shape) and all(
            0 < i < MAX_DIM and 0 <= s < MAX_DIM and s % i == 0
            for s, i in zip(spec.shape, spec.inner, strict=False)
        )
        if (
            spec.kind not in KINDS
            or not spec.shape
            or not grid_ok
            or spec.separator not in (".", "/")
            or spec.dtype.kind not in NUMERIC_KINDS
            or spec.dtype.fields is not None
            or spec.dtype.shape != ()
        ):
            raise CorruptStoreError(f"{where}: invalid layout description {description!r}")
        spec = replace(spec, coder=stored_codec(spec.kind, spec.codec, where))
        if (spec.same_as or spec.explicit is not None or spec.rows) and not _shared_ok(spec):
            raise CorruptStoreError(f"{where}: invalid next_obs description {description!r}")
        if spec.coder.is_image and not _image_ok(spec):
            raise CorruptStoreError(f"{where}: invalid image description {description!r}")
        if not spec.coder.in_place and spec.chunk_bytes > MAX_CHUNK_BYTES:
            raise CorruptStoreError(
                f"{where}: inner chunks of {spec.chunk_bytes} bytes, more than the "
                f"{MAX_CHUNK_BYTES} a decoded chunk may have"
            )
        bound = max(MAX_RATIO_FLOOR, spec.shard_bytes * MAX_RATIO)
        if not spec.coder.in_place and spec.data_bytes > bound:
            raise CorruptStoreError(
                f"{where}: {spec.data_bytes} bytes decoded from a shard of {spec.shard_bytes} "
                f"bytes, more than {MAX_RATIO} times its size"
            )
        if not 0 <= spec.index_offset < spec.shard_bytes or (
            spec.coder.in_place and spec.index_offset != spec.data_bytes
        ):
            raise CorruptStoreError(
                f"{where}: a shard of {spec.shard_bytes} bytes cannot hold {spec.chunks} inner "
                f"chunks of shape {list(spec.inner)} and their index"
            )
        return spec

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The array's shape as read (``[T, B, ...]`` for a key stored once)."""
        if not self.same_as:
            return self.shape
        return (*self.rows, *self.shape[2:])

    @property
    def chunks(self) -> int:
        """Number of inner chunks."""
        return math.prod(s // i for s, i in zip(self.shape, self.inner, strict=True))

    @property
    def envs(self) -> int:
        """``B``, the number of environments."""
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
        """Where the index starts in the shard (the index ends the shard)."""
        return self.shard_bytes - shard_index.index_size(self.chunks)

    def check_index(self, raw: bytes, where: str) -> np.ndarray:
        """Parse and check the shard's index bytes."""
        index = shard_index.decode_index(raw, self.chunks, self.index_offset, where)
        if self.coder.in_place and index.tolist() != [[0, self.data_bytes]]:
            raise CorruptStoreError(
                f"{where}: shard index {index.tolist()} does not describe the uncompressed "
                f"array ([0, {self.data_bytes}])"
            )
        return index


def _explicit(found: Any) -> np.ndarray | None:
    """The ``explicit`` elements of a description (``None`` when absent)."""
    if found is None:
        return None
    if not isinstance(found, list) or not all(type(e) is int for e in found):
        raise TypeError(f"explicit must list integers, got {type(found).__name__}")
    return np.asarray(found, dtype=np.int64)


def _shared_ok(spec: ArraySpec) -> bool:
    """Whether a ``next_obs`` key stored once is described consistently: its rows sorted,
    distinct, inside ``T * B`` and including every row of the last step."""
    explicit = spec.explicit
    if explicit is None or len(spec.rows) != 2 or len(spec.shape) < 2 or not spec.coder.is_image:
        return False
    T, B = spec.rows
    if not (0 < T < MAX_DIM and 0 < B < MAX_DIM) or spec.shape[:2] != (len(explicit), 1):
        return False
    last = explicit[explicit >= (T - 1) * B]
    return (
        spec.same_as.startswith("curr_obs/")
        and bool((np.diff(explicit) > 0).all())
        and (not len(explicit) or (int(explicit[0]) >= 0 and int(explicit[-1]) < T * B))
        and len(last) == B
    )


def _image_ok(spec: ArraySpec) -> bool:
    """Whether an ``"image"`` description lays its frames as the array's shape does, one
    frame per chunk."""
    return spec.image == image_layout(spec.shape, spec.dtype) and spec.inner == spec.coder.inner(
        spec.shape, spec.dtype
    )


def check_document(document: Any, spec: ArraySpec, where: str) -> None:
    """Refuse an array's document (parsed ``zarr.json``, or its group's consolidated copy)
    that is missing, malformed or describes other data than its group's layout description
    (plain zarr readers rely on it).
    """
    name = f"{where}/zarr.json"
    if document is None:
        raise CorruptStoreError(f"{name} is missing")
    try:
        sharding = document["codecs"][0]
        inner = sharding["configuration"]["chunk_shape"]
        encoding = document.get("chunk_key_encoding") or {}
        separator = (encoding.get("configuration") or {}).get("separator", "/")
        agrees = (
            document.get("node_type") == "array"
            and separator == spec.separator
            and tuple(document["shape"]) == spec.shape
            and sharding["name"] == "sharding_indexed"
            and tuple(inner) == spec.inner
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise CorruptStoreError(f"{name} is not a valid array document: {exc}") from exc
    if not agrees:
        raise CorruptStoreError(f"{name} disagrees with its trajectory's layout description")


def parse_specs(layout: Mapping[str, Any], where: str) -> dict[str, ArraySpec | None]:
    """The specs of a v2 group's arrays."""
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
