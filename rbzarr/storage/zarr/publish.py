"""Publishing one trajectory group of the zarr layout: its data first, its attributes last.

A trajectory group's attributes are its commit marker: a group without them (or without its
``zarr.json``) is an unfinished write and reads as missing.  :class:`GroupPublisher` puts the
same objects in place in the same order either way (every shard and chunk, then the group's
document with its attributes and, consolidated in it, every subgroup's and array's document,
so a trajectory is its shards and one ``zarr.json``):
:meth:`GroupPublisher.publish_files` straight to the local filesystem without the event loop
(the files inside the new group written in place, its document renamed into place last),
and :meth:`GroupPublisher.publish` through a zarr store, concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.store import Store
from zarr.codecs import BytesCodec
from zarr.core.array import AsyncArray
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.dtype import parse_data_type
from zarr.storage import StorePath

from rbzarr.storage.io import thread_pool
from rbzarr.storage.io.files import (
    commit_file,
    create_file,
    make_directories,
    sync_paths,
    sync_tree,
    write_file,
)
from rbzarr.storage.zarr.chunking import chunk_shape
from rbzarr.storage.zarr.describe import CONSOLIDATED
from rbzarr.storage.zarr.encode import dimension_names, one_buffer
from rbzarr.storage.zarr.open import TRAJECTORIES
from rbzarr.storage.zarr.shard_index import DTYPE_ATTR
from rbzarr.trajectory.dtypes import dtype_name, to_numpy

if TYPE_CHECKING:
    import torch

__all__ = ["EMPTY_GROUP", "PARALLEL_WRITE_BYTES", "GroupPublisher", "GroupWrite", "group_document"]

# A group's files of at least this size are written side by side on the io pool, one each.
PARALLEL_WRITE_BYTES = 1 << 20


@dataclass(frozen=True)
class GroupWrite:
    """One trajectory group to publish: what both ways of publishing put in place."""

    group: str  # its path below the store's root
    fields: Mapping[str, torch.Tensor]
    attrs: dict[str, Any]  # its attributes (the commit marker)
    files: Mapping[str, list[Any]]  # encoded shards and chunks, by path inside the group
    documents: Mapping[str, Any]  # the documents of its arrays, consolidated in the marker


class GroupPublisher:
    """Puts trajectory groups in place below one store's root; the parents are made once.

    The root and ``trajectories`` groups are created, when missing, by the first
    publication of this publisher only.
    """

    def __init__(self) -> None:
        self._parents_ready = False
        self._packs_ready = False

    def publish_files(self, root: str, write: GroupWrite, durable: bool = False) -> None:
        """:meth:`publish` straight to the local filesystem (no event loop); only for
        trajectories with no array of kind ``"zarr"``.

        Inside the new group folder the files are written in place: until its attributes
        exist the group is an unfinished write that no reader opens.  Only the group's
        document (the commit marker, the write's ``documents`` consolidated in it) is renamed
        into place, last.  ``durable`` syncs every file and directory written before the
        marker, then the marker and its directory.
        """
        folder = os.path.join(root, *write.group.split("/"))
        if not self._parents_ready:
            self._make_parents(root, durable, write.group)
        _make_new_folder(folder, durable)
        # What this write makes, parents first: the folders of subgroups and arrays, files.
        made = [folder]
        try:
            self._write_files(folder, write, durable, made)
        except BaseException:
            _remove_made(made)  # a failed write (a full disk) keeps no partial group
            raise

    def publish_pack(
        self,
        root: str,
        pack: GroupWrite,
        members: Sequence[tuple[str, dict[str, Any]]],
        durable: bool = False,
    ) -> None:
        """Write a pack (:mod:`rbzarr.storage.zarr.packs`) straight to the local filesystem:
        the pack's group as :meth:`publish_files` writes a trajectory's, then each member's
        group (``(path below the root, attributes)``), its document alone, renamed into
        place.  A failure removes everything this call made (no member is listed yet), the
        folder of packs too when this call made it and it holds nothing else."""
        folder = os.path.join(root, *pack.group.split("/"))
        if not self._parents_ready:
            self._make_parents(root, durable, f"{TRAJECTORIES}/0")
        packs_folder = os.path.dirname(folder)
        new_parent = not self._packs_ready and not os.path.isdir(packs_folder)
        if not self._packs_ready:
            self._make_parents(root, durable, pack.group)
        try:
            _make_new_folder(folder, durable)
        except BaseException:
            if new_parent:
                _remove_empty_group(packs_folder)
            raise
        made = [folder]
        try:
            self._write_files(folder, pack, durable, made)
            for group, attrs in members:
                member = os.path.join(root, *group.split("/"))
                # Made before it is listed as made: what is in its way is not this write's.
                _make_new_folder(member, durable)
                made.append(member)
                made.append(os.path.join(made[-1], "zarr.json"))
                if durable:
                    synced = [member, os.path.dirname(member)]
                    commit_file(made[-1], [group_bytes(attrs)], durable=True, synced=synced)
                else:  # in its new folder, unlisted: a torn marker reads as no group
                    write_file(made[-1], [group_bytes(attrs)], atomic=False)
        except BaseException:
            _remove_made(made)  # no member's marker without the pack, no pack half written
            if new_parent:
                _remove_empty_group(packs_folder)
            raise
        self._packs_ready = True

    def _make_parents(self, root: str, durable: bool, group: str) -> None:
        """Create the groups above ``group`` (its parent's ``zarr.json`` and the root's)
        where missing, never over one another writer made meanwhile."""
        parent = group.rsplit("/", 1)[0]
        for name in ("zarr.json", f"{parent}/zarr.json"):
            path = os.path.join(root, *name.split("/"))
            if not os.path.exists(path):
                make_directories(os.path.dirname(path), durable)
                # Never over one another writer made meanwhile (its close writes the head).
                create_file(path, [EMPTY_GROUP], durable=durable)
        if parent == TRAJECTORIES:
            self._parents_ready = True

    @staticmethod
    def _write_files(folder: str, write: GroupWrite, durable: bool, made: list[str]) -> None:
        """Write the new group folder's contents, adding each path to ``made`` before it
        is created; its document last.  Only the folders holding files are made (an array
        of fill values has no shard: zarr needs no folder for it)."""
        subgroups = _subgroups(write.fields)
        for sub in _with_parents(_subgroups(write.files)):
            made.append(os.path.join(folder, *sub.split("/")))
            os.mkdir(made[-1])
        large = []
        for name, parts in write.files.items():
            made.append(os.path.join(folder, *name.split("/")))
            if sum(memoryview(part).nbytes for part in parts) >= PARALLEL_WRITE_BYTES:
                large.append((made[-1], parts))
            else:
                write_file(made[-1], parts, atomic=False)
        # Filling the page cache is the cost of a large write: its files on every core.
        thread_pool.run_all(_write_in_place, large, threaded=len(large) > 1)
        # The group's attributes are its commit marker: written only after every array.
        synced = [*made, os.path.dirname(folder)] if durable else []
        marker = _marker(write.attrs, subgroups, write.documents)
        made.append(os.path.join(folder, "zarr.json"))
        commit_file(made[-1], [marker], durable=durable, synced=synced)

    async def publish(
        self,
        store: Store,
        write: GroupWrite,
        compressors: Mapping[str, Any],
        chunk_bytes: int,
        durable_folder: str | None = None,
    ) -> None:
        """Write one trajectory group through ``store`` (its old contents deleted first),
        every object set concurrently, the group's document last, with the write's
        ``documents`` and those of the arrays zarr writes consolidated in it.

        ``compressors`` holds the arrays zarr writes itself (kind ``"zarr"``) and each one's
        compressor (``None``: uncompressed).

        ``durable_folder``: the group's local folder, when ``store`` is local and the write
        must be durable; everything in it is synced before the attributes are written, and
        they after.
        """
        group, fields, files = write.group, write.fields, write.files
        await StorePath(store, group).delete_dir()
        await self._ensure_parents(store)
        try:
            # Every document, shard and chunk is set directly and concurrently, in one round:
            # no existence checks or listings per array (zarr's create_array costs ~4 extra
            # requests each).  Until its attributes exist the group is an unfinished write.
            T, B = (int(d) for d in write.attrs["shape"][:2])
            from_bytes = default_buffer_prototype().buffer.from_bytes
            written = {
                key: _zarr_array(
                    store, f"{group}/{key}", key, fields[key], (T, B), compressor, chunk_bytes
                )
                for key, compressor in compressors.items()
            }
            # Every set ends before a failure is raised, so a cleanup after it finds them all.
            done = await asyncio.gather(
                *(
                    store.set(f"{group}/{name}", from_bytes(one_buffer(parts)))
                    for name, parts in files.items()
                ),
                *(_write_array(array, to_numpy(fields[key])) for key, array in written.items()),
                return_exceptions=True,
            )
            for outcome in done:
                if isinstance(outcome, BaseException):
                    raise outcome
            members = {
                **write.documents,
                **{key: json.loads(_document(array).to_bytes()) for key, array in written.items()},
            }
            # The group's document is its commit marker: written only after every array.
            if durable_folder is not None:
                sync_tree(durable_folder)
            marker = group_bytes(write.attrs, consolidated(_subgroups(fields), members))
            await store.set(f"{group}/zarr.json", _buffer(marker))
            if durable_folder is not None:
                sync_paths([os.path.join(durable_folder, "zarr.json"), durable_folder])
        except Exception:  # not a cancellation (a deadline): the store may hang
            # A failed write (a full disk, an outage) keeps no partial group: the group held
            # only what this write put there, its old contents deleted above.
            with contextlib.suppress(Exception):
                await StorePath(store, group).delete_dir()
            raise

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


def _zarr_array(
    store: Store,
    path: str,
    key: str,
    value: torch.Tensor,
    size: tuple[int, int],
    compressor: Any,
    chunk_bytes: int,
) -> AsyncArray[Any]:
    """A new array of kind ``"zarr"`` for ``value``, not yet written."""
    data = to_numpy(value)
    chunks = chunk_shape(data.shape, data.dtype.itemsize, chunk_bytes)
    names = dimension_names(key, data.shape, *size)
    metadata = _array_metadata(data, chunks, compressor, value.dtype, names)
    return AsyncArray(metadata, StorePath(store, path), {"write_empty_chunks": True})


async def _write_array(array: AsyncArray[Any], data: np.ndarray) -> None:
    """Write an array of kind ``"zarr"`` through zarr: its document (zarr opens these
    arrays by it), then its chunks."""
    path = array.store_path
    # Both end before a failure is raised (the publisher's cleanup must find every file).
    done = await asyncio.gather(
        path.store.set(f"{path.path}/zarr.json", _document(array)),
        array.setitem(..., data),
        return_exceptions=True,
    )
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome


def _document(array: AsyncArray[Any]) -> Buffer:
    """An array's ``zarr.json``, as zarr writes it."""
    return array.metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]


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
    return _buffer(group_bytes(attrs))


