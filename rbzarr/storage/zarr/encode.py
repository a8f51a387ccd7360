"""Layout v2 encoding: each array of a trajectory becomes one Zarr v3 shard object.

:func:`encode_array` turns one ``[T(+E), B, ...]`` array into its ``zarr.json`` document,
its shard bytes and the short description the trajectory group's attributes carry (so a
reader opens a trajectory with one request and needs no array document).  The plan of each
key comes from :func:`rbzarr.storage.zarr.chunking.plan_key`.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.storage.io import thread_pool
from rbzarr.storage.zarr import shard_index
from rbzarr.storage.zarr.chunking import KeyPlan
from rbzarr.storage.zarr.codecs import Codec, psnr
from rbzarr.storage.zarr.image_codecs import frames
from rbzarr.trajectory.dtypes import dtype_name, to_numpy
from rbzarr.trajectory.fields import RESET_ROW_FIELDS

if TYPE_CHECKING:
    import torch

__all__ = [
    "FILL_CHECK_BYTES",
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
    fill
        The array is small (at most :data:`FILL_CHECK_BYTES`) and its bytes are all zero:
        every element is Zarr's fill value (``-0.0`` is not: it would read back as ``0.0``).
    """

    document: bytes
    shard: list[Any]
    description: dict[str, Any]
    fill: bool = False


# Arrays up to this size are checked for being all fill values (a file costs more than the
# check; a large array's file is a small share of its write).
FILL_CHECK_BYTES = 16 << 10
_ZEROS = bytes(FILL_CHECK_BYTES)

# The most frames of a lossy key decoded again to measure its PSNR, per trajectory, and the
# share of its frames they are at most (but 2: the first and the last).
PSNR_FRAMES = 8
PSNR_SHARE = 16


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
    key: str,
    value: torch.Tensor,
    plan: KeyPlan,
    T: int,
    B: int,
    separator: str = "/",
    staging: np.ndarray | None = None,
    array: np.ndarray | None = None,
) -> EncodedArray:
    """Encode ``value`` (the raw field ``key``) as one shard following ``plan``, its chunk
    keys joined by ``separator``.

    Large chunked arrays are compressed on the worker pool.  ``staging`` is the buffer
    ``value`` was copied into on add, with spare bytes after it
    (:data:`~rbzarr.trajectory.validated.STAGING_TAIL`): an uncompressed shard puts its
    index there and is one buffer, written or PUT without being joined.  ``array``:
    ``value``'s memory as a numpy array, when known (no torch call, which lets go of the
    GIL, to get it).
    """
    form = _form(key, value, plan, T, B, separator)
    data = np.ascontiguousarray(to_numpy(value) if array is None else array, dtype=form.stored)
    codec = plan.codec
    parts = codec.encode(data, plan.inner, plan.image)
    measured = _measured_psnr(codec, data, parts, plan.image) if codec.lossy else None
    if len(parts) == 1:
        index = _single_index(len(parts[0]))
        size = len(parts[0]) + len(index)
    else:
        nbytes = [len(part) for part in parts]
        offsets = [0, *itertools.accumulate(nbytes)][:-1]
        index = shard_index.encode_index(offsets, nbytes)
        size = sum(nbytes) + len(index)
    shard = _in_staging(parts, index, staging) or [
        *(memoryview(p).cast("B") for p in parts),
        index,
    ]
    description = dict(form.description)
    description["shard_bytes"] = size
    if measured is not None:
        description["psnr"], description["psnr_frames"] = measured
    fill = data.nbytes <= FILL_CHECK_BYTES and _all_zero(data)
    return EncodedArray(form.document, shard, description, fill)


@dataclass(frozen=True)
class _ArrayForm:
    """What every array of one key, shape, dtype and plan stores alike."""

    plan: KeyPlan  # kept: the memo's key holds its identity
    stored: np.dtype[Any]
    document: bytes
    description: dict[str, Any]  # ``shard_bytes`` to be filled in


