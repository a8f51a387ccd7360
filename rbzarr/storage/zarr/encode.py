"""Layout v2 encoding: each array of a trajectory becomes one Zarr v3 shard object.

:func:`encode_array` turns one ``[T(+E), B, ...]`` array into its ``zarr.json`` document,
its shard bytes and the short description the trajectory group's attributes carry (so a
reader opens a trajectory with one request and needs no array document).  The plan of each
key comes from :func:`rbzarr.storage.zarr.chunking.plan_key`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numcodecs import zstd

from rbzarr.storage.io import thread_pool
from rbzarr.storage.zarr import shard_index
from rbzarr.storage.zarr.chunking import KeyPlan
from rbzarr.storage.zarr.codecs import Codec, psnr
from rbzarr.trajectory.dtypes import dtype_name, to_numpy
from rbzarr.trajectory.fields import RESET_ROW_FIELDS

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOCAL_SEPARATOR",
    "EncodedArray",
    "dimension_names",
    "encode_array",
    "shard_key",
    "stored_dtype",
]

# The chunk key separator of shards written to local files: ``c.0.0.0`` is one file in
# the array's folder, where ``c/0/0/0`` made a folder per dimension (most of a small
# trajectory's write went to ``mkdir``, and every folder takes a block on disk).  Object
# stores have no folders and keep ``/``.
LOCAL_SEPARATOR = "."
# Arrays at least this large are compressed on the worker pool (zstd releases the GIL).
THREADED_BYTES = 1 << 20


@dataclass(frozen=True)
class EncodedArray:
    """One array, ready to store.

    Parameters
    ----------
    document
        The array's ``zarr.json``, stored at ``<key>/zarr.json``.
    shard
        The shard's parts (buffers, then the index), written one after the other uncopied
        to ``<key>/<shard_key>``.
    description
        What the trajectory group's attributes record of the array: ``kind``, ``shape``,
        ``dtype``, ``inner``, ``checksum``, ``shard_bytes`` and the chunk key's
        ``separator``.
    """

    document: bytes
    shard: list[Any]
    description: dict[str, Any]


def stored_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype of the stored bytes: little endian."""
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def shard_key(ndim: int, separator: str = "/") -> str:
    """The chunk key of an array's only shard: ``c/0/0/...``, or ``c.0.0...``."""
    return separator.join(["c", *("0" * ndim)])


def dimension_names(key: str, shape: tuple[int, ...], T: int, B: int) -> list[str]:
    """The Zarr dimension names of array ``key``: ``time``, ``env``, then per-key names.

    Reset-row fields (``T + E`` rows) use ``time_with_resets`` for their first dimension
    (xarray needs one length per name).
    """
    name = key.replace("/", "_")
    names = [f"{name}_dim{axis}" for axis in range(len(shape))]
    if shape:
        if shape[0] == T:
            names[0] = "time"
        elif key.rsplit("/", maxsplit=1)[-1] in RESET_ROW_FIELDS and shape[0] > T:
            names[0] = "time_with_resets"
    if len(shape) >= 2 and shape[1] == B:
        names[1] = "env"
    return names


def encode_array(
    key: str, value: torch.Tensor, plan: KeyPlan, T: int, B: int, separator: str = "/"
) -> EncodedArray:
    """Encode ``value`` (the raw field ``key``) as one shard following ``plan``, its chunk
    keys joined by ``separator``.

    Large chunked arrays are compressed on the worker pool.
    """
    data = to_numpy(value)
    stored = stored_dtype(data.dtype)
    data = np.ascontiguousarray(data, dtype=stored)
    parts: list[Any]
    measured: float | None = None
    if plan.kind == "mapped":
        parts = [data.reshape(-1).view(np.uint8)]
    elif plan.kind == "image":
        parts = encode_frames(plan.codec, frames(data, plan.image))
        if plan.codec.lossy:
            measured = _measured_psnr(plan.codec, data, parts, plan.image)
    else:
        parts = _compressed(_inner_chunks(data, plan.inner), plan.level or 1, plan.checksum)
    nbytes = [len(part) for part in parts]
    offsets = [0, *itertools.accumulate(nbytes)][:-1]
    shard = [*(memoryview(p).cast("B") for p in parts), shard_index.encode_index(offsets, nbytes)]
    size = sum(nbytes) + len(shard[-1])
    shape = tuple(int(d) for d in data.shape)
    document = shard_index.sharded_metadata(
        shape,
        stored,
        plan.inner,
        plan.level if plan.kind == "chunked" else None,
        plan.checksum,
        dtype_name(value.dtype),
        tuple(dimension_names(key, shape, T, B)),
        separator,
        (plan.codec.text, plan.image) if plan.kind == "image" else None,
    )
    description = {
        "kind": plan.kind,
        "shape": list(shape),
        "dtype": stored.str,
        "inner": list(plan.inner),
        "checksum": plan.checksum,
        "shard_bytes": size,
        "separator": separator,
    }
    if plan.kind != "mapped":
        description["codec"] = plan.codec.text
    if plan.kind == "image":
        description["image"] = plan.image
    if measured is not None:
        description["psnr"] = measured
    return EncodedArray(document, shard, description)


def frames(data: np.ndarray, layout: str) -> np.ndarray:
    """``[T * B, H, W, C]`` views of the frames of a ``[T, B, ...]`` uint8 array whose
    trailing dimensions lie as ``layout`` (``"hwc"`` or ``"chw"``)."""
    flat = data.reshape(-1, *data.shape[2:])
    return flat.transpose(0, 2, 3, 1) if layout == "chw" else flat


def encode_frames(codec: Codec, images: np.ndarray) -> list[bytes]:
    """Every frame encoded by ``codec``, on the worker pool (imagecodecs releases the GIL)."""
    return thread_pool.run_all(codec.encode_frame, list(images), len(images) > 1)


def _measured_psnr(codec: Codec, data: np.ndarray, parts: list[bytes], layout: str) -> float:
    """The PSNR of the decoded frames against ``data``, over the whole array (JSON: a
    lossless result is recorded as ``1e9``, never ``inf``)."""
    originals = frames(data, layout)
    decoded = np.empty(originals.shape, np.uint8)
    jobs = list(zip(parts, decoded, strict=True))
    thread_pool.run_all(lambda job: codec.decode_frame(*job), jobs, len(jobs) > 1)
    measured = psnr(originals, decoded)
    return round(min(measured, 1e9), 3)


def _inner_chunks(data: np.ndarray, inner: tuple[int, ...]) -> np.ndarray:
    """``[chunks, chunk_bytes]`` uint8: the inner chunks of ``data`` in C order of the grid.

    Inner chunks are ``(k,)`` for a 1-D array, else ``(k, 1, *trailing)``.
    """
    k = inner[0]
    rows = data.shape[0]
    if data.ndim == 1:
        return data.reshape(rows // k, -1).view(np.uint8).reshape(rows // k, -1)
    envs = data.shape[1]
    blocks = data.reshape(rows // k, k, envs, -1).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).view(np.uint8).reshape(rows // k * envs, -1)


def _compressed(chunks: np.ndarray, level: int, checksum: bool) -> list[bytes]:
    threaded = chunks.nbytes >= THREADED_BYTES
    return thread_pool.run_all(
        lambda chunk: zstd.compress(chunk, level, checksum), list(chunks), threaded
    )