def _buffer(raw: bytes) -> Buffer:
    return default_buffer_prototype().buffer.from_bytes(raw)


# Compact JSON, NaN written as zarr writes it; one encoder (``json.dumps`` with arguments
# builds one per call, a share of a small trajectory's marker).
_COMPACT = json.JSONEncoder(allow_nan=True, separators=(",", ":"))


def group_bytes(attrs: Mapping[str, Any], members: Mapping[str, Any] | None = None) -> bytes:
    """The ``zarr.json`` of a Zarr v3 group with ``attrs`` (JSON values) and, when given,
    its ``members`` consolidated (zarr's inline consolidated metadata: member path to its
    document), as zarr writes it but compact: zarr's ``GroupMetadata`` copies the attributes
    and encodes indented, in Python, which cost more than the rest of a small trajectory's
    write."""
    document: dict[str, Any] = {"attributes": attrs, "zarr_format": 3, "node_type": "group"}
    if members is not None:
        document[CONSOLIDATED] = {"kind": "inline", "must_understand": False, "metadata": members}
    return _COMPACT.encode(document).encode()


# The consolidated members of the latest schemas' groups, serialized, by their subgroups and
# the identity of their array documents (each parsed once per schema, never changed): the
# documents themselves, kept so that an identity is not reused, and the JSON.
_members_memo: dict[tuple[Any, ...], tuple[list[Any], str]] = {}
_MEMBERS_MEMO_SIZE = 64


