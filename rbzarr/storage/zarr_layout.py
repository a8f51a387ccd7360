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
and reads as missing.

**Layout versions.**  Version 2 (the default) stores each array as one Zarr v3 shard
(``sharding_indexed``) with ``dimension_names``; the group's attributes also describe every
array (``rbzarr_layout``), so a reader opens a trajectory with one document and reads the
shards directly (:mod:`rbzarr.storage.shard_trajectory`).  Version 1 stores regular chunks
of ``chunk_bytes`` (:mod:`rbzarr.storage.zarr_chunks`).  Reads follow each trajectory's own
version, so stores of either version, or both, open, load and sample.  ``metadata.json``
and the root attributes record ``layout_version`` (absent: 1).  Chunking and codecs follow
:mod:`rbzarr.storage.chunking`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from zarr.abc.store import Store
from zarr.api import asynchronous as zarr_async
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import StorePath

from rbzarr.dtypes import dtype_name, from_numpy, to_numpy
from rbzarr.storage import shard_trajectory as sharded
from rbzarr.storage import zarr_chunks as chunk_io
from rbzarr.storage import zarr_rows
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES, chunk_shape, pick_codec, plan_key
from rbzarr.storage.layout import Documents, Entry, TrajectoryLayout
from rbzarr.storage.location import Location, translate_errors
from rbzarr.storage.plain_codec import PlainCodec
from rbzarr.storage.shard_remote import IOStats
from rbzarr.storage.shard_writer import dimension_names
from rbzarr.storage.zarr_handles import time_and_envs, trajectory_id
from rbzarr.storage.zarr_inspect import ROOT_ATTR, ZarrInspection
from rbzarr.storage.zarr_open import FIELDS_ATTR, TRAJECTORIES, TrajectoryOpener, group_path
from rbzarr.trajectory import Trajectory, trajectory_from_raw
from rbzarr.validated import ValidatedTrajectory, rows_to_write

__all__ = ["FIELDS_ATTR", "LAYOUT_VERSION", "TRAJECTORIES", "ZarrLayout"]

DTYPE_ATTR = chunk_io.DTYPE_ATTR
LAYOUT_VERSION = 2


