"""Trajectories as Zarr v3 groups, read whole or by sampled rows.

Layout below the root (a Zarr v3 group)::

    zarr.json                    attrs {"rbzarr": {"metadata": ..., "trajectory_index": ...}}
    metadata.json, trajectory_index.json     the same two documents (the commit point)
    trajectories/<id>/           a group; attrs = the index entry + {"fields": {key: dtype}}
        rewards                  one array per raw tensor field, [T(+E), B, ...]
        curr_obs/image           nested dict fields become subgroups

Each array records its torch dtype in ``attrs["torch_dtype"]``; ``bfloat16`` is stored as
its ``uint16`` bit pattern, so every dtype round-trips bit for bit.  A trajectory group's
attributes are written after all of its arrays: a group without them is an unfinished write
and reads as missing.  Chunking and codecs follow :mod:`rbzarr.storage.chunking`.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numcodecs.zstd import Zstd
from zarr.abc.store import Store
from zarr.api import asynchronous as zarr_async
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.array import AsyncArray
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.core.sync import sync
from zarr.dtype import parse_data_type
from zarr.storage import StorePath

from rbzarr.dtypes import dtype_from_name, dtype_name, from_numpy, to_numpy
from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, RbzarrError
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES, chunk_shape, pick_codec
from rbzarr.storage.layout import Documents, Entry, TrajectoryLayout, register_layout
from rbzarr.storage.location import Location, translate_errors
from rbzarr.trajectory import Trajectory, raw_time_rows, trajectory_from_raw, validate

__all__ = ["ZarrLayout"]

TRAJECTORIES = "trajectories"
ROOT_ATTR = "rbzarr"
FIELDS_ATTR = "fields"
DTYPE_ATTR = "torch_dtype"


@dataclass(frozen=True)
class _Opened:
    """Open handles of one committed trajectory (immutable, so safe to share)."""

    group: str
    dtypes: dict[str, torch.dtype]
    arrays: dict[str, AsyncArray[Any]]


class ZarrLayout(TrajectoryLayout):
    """Trajectories as Zarr v3 groups below ``location``; reads touch only needed chunks.

    Parameters
    ----------
    location
        The store's root.
    codecs
        Compressor per flat key (``"rewards"``, ``"curr_obs/image"``) or ``"default"``;
        ``None`` stores a key uncompressed.  Unlisted keys get ``ZstdCodec(level=1)``.
    chunk_bytes
        Target size of one chunk (see :mod:`rbzarr.storage.chunking`).
    store
        A zarr store to use instead of ``location.zarr_store()`` (it must be rooted at
        ``location``); useful to wrap the store, e.g. to count requests.
    handle_cache_size
        How many trajectories keep their opened array handles (least recently used go).
    """

    format = "zarr"
    supports_row_reads = True

    def __init__(
        self,
        location: Location,
        *,
        codecs: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        store: Store | None = None,
        handle_cache_size: int = 256,
    ) -> None:
        super().__init__(location)
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        if handle_cache_size < 0:
            raise ValueError(f"handle_cache_size must be >= 0, got {handle_cache_size}")
        self.codecs = dict(codecs or {})
        self.chunk_bytes = chunk_bytes
        self._zarr_store = store
        self._cache_size = handle_cache_size
        self._handles: OrderedDict[tuple[int, str], _Opened] = OrderedDict()
        self._generation = 0
        self._lock = threading.Lock()
        self._parents_ready = False

    # -- writing ------------------------------------------------------------------------
    def write(self, entry: Entry, trajectory: Trajectory) -> None:
        # docstring inherited
        validate(trajectory)
        tid = _trajectory_id(entry)
        fields = trajectory.tensors()
        attrs = {
            **dict(entry),
            FIELDS_ATTR: {key: dtype_name(value.dtype) for key, value in fields.items()},
        }
        self._forget(tid)
        with translate_errors(self.location.url, "writing"):
            sync(self._write_group(_group(tid), fields, attrs))
        self._forget(tid)

    async def _write_group(
        self, group: str, fields: Mapping[str, torch.Tensor], attrs: dict[str, Any]
    ) -> None:
        store = self._store()
        await StorePath(store, group).delete_dir()
        await self._ensure_parents(store)
        # Every metadata document and chunk is set directly and concurrently: no existence
        # checks or listings per array (zarr's create_array costs ~4 extra requests each).
        # The group itself first appears without attributes: an unfinished write.
        parts = [key.split("/") for key in fields]
        subgroups = {"/".join([group, *part[:n]]) for part in parts for n in range(len(part))}
        await asyncio.gather(
            *(store.set(f"{sub}/zarr.json", _group_document({})) for sub in subgroups),
            *(
                self._write_array(store, f"{group}/{key}", key, value)
                for key, value in fields.items()
            ),
        )
        # The group's attributes are its commit marker: written only after every array.
        await store.set(f"{group}/zarr.json", _group_document(attrs))

    async def _ensure_parents(self, store: Store) -> None:
        """Create the root and ``trajectories`` groups if missing (once per instance)."""
        if self._parents_ready:
            return
        await asyncio.gather(
            *(
                store.set_if_not_exists(name, _group_document({}))
                for name in ("zarr.json", f"{TRAJECTORIES}/zarr.json")
            )
        )
        self._parents_ready = True

    async def _write_array(self, store: Store, path: str, key: str, value: torch.Tensor) -> None:
        data = to_numpy(value)
        chunks = chunk_shape(data.shape, data.dtype.itemsize, self.chunk_bytes)
        metadata = _array_metadata(data, chunks, pick_codec(self.codecs, key), value.dtype)
        prototype = default_buffer_prototype()
        document = metadata.to_buffer_dict(prototype)["zarr.json"]
        codec = _PlainCodec.of(metadata)
        if codec is None or data.ndim == 0:
            array = AsyncArray(metadata, StorePath(store, path), {"write_empty_chunks": True})
            await asyncio.gather(store.set(f"{path}/zarr.json", document), array.setitem(..., data))
            return
        await asyncio.gather(
            store.set(f"{path}/zarr.json", document),
            *(
                _write_chunk(store, f"{path}/{metadata.encode_chunk_key(index)}", codec, part)
                for index, part in _chunks_of(data, chunks)
            ),
        )

    def write_documents(self, documents: Documents) -> None:
        """Commit: set the root group's attributes, then write the two JSON mirrors.

        Call only after every trajectory the index lists is completely written.
        """
        attrs = {
            ROOT_ATTR: {
                "metadata": documents.metadata,
                "trajectory_index": documents.trajectory_index,
            }
        }
        with translate_errors(self.location.url, "writing"):
            sync(self._update_root(attrs))
        super().write_documents(documents)

    async def _update_root(self, attrs: dict[str, Any]) -> None:
        root = await zarr_async.open_group(store=self._store(), mode="a", zarr_format=3)
        await root.update_attributes(attrs)

    def delete(self, entry: Entry) -> None:
        # docstring inherited
        tid = _trajectory_id(entry)
        self._forget(tid)
        with translate_errors(self.location.url, "deleting"):
            sync(StorePath(self._store(), _group(tid)).delete_dir())
        self._forget(tid)

    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        # docstring inherited
        return (TRAJECTORIES, str(int(entry["trajectory_id"])))

    def list_ids(self) -> list[int]:
        # docstring inherited
        with translate_errors(self.location.url, "listing"):
            names = sync(self._list_names(TRAJECTORIES))
        return sorted(int(name) for name in names if name.isdigit() and str(int(name)) == name)

    async def _list_names(self, prefix: str) -> list[str]:
        return [name async for name in self._store().list_dir(prefix)]

    # -- reading ------------------------------------------------------------------------
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        # docstring inherited
        opened = self._open(entry)
        wanted = list(opened.arrays) if keys is None else list(keys)
        self._check_keys(opened, wanted)
        with translate_errors(self.location.url, "reading"):
            values = sync(_gather(*(_read_whole(opened.arrays[key]) for key in wanted)))
        fields = {
            key: from_numpy(np.asarray(value), opened.dtypes[key])
            for key, value in zip(wanted, values, strict=True)
        }
        return trajectory_from_raw(
            fields,
            max_episode_length=int(entry.get("max_episode_length", 0)),
            model_weights_id=str(entry.get("model_weights_id", "")),
        )

    def read_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Read flat rows ``rows`` (int64, any order, repeats allowed) of the sampled ``keys``.

        Only the chunks holding the rows are fetched, each once and all concurrently (across
        keys too); rows are then gathered with one vectorised index per key.  Returns
        ``{key: tensor[len(rows), ...]}``.
        """
        return self.read_rows_many([(entry, rows)], keys)[0]

    def read_rows_many(
        self, requests: Sequence[tuple[Entry, torch.Tensor]], keys: Sequence[str]
    ) -> list[dict[str, torch.Tensor]]:
        """:meth:`read_rows` for several trajectories, every chunk fetched in one round."""
        plans = [self._plan_rows(entry, rows, keys) for entry, rows in requests]
        reads = [
            _read_rows(opened.arrays[key], steps, envs, T)
            for opened, steps, envs, T in plans
            for key in keys
        ]
        with translate_errors(self.location.url, "reading"):
            blocks = iter(sync(_gather(*reads)))
        return [
            {key: from_numpy(next(blocks), opened.dtypes[key]) for key in keys}
            for opened, *_ in plans
        ]

    def _plan_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> tuple[_Opened, torch.Tensor, np.ndarray, int]:
        T, B = _time_and_envs(entry)
        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= T * B):
            raise IndexError(
                f"trajectory {_trajectory_id(entry)}: rows must be in [0, {T * B}), "
                f"got min {int(rows.min())}, max {int(rows.max())}"
            )
        opened = self._open(entry)
        self._check_keys(opened, keys, sampled=True)
        return opened, torch.div(rows, B, rounding_mode="floor"), (rows % B).numpy(), T

    def _check_keys(self, opened: _Opened, keys: Sequence[str], sampled: bool = False) -> None:
        for key in keys:
            array = opened.arrays.get(key)
            if array is None:
                raise CorruptStoreError(
                    f"{self.location.url}/{opened.group} has no field {key!r}; "
                    f"it holds {sorted(opened.arrays)}"
                )
            if sampled and array.ndim < 2:
                raise ValueError(
                    f"field {key!r} of {self.location.url}/{opened.group} has shape "
                    f"{array.shape}; only [T, B, ...] fields can be read by rows"
                )

    # -- handles ------------------------------------------------------------------------
    def _store(self) -> Store:
        with self._lock:
            if self._zarr_store is None:
                self._zarr_store = self.location.zarr_store()
            return self._zarr_store

    def _open(self, entry: Entry) -> _Opened:
        tid = _trajectory_id(entry)
        key = (tid, str(entry.get("uuid", "")))
        with self._lock:
            opened = self._handles.get(key)
            if opened is not None:
                self._handles.move_to_end(key)
                return opened
            generation = self._generation
        with translate_errors(self.location.url, "reading"):
            try:
                opened = sync(self._open_async(tid))
            except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                if isinstance(exc, RbzarrError):
                    raise
                raise CorruptStoreError(
                    f"{self.location.url}/{_group(tid)}: trajectory {tid} has unreadable "
                    f"metadata: {exc}"
                ) from exc
        _check_shapes(opened, entry, self.location.url)
        with self._lock:
            # A write or delete that ran meanwhile may have made these handles stale.
            if generation == self._generation and self._cache_size > 0:
                self._handles[key] = opened
                while len(self._handles) > self._cache_size:
                    self._handles.popitem(last=False)
        return opened

    async def _open_async(self, tid: int) -> _Opened:
        store = self._store()
        group = _group(tid)
        raw = await store.get(f"{group}/zarr.json", prototype=default_buffer_prototype())
        if raw is None:
            raise CheckpointNotFoundError(
                f"trajectory {tid} not found: {self.location.url}/{group} does not exist"
            )
        fields = json.loads(raw.to_bytes()).get("attributes", {}).get(FIELDS_ATTR)
        if not isinstance(fields, dict):
            raise CheckpointNotFoundError(
                f"trajectory {tid} not found: {self.location.url}/{group} is incomplete "
                "(its write never finished)"
            )
        try:
            arrays = await _gather(
                *(AsyncArray.open(StorePath(store, f"{group}/{key}")) for key in fields)
            )
        except FileNotFoundError as exc:
            raise CorruptStoreError(
                f"trajectory {tid} at {self.location.url}/{group} is committed but an array "
                f"is missing: {exc}"
            ) from exc
        return _Opened(
            group=group,
            dtypes={key: dtype_from_name(name) for key, name in fields.items()},
            arrays=dict(zip(fields, arrays, strict=True)),
        )

    def _forget(self, tid: int) -> None:
        with self._lock:
            self._generation += 1
            for key in [key for key in self._handles if key[0] == tid]:
                del self._handles[key]


