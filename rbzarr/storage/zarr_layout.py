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
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from zarr.abc.store import Store
from zarr.api import asynchronous as zarr_async
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import StorePath

from rbzarr.dtypes import dtype_from_name, dtype_name, from_numpy, to_numpy
from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, RbzarrError
from rbzarr.storage import zarr_chunks as chunk_io
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES, chunk_shape, pick_codec
from rbzarr.storage.layout import Documents, Entry
from rbzarr.storage.location import Location, translate_errors
from rbzarr.storage.zarr_inspect import FIELDS_ATTR, ROOT_ATTR, TRAJECTORIES, ZarrInspection
from rbzarr.trajectory import Trajectory, trajectory_from_raw, validate

__all__ = ["ZarrLayout"]

DTYPE_ATTR = chunk_io.DTYPE_ATTR


@dataclass(frozen=True)
class _Opened:
    """Open handles of one committed trajectory (immutable, so safe to share)."""

    group: str
    dtypes: dict[str, torch.dtype]
    arrays: dict[str, AsyncArray[Any]]


class ZarrLayout(ZarrInspection):
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
            *(store.set(f"{sub}/zarr.json", chunk_io.group_document({})) for sub in subgroups),
            *(
                self._write_array(store, f"{group}/{key}", key, value)
                for key, value in fields.items()
            ),
        )
        # The group's attributes are its commit marker: written only after every array.
        await store.set(f"{group}/zarr.json", chunk_io.group_document(attrs))

    async def _ensure_parents(self, store: Store) -> None:
        """Create the root and ``trajectories`` groups if missing (once per instance)."""
        if self._parents_ready:
            return
        await asyncio.gather(
            *(
                store.set_if_not_exists(name, chunk_io.group_document({}))
                for name in ("zarr.json", f"{TRAJECTORIES}/zarr.json")
            )
        )
        self._parents_ready = True

    async def _write_array(self, store: Store, path: str, key: str, value: torch.Tensor) -> None:
        data = to_numpy(value)
        chunks = chunk_shape(data.shape, data.dtype.itemsize, self.chunk_bytes)
        metadata = chunk_io.array_metadata(data, chunks, pick_codec(self.codecs, key), value.dtype)
        prototype = default_buffer_prototype()
        document = metadata.to_buffer_dict(prototype)["zarr.json"]
        codec = chunk_io.PlainCodec.of(metadata)
        if codec is None or data.ndim == 0:
            array = AsyncArray(metadata, StorePath(store, path), {"write_empty_chunks": True})
            await asyncio.gather(store.set(f"{path}/zarr.json", document), array.setitem(..., data))
            return
        await asyncio.gather(
            store.set(f"{path}/zarr.json", document),
            *(
                chunk_io.write_chunk(
                    store, f"{path}/{metadata.encode_chunk_key(index)}", codec, part
                )
                for index, part in chunk_io.chunks_of(data, chunks)
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
            values = sync(
                chunk_io.gather(*(chunk_io.read_whole(opened.arrays[key]) for key in wanted))
            )
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
            chunk_io.read_rows(opened.arrays[key], steps, envs, T)
            for opened, steps, envs, T in plans
            for key in keys
        ]
        with translate_errors(self.location.url, "reading"):
            blocks = iter(sync(chunk_io.gather(*reads)))
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
            arrays = await chunk_io.gather(
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