def _marker(attrs: Mapping[str, Any], subgroups: Sequence[str], arrays: Mapping[str, Any]) -> bytes:
    """:func:`group_bytes` of ``attrs`` and the group's consolidated members, the members'
    JSON serialized once per schema (it was most of a small trajectory's marker)."""
    key = (tuple(subgroups), tuple((name, id(document)) for name, document in arrays.items()))
    found = _members_memo.get(key)
    if found is None or any(a is not b for a, b in zip(found[0], arrays.values(), strict=True)):
        members = _COMPACT.encode(consolidated(subgroups, arrays))
        if len(_members_memo) >= _MEMBERS_MEMO_SIZE:
            _members_memo.clear()
        found = _members_memo[key] = (list(arrays.values()), members)
    head = group_bytes(attrs)[:-1]  # without its closing brace
    inline = '{"kind":"inline","must_understand":false,"metadata":'
    return head + f',"{CONSOLIDATED}":{inline}{found[1]}}}}}'.encode()


def consolidated(subgroups: Sequence[str], arrays: Mapping[str, Any]) -> dict[str, Any]:
    """The consolidated members of a trajectory group: its ``subgroups`` (and their
    parents), empty, and the documents of its ``arrays``, by path."""
    empty = {
        "attributes": {},
        "zarr_format": 3,
        "node_type": "group",
        CONSOLIDATED: {"kind": "inline", "must_understand": False, "metadata": {}},
    }
    # Sorted by path: zarr 3.1 nests the flat paths by grouping consecutive siblings.
    return dict(sorted({**{sub: empty for sub in _with_parents(subgroups)}, **arrays}.items()))