@dataclass(frozen=True)
class _PlainCodec:
    """The common chunk encoding, read and written without zarr's codec pipeline.

    A regular grid chunked along time only (every trailing dimension one chunk wide), the
    ``bytes`` codec, then nothing or one ``zstd`` codec, no storage transformers or
    sharding: a chunk is the C-order bytes of a full-size chunk (zarr v3 pads edge chunks to
    the chunk shape), optionally one zstd frame.  Zarr spends most of a cold row read on
    per-chunk bookkeeping; a direct ``store.get`` plus one decode measured 2-8x faster.
    """

    shape: tuple[int, ...]
    stored: np.dtype[Any]  # the dtype with the byte order of the stored bytes
    native: np.dtype[Any]  # the dtype zarr hands out for the array
    zstd: Zstd | None

    @classmethod
    def of(cls, metadata: Any) -> _PlainCodec | None:
        """The plain codec of an array's ``metadata``, or ``None`` when zarr must decode."""
        if not isinstance(metadata, ArrayV3Metadata) or metadata.storage_transformers:
            return None
        grid = metadata.chunk_grid
        if not isinstance(grid, RegularChunkGrid) or not metadata.shape:
            return None
        if tuple(grid.chunk_shape[1:]) != tuple(metadata.shape[1:]):
            return None
        first, *rest = metadata.codecs
        if not isinstance(first, BytesCodec) or len(rest) > 1:
            return None
        compressor = rest[0] if rest else None
        if compressor is not None and not isinstance(compressor, ZstdCodec):
            return None
        native = metadata.data_type.to_native_dtype()
        if native.kind not in "biufc":
            return None
        stored = native
        if native.itemsize > 1:
            if first.endian is None:
                return None
            stored = native.newbyteorder("<" if first.endian.value == "little" else ">")
        zstd = None
        if compressor is not None:
            zstd = Zstd(level=compressor.level, checksum=compressor.checksum)
        return cls(tuple(grid.chunk_shape), stored, native, zstd)

    @property
    def nbytes(self) -> int:
        """Bytes of one decoded chunk."""
        return math.prod(self.shape) * self.stored.itemsize

    def encode(self, part: np.ndarray) -> bytes:
        """The stored bytes of one chunk (``part`` is its rows; a short edge chunk is padded
        with the fill value, zero)."""
        if part.shape != self.shape:
            padded = np.zeros(self.shape, dtype=self.stored)
            padded[: part.shape[0]] = part
            part = padded
        raw = np.ascontiguousarray(part, dtype=self.stored)
        return raw.tobytes() if self.zstd is None else bytes(self.zstd.encode(raw))

    def decode(self, data: Buffer, where: str) -> np.ndarray:
        """One chunk as an array of the chunk shape; ``where`` names it in errors."""
        raw = data.as_numpy_array()
        if self.zstd is not None:
            try:
                raw = np.frombuffer(self.zstd.decode(raw), dtype=np.uint8)
            except (RuntimeError, ValueError) as exc:
                raise CorruptStoreError(f"chunk {where} is not a valid zstd frame: {exc}") from exc
        if raw.nbytes != self.nbytes:
            raise CorruptStoreError(
                f"chunk {where} holds {raw.nbytes} bytes, expected {self.nbytes} "
                f"(shape {self.shape}, dtype {self.stored})"
            )
        chunk = raw.view(self.stored).reshape(self.shape)
        return chunk if self.stored == self.native else chunk.astype(self.native)


