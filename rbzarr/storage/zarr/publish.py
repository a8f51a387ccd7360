"""Publishing one trajectory group of the zarr layout: its data first, its attributes last.

A trajectory group's attributes are its commit marker: a group without them is an
unfinished write and reads as missing.  :class:`GroupPublisher` puts the same objects in
place in the same order either way (the subgroups without attributes, then every document,
shard and chunk, then the group's attributes): :meth:`GroupPublisher.publish_files`
straight to the local filesystem without the event loop, each file renamed into place, and
:meth:`GroupPublisher.publish` through a zarr store, concurrently.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from zarr.abc.store import Store
from zarr.codecs import BytesCodec
from zarr.core.array import AsyncArray
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.dtype import parse_data_type
from zarr.storage import StorePath

from rbzarr.storage.names import temporary_name
from rbzarr.storage.zarr.chunking import chunk_shape, pick_codec
from rbzarr.storage.zarr.encode import dimension_names
from rbzarr.storage.zarr.open import TRAJECTORIES
from rbzarr.storage.zarr.shard_index import DTYPE_ATTR
from rbzarr.trajectory.dtypes import dtype_name, to_numpy

__all__ = ["GroupPublisher", "group_document"]


class GroupPublisher:
    """Puts trajectory groups in place below one store's root; the parents are made once.

    The root and ``trajectories`` groups are created, when missing, by the first
    publication of this publisher only.
    """

    def __init__(self) -> None:
        self._parents_ready = False

    def publish_files(
        self,
        root: str,
        group: str,
        fields: Mapping[str, torch.Tensor],
        attrs: dict[str, Any],
        files: Mapping[str, list[Any]],
    ) -> None:
        """:meth:`publish` straight to the local filesystem (no event loop), each file renamed
        into place; only for trajectories with no array of kind ``"zarr"``."""
        folder = os.path.join(root, *group.split("/"))
        if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
            raise NotADirectoryError(
                f"delete_dir {folder}: not a directory rbzarr wrote (something else is in the "
                "way of the trajectory group; it is left alone)"
            )
        shutil.rmtree(folder, ignore_errors=True)
        empty = bytes(group_document({}).to_bytes())
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
        _put_file(root, f"{group}/zarr.json", bytes(group_document(attrs).to_bytes()))

    async def publish(
        self,
        store: Store,
        group: str,
        fields: Mapping[str, torch.Tensor],
        attrs: dict[str, Any],
        files: Mapping[str, list[Any]],
        zarr_keys: Sequence[str],
        codecs: Mapping[str, Any],
        chunk_bytes: int,
    ) -> None:
        """Write one trajectory group through ``store`` (its old contents deleted first),
        every object set concurrently, the group's attributes last."""
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
            *(store.set(f"{sub}/zarr.json", group_document({})) for sub in subgroups)
        )
        await asyncio.gather(
            *(
                store.set(f"{group}/{name}", from_bytes(b"".join(parts)))
                for name, parts in files.items()
            ),
            *(
                _write_array(
                    store,
                    f"{group}/{key}",
                    key,
                    fields[key],
                    (T, B),
                    codecs,
                    chunk_bytes,
                )
                for key in zarr_keys
            ),
        )
        # The group's attributes are its commit marker: written only after every array.
        await store.set(f"{group}/zarr.json", group_document(attrs))

    async def _ensure_parents(self, store: Store) -> None:
        """Create the root and ``trajectories`` groups if missing (once per instance)."""
        if self._parents_ready:
            return
        await asyncio.gather(
            *(
                store.set_if_not_exists(name, group_document({}))
                for name in ("zarr.json", f"{TRAJECTORIES}/zarr.json")
            )
        )
        self._parents_ready = True


async def _write_array(
    store: Store,
    path: str,
    key: str,
    value: torch.Tensor,
    size: tuple[int, int],
    codecs: Mapping[str, Any],
    chunk_bytes: int,
) -> None:
    """Write one array of kind ``"zarr"`` through zarr: its document, then its chunks."""
    data = to_numpy(value)
    chunks = chunk_shape(data.shape, data.dtype.itemsize, chunk_bytes)
    names = dimension_names(key, data.shape, *size)
    metadata = _array_metadata(data, chunks, pick_codec(codecs, key), value.dtype, names)
    document = metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]
    array = AsyncArray(metadata, StorePath(store, path), {"write_empty_chunks": True})
    await asyncio.gather(store.set(f"{path}/zarr.json", document), array.setitem(..., data))


def _array_metadata(
    data: np.ndarray,
    chunks: tuple[int, ...],
    compressor: Any,
    torch_dtype: torch.dtype,
    names: Sequence[str],
) -> ArrayV3Metadata:
    """The Zarr v3 metadata of a new array holding ``data``, as ``create_array`` writes it."""
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
        dimension_names=tuple(names),
    )


def group_document(attrs: dict[str, Any]) -> Buffer:
    """The ``zarr.json`` of a Zarr v3 group with ``attrs``."""
    metadata = GroupMetadata(attributes=attrs, zarr_format=3)
    return metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]


def _put_file(root: str, name: str, *parts: Any) -> None:
    """Write ``parts`` (byte-like) to ``root/name`` atomically (a temporary file renamed)."""
    path = os.path.join(root, *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = temporary_name(path)
    try:
        with open(temp, "wb") as handle:
            for part in parts:
                handle.write(part)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