class ZarrLayout(ZarrInspection):
    """Trajectories as Zarr v3 groups below ``location``; reads touch only needed bytes.

    Parameters
    ----------
    location
        The store's root.
    codecs
        Compressor per flat key (``"rewards"``, ``"curr_obs/image"``) or ``"default"``;
        ``None`` stores a key uncompressed.  Layout 2 stores unlisted keys uncompressed
        (read in place); layout 1 gives them ``ZstdCodec(level=1)``.
    chunk_bytes
        Target size of one chunk in layout 1 (see :mod:`rbzarr.storage.chunking`).
    store
        A zarr store to use instead of ``location.zarr_store()`` (it must be rooted at
        ``location``); useful to wrap the store, e.g. to count requests.  Layout-2 shards
        are read from ``location`` directly: count them with :attr:`io_stats`.
    handle_cache_size
        How many trajectories keep their opened handles (least recently used go).
    layout_version
        The layout new trajectories are written in: 2 (default) or 1.
    io_stats
        Counts the requests and bytes of layout-2 reads (index reads when a trajectory
        opens, then the pieces of each batch; memory-map gathers count bytes only).  A
        fresh :class:`~rbzarr.storage.shard_remote.IOStats` when not given.
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
        layout_version: int = LAYOUT_VERSION,
        io_stats: IOStats | None = None,
    ) -> None:
        super().__init__(location)
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        if handle_cache_size < 0:
            raise ValueError(f"handle_cache_size must be >= 0, got {handle_cache_size}")
        if layout_version not in (1, 2):
            raise ValueError(f"layout_version must be 1 or 2, got {layout_version!r}")
        self.codecs = dict(codecs or {})
        self.chunk_bytes = chunk_bytes
        self.layout_version = layout_version
        self.io_stats = IOStats() if io_stats is None else io_stats
        self._opener = TrajectoryOpener(location, store, handle_cache_size, self.io_stats)
        self._parents_ready = False

    # -- writing ------------------------------------------------------------------------
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        # docstring inherited
        trajectory = rows_to_write(trajectory)
        tid = trajectory_id(entry)
        fields = trajectory.tensors()
        attrs = {
            **dict(entry),
            FIELDS_ATTR: {key: dtype_name(value.dtype) for key, value in fields.items()},
        }
        files: dict[str, list[Any]] = {}
        zarr_keys = list(fields)
        if self.layout_version >= 2:
            plans = {
                key: plan_key(value.shape, value.element_size(), self.codecs, key)
                for key, value in fields.items()
            }
            files, description = sharded.encode_trajectory(fields, plans, *time_and_envs(entry))
            attrs[sharded.LAYOUT_ATTR] = description
            zarr_keys = [key for key in fields if plans[key].kind == "zarr"]
        self._opener.handles.forget(tid)
        with translate_errors(self.location.url, "writing"):
            if files and not zarr_keys and self._opener.local_files:
                self._write_files(_group(tid), fields, attrs, files)
            else:
                sync(self._write_group(_group(tid), fields, attrs, files, zarr_keys))
        self._opener.handles.forget(tid)

    def _write_files(
        self,
        group: str,
        fields: Mapping[str, torch.Tensor],
        attrs: dict[str, Any],
        files: Mapping[str, list[Any]],
    ) -> None:
        """:meth:`_write_group` on the local filesystem, without the event loop: each
        file written to a temporary name and renamed (readers see whole files only), in
        the same order (groups, data, then the group's attributes)."""
        root = self.location.path
        folder = os.path.join(root, *group.split("/"))
        if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
            raise NotADirectoryError(
                f"delete_dir {folder}: not a directory rbzarr wrote (something else is in the "
                "way of the trajectory group; it is left alone)"
            )
        shutil.rmtree(folder, ignore_errors=True)
        empty = bytes(chunk_io.group_document({}).to_bytes())
        if not self._parents_ready:
            for name in ("zarr.json", f"{TRAJECTORIES}/zarr.json"):
                if not os.path.exists(os.path.join(root, name)):
                    _put_file(root, name, empty)
            self._parents_ready = True
        parts = [key.split("/") for key in fields]
        subgroups = sorted({"/".join([group, *p[:n]]) for p in parts for n in range(len(p))})
        for sub in subgroups:
            _put_file(root, f"{sub}/zarr.json", empty)
        for name, parts in files.items():
            _put_file(root, f"{group}/{name}", *parts)
        _put_file(root, f"{group}/zarr.json", bytes(chunk_io.group_document(attrs).to_bytes()))

    async def _write_group(
        self,
        group: str,
        fields: Mapping[str, torch.Tensor],
        attrs: dict[str, Any],
        files: Mapping[str, list[Any]],
        zarr_keys: Sequence[str],
    ) -> None:
        store = self._opener.store()
        await StorePath(store, group).delete_dir()
        await self._ensure_parents(store)
        # Every document, shard and chunk is set directly and concurrently: no existence
        # checks or listings per array (zarr's create_array costs ~4 extra requests each).
        # The groups first appear without attributes (an unfinished write), then the data.
        parts = [key.split("/") for key in fields]
        subgroups = {"/".join([group, *part[:n]]) for part in parts for n in range(len(part))}
        T, B = (int(d) for d in attrs["shape"][:2])
        from_bytes = default_buffer_prototype().buffer.from_bytes
        await asyncio.gather(
            *(store.set(f"{sub}/zarr.json", chunk_io.group_document({})) for sub in subgroups)
        )
        await asyncio.gather(
            *(
                store.set(f"{group}/{name}", from_bytes(b"".join(parts)))
                for name, parts in files.items()
            ),
            *(
                self._write_array(store, f"{group}/{key}", key, fields[key], (T, B))
                for key in zarr_keys
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

    async def _write_array(
        self, store: Store, path: str, key: str, value: torch.Tensor, size: tuple[int, int]
    ) -> None:
        data = to_numpy(value)
        chunks = chunk_shape(data.shape, data.dtype.itemsize, self.chunk_bytes)
        names = dimension_names(key, data.shape, *size) if self.layout_version >= 2 else None
        compressor = pick_codec(self.codecs, key)
        metadata = chunk_io.array_metadata(data, chunks, compressor, value.dtype, names)
        prototype = default_buffer_prototype()
        document = metadata.to_buffer_dict(prototype)["zarr.json"]
        codec = PlainCodec.of(metadata)
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

    def write_documents(self, documents: Documents) -> Documents:
        """Commit: set the root group's attributes, then write the two JSON mirrors.

        Layout 2 adds ``layout_version`` to the metadata.  Call only after every trajectory
        the index lists is completely written.
        """
        if self.layout_version >= 2:
            metadata = {**documents.metadata, "layout_version": self.layout_version}
            documents = Documents(metadata, documents.trajectory_index)
        attrs = {
            ROOT_ATTR: {
                "metadata": documents.metadata,
                "trajectory_index": documents.trajectory_index,
            }
        }
        with translate_errors(self.location.url, "writing"):
            sync(self._update_root(attrs))
        return super().write_documents(documents)

    async def _update_root(self, attrs: dict[str, Any]) -> None:
        root = await zarr_async.open_group(store=self._opener.store(), mode="a", zarr_format=3)
        await root.update_attributes(attrs)

    def delete(self, entry: Entry) -> None:
        # docstring inherited
        tid = trajectory_id(entry)
        self._opener.handles.forget(tid)
        with translate_errors(self.location.url, "deleting"):
            sync(StorePath(self._opener.store(), _group(tid)).delete_dir())
        self._opener.handles.forget(tid)

    def stored_version(self, entry: Entry) -> int:
        """The layout version a committed trajectory is stored in (1 or 2)."""
        opened = self._opener.open_many([entry])[0]
        return 2 if isinstance(opened, sharded.ShardedTrajectory) else 1

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``; between zarr layouts of different versions
        it is re-encoded (so checkpoints of a layout-1 store are written in layout 2)."""
        if isinstance(target, ZarrLayout) and self.stored_version(entry) != target.layout_version:
            target.write(entry, self.read(entry))
            return
        super().copy_to(target, entry)

    def list_ids(self) -> list[int]:
        # docstring inherited
        with translate_errors(self.location.url, "listing"):
            names = sync(self._list_names(TRAJECTORIES))
        return sorted(int(name) for name in names if name.isdigit() and str(int(name)) == name)

    async def _list_names(self, prefix: str) -> list[str]:
        return [name async for name in self._opener.store().list_dir(prefix)]

    # -- reading ------------------------------------------------------------------------
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        # docstring inherited
        opened = self._opener.open_many([entry])[0]
        wanted = list(opened.dtypes) if keys is None else list(keys)
        zarr_rows.check_keys(opened, wanted, self.location.url)
        arrays = zarr_rows.zarr_arrays(opened, wanted)
        with translate_errors(self.location.url, "reading"):
            values = dict(
                zip(
                    arrays,
                    sync(chunk_io.gather(*(chunk_io.read_whole(a) for a in arrays.values()))),
                    strict=True,
                )
            )
            if isinstance(opened, sharded.ShardedTrajectory):
                described = [key for key in wanted if key not in arrays]
                values.update(sharded.read_whole_shards(self._opener.location(), opened, described))
        fields = {key: from_numpy(np.asarray(values[key]), opened.dtypes[key]) for key in wanted}
        return trajectory_from_raw(
            fields,
            max_episode_length=int(entry.get("max_episode_length", 0)),
            model_weights_id=str(entry.get("model_weights_id", "")),
        )

    def read_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Read flat rows ``rows`` (int64, any order, repeats allowed) of the sampled ``keys``.

        Only the bytes holding the rows are read (layout 1: the chunks holding them, each
        once).  Returns ``{key: tensor[len(rows), ...]}``.
        """
        return self.read_rows_many([(entry, rows)], keys)[0]

    def read_rows_many(
        self, requests: Sequence[tuple[Entry, torch.Tensor]], keys: Sequence[str]
    ) -> list[dict[str, torch.Tensor]]:
        """:meth:`read_rows` for several trajectories, all read in one round."""
        opened = self._opener.open_many([entry for entry, _ in requests])
        results = []
        for (entry, rows), handles in zip(requests, opened, strict=True):
            zarr_rows.check_keys(handles, keys, self.location.url, sampled=True)
            count = int(torch.as_tensor(rows).numel())
            out = {
                key: torch.empty((count, *handles.shape(key)[2:]), dtype=handles.dtypes[key])
                for key in keys
            }
            self.read_rows_into([(entry, rows, torch.arange(count))], keys, out)
            results.append(out)
        return results

    def read_rows_into(
        self,
        requests: Sequence[tuple[Entry, torch.Tensor, torch.Tensor]],
        keys: Sequence[str],
        out: Mapping[str, torch.Tensor],
    ) -> None:
        """Read rows of several trajectories into preallocated blocks, in one round.

        Each request ``(entry, rows, positions)`` puts flat rows ``rows`` of the trajectory
        into rows ``positions`` (int64) of ``out[key]``, for every key; at most one gather
        (or one batch of byte ranges) per (trajectory, key), every row at its final place.
        """
        opened = self._opener.open_many([entry for entry, _, _ in requests])
        with translate_errors(self.location.url, "reading"):
            zarr_rows.read_rows_into(
                self._opener.location(), opened, requests, keys, out, self.io_stats
            )


def _put_file(root: str, name: str, *parts: Any) -> None:
    """Write ``parts`` (byte-like) to ``root/name`` atomically: a temporary file renamed
    into place."""
    path = os.path.join(root, *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temp, "wb") as handle:
            for part in parts:
                handle.write(part)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def _group(tid: int) -> str:
    return group_path(tid)