# Chunks at least this large are encoded/decoded in a worker thread (zstd releases the
# GIL); smaller ones inline, where a thread hop costs more than the work.
_THREAD_BYTES = 256 * 2**10


def _array_metadata(
    data: np.ndarray, chunks: tuple[int, ...], compressor: Any, torch_dtype: torch.dtype
) -> ArrayV3Metadata:
    """The zarr v3 metadata of a new array holding ``data`` (as ``create_array`` writes it)."""
    data_type = parse_data_type(data.dtype, zarr_format=3)
    if compressor is None:
        compressors: tuple[Any, ...] = ()
    elif isinstance(compressor, list | tuple):
        compressors = tuple(compressor)
    else:
        compressors = (compressor,)
    return ArrayV3Metadata(
        shape=data.shape,
        data_type=data_type,
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}},
        chunk_key_encoding={"name": "default", "configuration": {"separator": "/"}},
        fill_value=data_type.default_scalar(),
        codecs=(BytesCodec(endian="little" if data.dtype.itemsize > 1 else None), *compressors),
        attributes={DTYPE_ATTR: dtype_name(torch_dtype)},
        dimension_names=None,
    )


def _group_document(attrs: dict[str, Any]) -> Buffer:
    """The ``zarr.json`` of a zarr v3 group with ``attrs``."""
    metadata = GroupMetadata(attributes=attrs, zarr_format=3)
    return metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]