# The forms of the latest schemas' arrays, by key, shape, dtype, plan (its identity: plans
# are made once per schema), T, B and separator: each was most of a small array's encoding.
_forms: dict[tuple[Any, ...], _ArrayForm] = {}
_FORMS_SIZE = 512


def _form(
    key: str, value: torch.Tensor, plan: KeyPlan, T: int, B: int, separator: str
) -> _ArrayForm:
    """The form of array ``key`` holding ``value`` (made once per schema)."""
    memo_key = (key, value.shape, value.dtype, id(plan), T, B, separator)
    found = _forms.get(memo_key)
    if found is not None and found.plan is plan:
        return found
    stored = stored_dtype(to_numpy(value.reshape(-1)[:0]).dtype)
    shape = tuple(int(d) for d in value.shape)
    codec = plan.codec
    document = shard_index.sharded_metadata(
        shape,
        stored,
        plan.inner,
        codec,
        dtype_name(value.dtype),
        tuple(dimension_names(key, shape, T, B)),
        separator,
        plan.image,
    )
    description = {
        "kind": plan.kind,
        "shape": list(shape),
        "dtype": stored.str,
        "inner": list(plan.inner),
        "checksum": codec.checksum,
        "shard_bytes": 0,
        "separator": separator,
        **codec.described(plan.image),
    }
    if len(_forms) >= _FORMS_SIZE:  # trajectories of many lengths
        _forms.clear()
    found = _forms[memo_key] = _ArrayForm(plan, stored, document, description)
    return found


@functools.lru_cache(maxsize=256)
def _single_index(nbytes: int) -> bytes:
    """The index of a shard of one inner chunk of ``nbytes`` bytes."""
    return shard_index.encode_index([0], [nbytes])


def _all_zero(data: np.ndarray) -> bool:
    """Whether every byte of ``data`` (at most :data:`FILL_CHECK_BYTES`) is zero."""
    return data.tobytes() == _ZEROS[: data.nbytes]  # one memcmp


def one_buffer(parts: list[Any]) -> bytes | memoryview:
    """A shard's parts as one buffer: its only part as it is (not copied), else joined."""
    if len(parts) == 1:
        return memoryview(parts[0]).cast("B")
    return b"".join(parts)


def _in_staging(parts: list[Any], index: bytes, staging: np.ndarray | None) -> list[Any] | None:
    """The shard as one buffer: ``staging`` holding its only part, then ``index`` put in
    its spare bytes; ``None`` when ``parts`` is not ``staging``'s head or the index does
    not fit."""
    if staging is None or len(parts) != 1:
        return None
    data = parts[0]
    if not isinstance(data, np.ndarray) or staging.nbytes < data.nbytes + len(index):
        return None  # an encoded frame, or no room
    size = data.nbytes + len(index)
    if data.nbytes and data.ctypes.data != staging.ctypes.data:
        return None  # a copy (a dtype stored apart, a row subset): not the staged bytes
    staging[data.nbytes : size] = np.frombuffer(index, np.uint8)
    return [staging[:size].data]


def _measured_psnr(
    codec: Codec, data: np.ndarray, parts: list[bytes], layout: str
) -> tuple[float, list[int]]:
    """The PSNR of a sample of the frames, decoded, against ``data`` (JSON: a lossless
    result is recorded as ``1e9``, never ``inf``), and ``[frames measured, frames]``.

    The sample is evenly spaced, the first and last frames included, and at most
    :data:`PSNR_FRAMES` frames and one in :data:`PSNR_SHARE` (2 at least): decoding every
    frame again cost more than encoding them.
    """
    originals = frames(data, layout)
    count = len(originals)
    size = min(count, PSNR_FRAMES, max(2, count // PSNR_SHARE))
    picked = np.unique(np.linspace(0, count - 1, size).round().astype(int))
    decoded = np.empty((len(picked), *originals.shape[1:]), np.uint8)
    jobs = [(parts[int(i)], out) for i, out in zip(picked, decoded, strict=True)]
    thread_pool.run_all(lambda job: codec.decode_frame(*job), jobs, len(jobs) > 1)
    measured = psnr(originals[picked], decoded)
    return round(min(measured, 1e9), 3), [len(picked), count]
