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
shards directly (:mod:`rbzarr.storage.zarr.sharded`).  Version 1 stores regular chunks
of ``chunk_bytes`` (:mod:`rbzarr.storage.zarr.chunks`).  Reads follow each trajectory's own
version, so stores of either version, or both, open, load and sample.  ``metadata.json``
and the root attributes record ``layout_version`` (absent: 1).  Chunking and codecs follow
:mod:`rbzarr.storage.zarr.chunking`.

The class is built in layers: :class:`~rbzarr.storage.zarr.inspect.ZarrInspection` (what
the metadata says), :class:`~rbzarr.storage.zarr.reads.ZarrReads` (reading) and
:class:`ZarrLayout` (writing, through :class:`~rbzarr.storage.zarr.groups.GroupWriter`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zarr.abc.store import Store
from zarr.api import asynchronous as zarr_async
from zarr.core.sync import sync
from zarr.storage import StorePath

from rbzarr.storage.backends import translate_errors
from rbzarr.storage.documents import Documents, Entry
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.location import Location
from rbzarr.storage.zarr import chunks as chunk_io
from rbzarr.storage.zarr import sharded
from rbzarr.storage.zarr.chunking import DEFAULT_CHUNK_BYTES, plan_key
from rbzarr.storage.zarr.groups import GroupWriter
from rbzarr.storage.zarr.handles import time_and_envs, trajectory_id
from rbzarr.storage.zarr.inspect import ROOT_ATTR
from rbzarr.storage.zarr.open import FIELDS_ATTR, TRAJECTORIES, group_path
from rbzarr.storage.zarr.reads import ZarrReads
from rbzarr.storage.zarr.remote import IOStats
from rbzarr.trajectory.dtypes import dtype_name
from rbzarr.trajectory.model import Trajectory
from rbzarr.trajectory.validated import ValidatedTrajectory, rows_to_write

__all__ = ["FIELDS_ATTR", "LAYOUT_VERSION", "TRAJECTORIES", "ZarrLayout"]

DTYPE_ATTR = chunk_io.DTYPE_ATTR
LAYOUT_VERSION = 2


class ZarrLayout(ZarrReads):
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
        Target size of one chunk in layout 1 (see :mod:`rbzarr.storage.zarr.chunking`).
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
        fresh :class:`~rbzarr.storage.zarr.remote.IOStats` when not given.

    Raises
    ------
    ValueError
        ``chunk_bytes`` is not positive, ``handle_cache_size`` is negative or
        ``layout_version`` is neither 1 nor 2.
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
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        if handle_cache_size < 0:
            raise ValueError(f"handle_cache_size must be >= 0, got {handle_cache_size}")
        if layout_version not in (1, 2):
            raise ValueError(f"layout_version must be 1 or 2, got {layout_version!r}")
        self.codecs = dict(codecs or {})
        self.chunk_bytes = chunk_bytes
        self.layout_version = layout_version
        super().__init__(location, store, handle_cache_size, io_stats)
        self._writer = GroupWriter()

    # -- writing ------------------------------------------------------------------------
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Write the trajectory as the group ``trajectories/<id>``, replacing any.

        Layout 2 stores each ``mapped`` / ``chunked`` array as one shard, the rest through
        zarr; layout 1 stores regular chunks.  The group's attributes (the entry and the
        field dtypes) are written last: until then the trajectory reads as missing.

        Parameters
        ----------
        entry
            The trajectory's index entry (its id and ``shape`` are used).
        trajectory
            The trajectory; validated unless it is a ``ValidatedTrajectory``.

        Raises
        ------
        InvalidTrajectoryError
            ``trajectory`` is not a valid trajectory.
        CorruptStoreError
            ``entry`` has no valid ``trajectory_id`` or ``shape``.
        StorageUnavailableError
            The backend failed, or something rbzarr did not write is in the way of the
            group (it is left alone).
        """
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
                self._writer.write_files(self.location.path, _group(tid), fields, attrs, files)
            else:
                write = self._writer.write_group(
                    self._opener.store(),
                    _group(tid),
                    fields,
                    attrs,
                    files,
                    zarr_keys,
                    self.codecs,
                    self.chunk_bytes,
                    self.layout_version,
                )
                sync(write)
        self._opener.handles.forget(tid)

    def write_documents(self, documents: Documents) -> Documents:
        """Commit: set the root group's attributes, then write the two JSON mirrors.

        Layout 2 adds ``layout_version`` to the metadata.  Call only after every trajectory
        the index lists is completely written.

        Parameters
        ----------
        documents
            The documents to commit.

        Returns
        -------
        Documents
            The documents as written (with ``layout_version`` in layout 2).

        Raises
        ------
        StorageUnavailableError
            The backend failed.
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
        """Remove the trajectory's group and drop its cached handles; missing is no error.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Raises
        ------
        CorruptStoreError
            ``entry`` has no valid ``trajectory_id``.
        StorageUnavailableError
            The backend failed.
        """
        tid = trajectory_id(entry)
        self._opener.handles.forget(tid)
        with translate_errors(self.location.url, "deleting"):
            sync(StorePath(self._opener.store(), _group(tid)).delete_dir())
        self._opener.handles.forget(tid)

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``; between zarr layouts of different versions
        it is re-encoded (so checkpoints of a layout-1 store are written in layout 2).

        Parameters
        ----------
        target
            The layout to copy into.
        entry
            The trajectory's index entry.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing here.
        StoreExistsError
            ``target`` already holds data at the trajectory's path.
        """
        if isinstance(target, ZarrLayout) and self.stored_version(entry) != target.layout_version:
            target.write(entry, self.read(entry))
            return
        super().copy_to(target, entry)


def _group(tid: int) -> str:
    return group_path(tid)