def _write_in_place(job: tuple[str, list[Any]]) -> None:
    """Write one new file of a group (a ``(path, parts)`` pair)."""
    write_file(job[0], job[1], atomic=False)


def _make_new_folder(folder: str, durable: bool) -> None:
    """Create the trajectory group's ``folder`` empty: one ``mkdir`` when it is new (the
    common case), else after removing what an earlier, unfinished write left there."""
    try:
        os.mkdir(folder)
        return
    except FileNotFoundError:  # its parent was removed since
        make_directories(os.path.dirname(folder), durable)
    except FileExistsError:
        if os.path.islink(folder) or not os.path.isdir(folder):
            raise NotADirectoryError(
                f"delete_dir {folder}: not a directory rbzarr wrote (something else is in the "
                "way of the trajectory group; it is left alone)"
            ) from None
        shutil.rmtree(folder)
    os.mkdir(folder)


def _remove_made(made: Sequence[str]) -> None:
    """Remove the files and folders of ``made`` (parents listed first) that exist, children
    first; what cannot be removed stays for ``verify --repair``."""
    for path in reversed(made):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.remove(path)


def _remove_empty_group(folder: str) -> None:
    """Remove group ``folder`` if it holds nothing but its own ``zarr.json`` (a parent a
    failed write made); what cannot be removed stays."""
    with contextlib.suppress(OSError):
        if os.listdir(folder) == ["zarr.json"]:
            os.remove(os.path.join(folder, "zarr.json"))
        os.rmdir(folder)


def _subgroups(fields: Mapping[str, Any]) -> list[str]:
    """The folders holding nested ``fields`` keys (``a/b`` is in ``a``): the subgroups of
    the arrays, or the arrays of the files."""
    return sorted({key.rsplit("/", 1)[0] for key in fields if "/" in key})


def _with_parents(paths: Sequence[str]) -> list[str]:
    """``paths`` (``a/b``) and every parent of them (``a``), parents first."""
    found = {"/".join(path.split("/")[:n]) for path in paths for n in range(1, path.count("/") + 2)}
    return sorted(found, key=lambda path: (path.count("/"), path))


EMPTY_GROUP = group_bytes({})