def _chunks_of(
    data: np.ndarray, chunks: tuple[int, ...]
) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """``(chunk index, rows)`` of ``data`` chunked along its first axis only."""
    k = chunks[0]
    rest = (0,) * (data.ndim - 1)
    for i in range(-(-data.shape[0] // k)):
        yield (i, *rest), data[i * k : (i + 1) * k]


async def _write_chunk(store: Store, key: str, codec: _PlainCodec, part: np.ndarray) -> None:
    if codec.nbytes >= _THREAD_BYTES:
        encoded = await asyncio.to_thread(codec.encode, part)
    else:
        encoded = codec.encode(part)
    await store.set(key, default_buffer_prototype().buffer.from_bytes(encoded))


async def _read_chunk(array: AsyncArray[Any], codec: _PlainCodec, index: int) -> np.ndarray:
    """Chunk ``index`` (along time) of ``array``, fetched and decoded without zarr."""
    name = array.metadata.encode_chunk_key((index,) + (0,) * (array.ndim - 1))
    store_path = array.store_path
    key = f"{store_path.path}/{name}" if store_path.path else name
    data = await store_path.store.get(key, prototype=default_buffer_prototype())
    where = f"{store_path}/{name}"
    if data is None:
        # Arrays are written with every chunk present: a missing one is damage, not zeros.
        raise CorruptStoreError(f"chunk {where} is missing (expected every chunk to exist)")
    if codec.nbytes >= _THREAD_BYTES:
        return await asyncio.to_thread(codec.decode, data, where)
    return codec.decode(data, where)


async def _read_time_chunks(array: AsyncArray[Any], chunks: np.ndarray) -> np.ndarray:
    """Time chunks ``chunks`` (sorted, distinct) of ``array`` stacked along the first axis.

    Every chunk has ``array.chunks[0]`` rows except possibly the array's last one, which is
    then last in the result.
    """
    codec = _PlainCodec.of(array.metadata)
    if codec is not None:
        parts = await _gather(*(_read_chunk(array, codec, int(i)) for i in chunks))
    else:
        # Anything else (other codecs, sharding, ...): runs of consecutive chunks as one
        # slice each, whose chunks zarr fetches and decodes concurrently.
        k = int(array.chunks[0])
        length = int(array.shape[0])
        runs = np.split(chunks, np.flatnonzero(np.diff(chunks) != 1) + 1)
        slices = (slice(int(run[0]) * k, min(int(run[-1] + 1) * k, length)) for run in runs)
        parts = [np.asarray(part) for part in await _gather(*map(array.getitem, slices))]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, dtype=parts[0].dtype)


async def _read_whole(array: AsyncArray[Any]) -> np.ndarray:
    """All of ``array``."""
    if _PlainCodec.of(array.metadata) is None or 0 in array.shape:
        return np.asarray(await array.getitem(...))
    chunks = np.arange(-(-int(array.shape[0]) // int(array.chunks[0])))
    whole = (await _read_time_chunks(array, chunks))[: array.shape[0]]
    # A lone chunk may be a view of the fetched (read-only) bytes; torch needs writable.
    return whole if whole.flags.writeable else whole.copy()


async def _read_rows(
    array: AsyncArray[Any], steps: torch.Tensor, envs: np.ndarray, T: int
) -> np.ndarray:
    """Rows ``(steps, envs)`` of ``array``, reading only the chunks that hold them.

    Each needed chunk is fetched once, all concurrently, then rows are gathered with a
    single fancy index.  This measured 3-5x faster than an orthogonal selection of the
    distinct time steps, which zarr 3.1 indexes element-wise over every dimension.
    """
    raw = raw_time_rows(steps, T, int(array.shape[0])).numpy()
    if raw.size == 0 or 0 in array.shape[2:]:
        return np.empty((raw.size, *array.shape[2:]), dtype=array.dtype)
    k = int(array.chunks[0])
    chunks = np.unique(raw // k)
    block = await _read_time_chunks(array, chunks)
    where = np.searchsorted(chunks, raw // k) * k + raw % k
    return np.ascontiguousarray(block[where, envs])


async def _gather(*awaitables: Any) -> list[Any]:
    return list(await asyncio.gather(*awaitables))


def _trajectory_id(entry: Entry) -> int:
    try:
        return int(entry["trajectory_id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"index entry has no valid 'trajectory_id': {entry!r}") from exc


def _time_and_envs(entry: Entry) -> tuple[int, int]:
    shape = entry.get("shape")
    if not isinstance(shape, Sequence) or len(shape) < 2:
        raise CorruptStoreError(f"index entry has no [T, B, ...] 'shape': {entry!r}")
    return int(shape[0]), int(shape[1])


def _check_shapes(opened: _Opened, entry: Entry, url: str) -> None:
    """Refuse data whose [T, B] disagrees with its index entry (reset rows allowed)."""
    T, B = _time_and_envs(entry)
    for key, array in opened.arrays.items():
        if array.ndim < 2:
            continue
        rows, envs = int(array.shape[0]), int(array.shape[1])
        if envs != B or rows < T or (rows > T and T % (rows - T) != 0):
            raise CorruptStoreError(
                f"{url}/{opened.group}/{key}: shape {tuple(array.shape)} disagrees with the "
                f"index entry's shape {list(entry['shape'])}"
            )


def _group(tid: int) -> str:
    return f"{TRAJECTORIES}/{tid}"


register_layout("zarr", ZarrLayout)
