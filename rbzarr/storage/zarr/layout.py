"""Trajectories as Zarr v3 groups, read whole or by sampled rows.

Layout below the root (a Zarr v3 group)::

    zarr.json                    attrs {"rbzarr": {"metadata": ..., "trajectory_index": ...}}
    metadata.json, trajectory_index.json     RLinf's two documents (a mirror of the log)
    trajectories/<id>/           a group; attrs = the index entry + {"fields": {key: dtype}}
                                 + {"rbzarr_layout": a description of every array}
        rewards                  one array per raw tensor field, [T(+E), B, ...]
        curr_obs/image           nested dict fields become subgroups

Each array is one Zarr v3 shard (``sharding_indexed``) with ``dimension_names`` and records
its torch dtype in ``attrs["torch_dtype"]``; ``bfloat16`` is stored as its ``uint16`` bit
pattern, so every dtype round-trips bit for bit.  On a local filesystem the shard is the file
``<array>/c.0.0...`` (chunk keys joined by ``"."``, so no folder per dimension); on object
stores, and in local stores written before, ``<array>/c/0/0/...``.  The description names
the separator; plain zarr reads either from the array's document.  The group's description
lets a reader open a trajectory with one document and read the shards directly
(:mod:`rbzarr.storage.zarr.sharded`).  A trajectory group's attributes are written after all
of its arrays: a group without them is an unfinished write and reads as missing.  On a
``durable`` location (:meth:`~rbzarr.storage.io.location.Location.with_durable`) every file
and folder of the group is ``fsync``'d before its attributes are renamed into place, and
they after, so a returned :meth:`ZarrLayout.write` survives a machine crash.
``metadata.json`` and the root attributes record ``layout_version`` 2.  Chunking and codecs
follow :mod:`rbzarr.storage.zarr.chunking`.

Stores of layout 1 (regular chunks, no ``rbzarr_layout``, no ``layout_version``) are read
through zarr's public API (:mod:`rbzarr.storage.zarr.arrays`), never written: their
trajectories are re-encoded in layout 2 when copied into a zarr store.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import zarr
from zarr.abc.store import Store

from rbzarr.caller import warn_caller
from rbzarr.errors import CodecConflictError, CorruptStoreError, InvalidCodecError
from rbzarr.storage.io.backends import translate_errors
from rbzarr.storage.io.deadlines import sync
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import is_temporary_name, number_name
from rbzarr.storage.io.object_ranges import object_ranges
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.layout_capabilities import LayoutCapabilities
from rbzarr.storage.rlinf import documents as store_documents
from rbzarr.storage.rlinf.documents import INDEX_FILE, METADATA_FILE, Documents, Entry, Finding
from rbzarr.storage.row_groups import DrawnRows, RowGroups
from rbzarr.storage.zarr import (
    arrays,
    describe,
    packs,
    sharded,
    zarr_codecs,  # noqa: F401  (registers the image codecs)
)
from rbzarr.storage.zarr import rows as zarr_rows
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.chunking import (
    DEFAULT_CHUNK_BYTES,
    KeyPlan,
    plan_key,
)
from rbzarr.storage.zarr.codecs import RAW, Codec, parse_codec, parse_codecs, require_images
from rbzarr.storage.zarr.encode import LOCAL_SEPARATOR, one_buffer, shard_key
from rbzarr.storage.zarr.handles import time_and_envs, trajectory_id
from rbzarr.storage.zarr.image_codecs import Lossless
from rbzarr.storage.zarr.open import (
    FIELDS_ATTR,
    MAX_ARRAY_CHUNKS,
    TRAJECTORIES,
    TrajectoryOpener,
    group_path,
)
from rbzarr.storage.zarr.publish import EMPTY_GROUP, GroupPublisher, GroupWrite
from rbzarr.storage.zarr.remote import DEFAULT_RANGE_GAP
from rbzarr.storage.zarr.shard_cache import DEFAULT_LOCAL_CACHE_BYTES, ShardCache, cache_key
from rbzarr.storage.zarr.sharded import ShardedTrajectory
from rbzarr.storage.zarr.spec import FILL, parse_specs
from rbzarr.storage.zarr.window_table import WindowTable
from rbzarr.trajectory.dtypes import (
    dtype_from_name,
    dtype_name,
    from_numpy,
    storage_dtype,
    to_numpy,
)

if TYPE_CHECKING:
    import torch

    from rbzarr.trajectory.model import Trajectory
    from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = [
    "DEFAULT_HANDLES",
    "FIELDS_ATTR",
    "LAYOUT_VERSION",
    "ROOT_ATTR",
    "TRAJECTORIES",
    "ZarrLayout",
]

log = logging.getLogger(__name__)

LAYOUT_VERSION = 2
# The metadata key recording the store's codec per key (and "default").
CODECS_KEY = "codecs"
# Trajectories the background warmer opens per round.
WARM_BATCH = 32
# Trajectories kept open at least (without an explicit handle_cache_size).
DEFAULT_HANDLES = 256
# Kept open beyond the window: trajectories read while the window moves on.
_HANDLE_SLACK = 16
# How many schemas (field shapes and dtypes) the layout remembers the plans of.
_PLAN_MEMO_SIZE = 64
# The root group's attribute that mirrors the two documents.
ROOT_ATTR = "rbzarr"
# The finding of a root group without that attribute (a writer writes it when it closes).
ROOT_UNWRITTEN = "root_attrs_unwritten"
# A chunk key joined by ".", as layout-2 shards are named (``c.0.0.0``).
_DOTTED_CHUNK = re.compile(r"c(\.\d+)+")


class ZarrLayout(TrajectoryLayout):
    """Trajectories as Zarr v3 groups below ``location``; reads touch only needed bytes.

    Parameters
    ----------
    location
        The store's root.
    codecs
        Codec per flat key (``"rewards"``, ``"curr_obs/image"``) or ``"default"`` (every key
        not named): a spec (``"raw"``, ``"zstd:3"``, ``"lossless"``, ``"jpeg:95"``, ...,
        see :mod:`rbzarr.storage.zarr.codecs`), a zarr codec object, or ``None`` (raw).
        Unlisted keys are stored raw (read in place), except image-like ones (uint8
        ``[T, B, H, W, C]`` or ``[T, B, C, H, W]``): ``"lossless"``.  A store records its
        codecs in its metadata; appending to it uses them, and a different explicit codec
        for a recorded key raises :class:`~rbzarr.errors.CodecConflictError`.  A codec that
        cannot encode its key, or names a key the trajectories lack, is refused before a
        trajectory is accepted (:meth:`check_writable`).
    chunk_bytes
        Target size of one chunk of the arrays zarr writes itself (codecs other than zstd,
        see :mod:`rbzarr.storage.zarr.chunking`).
    store
        A zarr store to use instead of ``location.zarr_store()`` (it must be rooted at
        ``location``); useful to wrap the store, e.g. to count requests.  Shards are read
        from ``location`` directly, through ``byte_source``.
    handle_cache_size
        How many trajectories keep their opened handles (least recently used go).
        ``None`` (default): the sample window's trajectories, at least
        :data:`DEFAULT_HANDLES` (readers say how many, :meth:`sampling`); either way the
        handles hold at most a quarter of the process's descriptor limit and of
        ``vm.max_map_count``.
    byte_source
        Where row reads of shards get their bytes; wrap a
        :class:`~rbzarr.storage.zarr.byte_source.ByteSource` to observe them (the
        benchmark counts requests and bytes so).
    local_cache_dir, local_cache_bytes
        For a remote store: a local directory that keeps whole shards, up to
        ``local_cache_bytes`` bytes (:mod:`rbzarr.storage.zarr.shard_cache`).  Trajectories
        are fetched into it on first use (or ahead, :meth:`warm`), then read from the local
        copies; trajectories this layout writes go into it as well.  Ignored for a local
        store, which is read in place.
    range_gap
        Remote reads without a cache: byte ranges of one object at most this far apart are
        fetched by one request.
    pack_bytes
        On a local store, trajectories of at most this many raw bytes that are queued
        together with the same field shapes and dtypes are written as one pack
        (:mod:`rbzarr.storage.zarr.packs`: one group holding their rows, each trajectory's
        own group naming it), up to :data:`~rbzarr.storage.zarr.packs.MAX_MEMBERS` and
        :data:`~rbzarr.storage.zarr.packs.PACK_LIMIT_BYTES` per pack; a small trajectory
        then costs the filesystem a folder and a file instead of one per array.  ``0``:
        every trajectory in its own group with its own arrays.

    Raises
    ------
    ValueError
        ``chunk_bytes`` or ``local_cache_bytes`` is not positive, ``handle_cache_size``,
        ``range_gap`` or ``pack_bytes`` is negative, or ``local_cache_bytes`` is given
        without ``local_cache_dir``.
    CodecUnavailableError
        An image codec is named and imagecodecs cannot be imported (an ``ImportError``).
    """

    format = "zarr"
    capabilities = LayoutCapabilities(many_writers=True, local_cache=True)

    def __init__(
        self,
        location: Location,
        *,
        codecs: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        store: Store | None = None,
        handle_cache_size: int | None = None,
        byte_source: ByteSource | None = None,
        local_cache_dir: str | os.PathLike[str] | None = None,
        local_cache_bytes: int | None = None,
        range_gap: int = DEFAULT_RANGE_GAP,
        pack_bytes: int = packs.DEFAULT_PACK_BYTES,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        if pack_bytes < 0:
            raise ValueError(f"pack_bytes must be >= 0, got {pack_bytes}")
        if handle_cache_size is not None and handle_cache_size < 0:
            raise ValueError(f"handle_cache_size must be >= 0, got {handle_cache_size}")
        if range_gap < 0:
            raise ValueError(f"range_gap must be >= 0, got {range_gap}")
        super().__init__(location)
        self.codecs = parse_codecs(codecs)
        for key, codec in self.codecs.items():
            if codec.is_image:
                require_images(f"codec {codec.text!r} of {key!r}")
        self._explicit = frozenset(self.codecs)
        # Field shapes and dtypes check_writable found writable.
        self._writable: set[frozenset[Any]] = set()
        # The plans of the field shapes and dtypes written lately (plans depend on nothing else).
        self._plan_memo: dict[tuple[Any, ...], dict[str, KeyPlan]] = {}
        # Concrete codecs by key (and "default"), as the store's metadata records them.
        self._recorded = {key: codec.text for key, codec in self.codecs.items()}
        self._recorded_lock = threading.Lock()
        self._plans_recorded: Mapping[str, KeyPlan] | None = None  # recorded last
        self.chunk_bytes = chunk_bytes
        self.range_gap = range_gap
        self.pack_bytes = pack_bytes
        if byte_source is None:
            protocol = fsspec.core.split_protocol(location.url)[0] or "file"
            byte_source = ByteSource(object_ranges(protocol, location.storage_options))
        self.byte_source = byte_source
        self.shard_cache = _shard_cache(location, local_cache_dir, local_cache_bytes)
        self._handles_follow_window = handle_cache_size is None
        self._opener = TrajectoryOpener(
            location,
            store,
            DEFAULT_HANDLES if handle_cache_size is None else handle_cache_size,
            self.byte_source,
            self.shard_cache,
        )
        self._publisher = GroupPublisher()
        self._warming = _Warmer(self._opener)
        self._table: WindowTable | None = None  # the handles of the window drawn from

    # -- where things are -----------------------------------------------------------------
    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        # docstring inherited
        return describe.trajectory_path(entry)

    def _stored_paths(self) -> dict[str, int]:
        # docstring inherited
        return {f"{TRAJECTORIES}/{tid}": tid for tid in self.list_ids()}

    def written_attributes(self, trajectory_id: int) -> dict[str, Any] | None:
        """The attributes of a trajectory's commit marker (its entry among them), ``None``
        where it has no complete marker."""
        where = f"{self.location.url}/{TRAJECTORIES}/{int(trajectory_id)}/zarr.json"
        try:
            raw = self.location.read_bytes(TRAJECTORIES, str(int(trajectory_id)), "zarr.json")
            attributes = read_json(raw, where).get("attributes")
        except (FileNotFoundError, CorruptStoreError, AttributeError):
            return None
        return attributes if isinstance(attributes, dict) else None

    def list_ids(self) -> list[int]:
        # docstring inherited
        self.location.join(TRAJECTORIES)  # the gate: locally, not a link
        with translate_errors(self.location.url, "listing"):
            names = sync(self._list_names(TRAJECTORIES))
        return sorted(n for n in map(number_name, names) if n is not None)

    async def _list_names(self, prefix: str) -> list[str]:
        return [name async for name in self._opener.store().list_dir(prefix)]

    def _foreign_files(self, path: str) -> list[str]:
        """Files below a trajectory group other than node documents, chunks and shards below
        ``c/``, and temporary files of an interrupted write."""
        return [
            name
            for name in self.location.list_files(*path.split("/"))
            if not _written_by_rbzarr(PurePosixPath(name))
        ]

    # -- format knowledge -----------------------------------------------------------------
    def zarr_group(self, entry: Entry) -> zarr.Group:
        """The read-only Zarr group of one trajectory."""
        return describe.trajectory_group(self.location, entry)

    def data_group(self, entry: Entry) -> tuple[zarr.Group, packs.Membership | None]:
        """The read-only Zarr group holding a trajectory's arrays: its own, or a pack
        member's pack (then also where it is in it: its rows of each array are the
        ``member``-th of ``members`` equal slices along the first axis)."""
        return describe.data_group(self.location, entry)

    def fields(self, entry: Entry) -> dict[str, str]:
        # docstring inherited
        return dict(self._opener.open_many([entry], [])[0].dtypes)  # no shard opened

    def group_arrays(self, group: zarr.Group) -> dict[str, zarr.Array]:
        """Every array below a trajectory group; an array document zarr refuses is
        :class:`CorruptStoreError`."""
        return describe.group_arrays(self.location, group)

    def _missing_parts(self, entry: Entry) -> list[str]:
        """A pack member's parts are its pack's arrays."""
        found = []
        group, _ = self.data_group(entry)
        layout = group.attrs.get(sharded.LAYOUT_ATTR)
        described = layout.get("arrays") if isinstance(layout, dict) else None
        for name, node in self.group_arrays(group).items():
            about = described.get(name) if isinstance(described, dict) else None
            if isinstance(about, dict) and about.get(FILL) is True:
                continue  # no shard stored: its fill values (its copy is read and checked)
            if node.nchunks > MAX_ARRAY_CHUNKS:  # never walk a grid of any size
                found.append(
                    f"array {name!r} declares {node.nchunks} chunks, more than the "
                    f"{MAX_ARRAY_CHUNKS} an array may have"
                )
            elif node.nchunks_initialized != node.nchunks:
                found.append(
                    f"array {name!r} stores {node.nchunks_initialized} of {node.nchunks} chunks"
                )
        return found

    def check_documents(self, documents: Documents) -> list[Finding]:
        """Also checks that the root group's ``rbzarr`` attribute mirrors the documents."""
        try:
            root = read_json(
                self.location.read_bytes("zarr.json"), f"{self.location.url}/zarr.json"
            )
            mirror = root.get("attributes", {}).get(ROOT_ATTR)
        except (FileNotFoundError, ValueError, AttributeError) as exc:
            return [Finding("root_attrs_mismatch", "zarr.json", " ".join(str(exc).split()))]
        if mirror is None:  # a writer writes it when it closes
            return [
                Finding(
                    ROOT_UNWRITTEN,
                    "zarr.json",
                    f"the root group has no {ROOT_ATTR!r} attributes (the copy of "
                    f"{METADATA_FILE} for plain zarr readers) yet",
                )
            ]
        expected = _root_head(documents)
        # A store whose index is a log writes its head at close: a running (or killed)
        # writer's counters are ahead of it, its format is not.
        if mirror == expected or (
            isinstance(mirror, dict)
            and "head" in mirror
            and isinstance(mirror.get("metadata"), dict)
            and mirror["metadata"].get("trajectory_format")
            == expected["metadata"].get("trajectory_format")
        ):
            return []
        return [
            Finding(
                "root_attrs_mismatch",
                "zarr.json",
                f"root attributes {ROOT_ATTR!r} do not match {METADATA_FILE} and {INDEX_FILE}",
            )
        ]

    def describe_keys(
        self, entries: Iterable[Entry], sizes: Mapping[str, int], progress: bool = False
    ) -> tuple[dict[str, dict[str, Any]], int]:
        # docstring inherited
        return describe.describe_keys(self.location, entries, sizes, progress)

    # -- reading --------------------------------------------------------------------------
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        # docstring inherited
        from rbzarr.trajectory.model import trajectory_from_raw  # noqa: PLC0415 (torch)

        names, values = self._read_whole(entry, keys)
        fields = {
            key: from_numpy(value, dtype_from_name(names[key])) for key, value in values.items()
        }
        return trajectory_from_raw(
            fields,
            max_episode_length=int(entry.get("max_episode_length", 0)),
            model_weights_id=str(entry.get("model_weights_id", "")),
        )

    def read_arrays(self, entry: Entry, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Decoded into numpy here (no torch): :meth:`read` converts these at its boundary."""
        return self._read_whole(entry, keys)[1]

    def _read_whole(
        self, entry: Entry, keys: Sequence[str] | None
    ) -> tuple[dict[str, str], dict[str, np.ndarray]]:
        """The dtype name of every field, and the whole arrays of ``keys`` (all: ``None``)
        in their numpy storage dtypes."""
        opened = self._opener.open_many([entry], keys)[0]
        wanted = list(opened.dtypes) if keys is None else list(keys)
        zarr_rows.check_keys(opened, wanted, self.location.url)
        zarr_arrays = zarr_rows.zarr_arrays(opened, wanted)
        where = f"{self.location.url}/{opened.group}"
        with translate_errors(self.location.url, "reading"):
            whole = arrays.gather(
                *(arrays.read_whole(a, f"{where}/{key}") for key, a in zarr_arrays.items())
            )
            values = dict(zip(zarr_arrays, sync(whole), strict=True))
            described = [key for key in wanted if key not in zarr_arrays]
            values.update(sharded.read_whole_shards(self._opener.location(), opened, described))
        return opened.dtypes, {
            key: np.asarray(values[key]).astype(storage_dtype(opened.dtypes[key]), copy=False)
            for key in wanted
        }

    def read_rows(
        self, entry: Entry, rows: np.ndarray, keys: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Gathered into numpy here (no torch)."""
        (handles,) = self._opener.open_many([entry])
        zarr_rows.check_keys(handles, keys, self.location.url, sampled=True)
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = {
            key: np.empty(
                (len(flat), *handles.shape(key)[2:]), dtype=storage_dtype(handles.dtypes[key])
            )
            for key in keys
        }
        groups = RowGroups.of([(entry, flat, np.arange(len(flat)))])
        self._read_groups(groups, keys, out, {key: handles.dtypes[key] for key in keys})
        return out

    def read_drawn_into(
        self, drawn: DrawnRows, keys: Sequence[str], out: Mapping[str, torch.Tensor]
    ) -> bool:
        """Read from the window's table when it holds every slot drawn (filled by earlier
        batches' grouped reads) and all their keys sit in the same region bays."""
        table = self._table  # held through the read: its handles keep their bays mapped
        if self.shard_cache is not None or table is None:
            return False
        if not table.serves(drawn.window, tuple(keys), self._opener.handles.version()):
            return False
        numbers = table.numbers(drawn.slots)
        if numbers is None:
            return False
        views = {key: to_numpy(out[key]) for key in keys}
        with translate_errors(self.location.url, "reading"):
            return zarr_rows.read_drawn_into(
                table.regions(int(drawn.slots[0])), numbers, drawn.rows, views, self.byte_source
            )

    def read_groups_into(
        self, groups: RowGroups, keys: Sequence[str], out: Mapping[str, torch.Tensor]
    ) -> None:
        # docstring inherited
        views = {key: to_numpy(out[key]) for key in keys}
        self._read_groups(groups, keys, views, {key: dtype_name(out[key].dtype) for key in keys})

    def _read_groups(
        self,
        groups: RowGroups,
        keys: Sequence[str],
        out: Mapping[str, np.ndarray],
        out_dtypes: Mapping[str, str],
    ) -> None:
        """Rows of ``groups`` into the numpy arrays ``out`` (their dtypes named by
        ``out_dtypes``); by window position where the groups name their window."""
        table = self._window_table(groups, tuple(keys))
        found = None if table is None else table.take(groups.slots)  # type: ignore[arg-type]
        with translate_errors(self.location.url, "reading"):
            opened: Sequence[ShardedTrajectory]
            if found is None:
                opened = self._opener.open_many(groups.entries)
                planned = zarr_rows.row_plans(opened, keys, out, out_dtypes, self.location.url)
                if table is not None:
                    table.fill(groups.slots, opened, planned)  # type: ignore[arg-type]
            else:
                opened, planned = found
            zarr_rows.read_rows_into(
                self._opener.location(),
                opened,
                groups,
                keys,
                out,
                out_dtypes,
                self.byte_source,
                self.range_gap,
                planned,
            )
        if self.shard_cache is not None:
            self.shard_cache.used(
                key for key in (cache_key(entry) for entry in groups.entries) if key is not None
            )

    def _window_table(self, groups: RowGroups, keys: tuple[str, ...]) -> WindowTable | None:
        """The table of the window ``groups`` were drawn from (a new one when the window,
        the keys or the cached handles changed); ``None`` when the groups name no window or
        the handle cache cannot hold it (a table keeps its handles open)."""
        window = groups.window
        if window is None or groups.slots is None or len(window) > self._opener.handles.size:
            return None
        version = self._opener.handles.version()
        table = self._table
        if table is None or not table.serves(window, keys, version):
            table = self._table = WindowTable(window, keys, version, 4 + 2 * len(keys))
        return table

    def sample_window(self, count: int, committed: Sequence[Entry] | None = None) -> None:
        """Without an explicit ``handle_cache_size``: keep the handles of ``count``
        trajectories (a window of more would reopen those it draws on every batch).  With a
        local cache: those of ``committed`` not cached are fetched into it on a background
        thread, and they are evicted last."""
        if self._handles_follow_window:
            self._opener.handles.keep_at_least(count + _HANDLE_SLACK)
        if self.shard_cache is None or committed is None:
            return
        keys = [cache_key(entry) for entry in committed]
        self.shard_cache.retain(key for key in keys if key is not None)
        self._warming.submit(committed)

    # -- writing --------------------------------------------------------------------------
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Each array is one shard (arrays of kind ``"zarr"`` go through zarr); the group's
        attributes are written last."""
        from rbzarr.trajectory.validated import (  # noqa: PLC0415
            arrays_of,
            staging_of,
            tensors_to_write,
        )

        staging = staging_of(trajectory)
        copies = arrays_of(trajectory)
        fields = tensors_to_write(trajectory)
        tid = trajectory_id(entry)
        plans = self._plans(fields)
        self._record_codecs(plans)
        # Local files: one file per shard (no folder per dimension), read in place (no
        # copies in the group's document).
        local = self._opener.local_files
        files, description, documents = sharded.encode_trajectory(
            fields,
            plans,
            *time_and_envs(entry),
            LOCAL_SEPARATOR if local else "/",
            not local,
            staging,
            copies,
        )
        attrs = {
            **dict(entry),
            FIELDS_ATTR: {key: dtype_name(value.dtype) for key, value in fields.items()},
            sharded.LAYOUT_ATTR: description,
        }
        compressors = {
            key: plan.codec.zarr_compressor() for key, plan in plans.items() if plan.by_zarr
        }
        zarr_keys = list(compressors)
        write = GroupWrite(group_path(tid), fields, attrs, files, documents)
        self._opener.handles.forget(tid)
        with translate_errors(self.location.url, "writing"):
            if not zarr_keys and self._opener.local_files:
                self._publisher.publish_files(self.location.path, write, self.location.durable)
            else:
                publish = self._publisher.publish(
                    self._opener.store(),
                    write,
                    compressors,
                    self.chunk_bytes,
                    self._durable_folder(write.group),
                )
                sync(publish, nbytes=sum(v.numel() * v.element_size() for v in fields.values()))
        self._opener.handles.forget(tid)
        if self.shard_cache is not None and not zarr_keys:
            self._write_through(entry, attrs, files, description)

    def write_many(self, items: Sequence[tuple[Entry, Trajectory | ValidatedTrajectory]]) -> int:
        """Packs the longest run of small trajectories of one schema at the head of
        ``items`` (``pack_bytes``), else writes the first alone."""
        count = self._pack_count(items)
        if count < 2:
            self.write(*items[0])
            return 1
        return self._write_pack(items[:count])

    def _pack_count(self, items: Sequence[tuple[Entry, Trajectory | ValidatedTrajectory]]) -> int:
        """How many trajectories at the head of ``items`` go in one pack (1: none)."""
        from rbzarr.trajectory.validated import tensors_to_write  # noqa: PLC0415

        if (
            len(items) < 2
            or self.pack_bytes == 0
            or not self._opener.local_files
            or self.shard_cache is not None
        ):
            return 1
        first = tensors_to_write(items[0][1])
        schema = [(key, value.shape, value.dtype) for key, value in first.items()]
        size = sum(value.numel() * value.element_size() for value in first.values())
        if size > self.pack_bytes or any(value.dim() == 0 for value in first.values()):
            return 1
        count = 1
        for _, trajectory in items[1 : packs.MAX_MEMBERS]:
            fields = tensors_to_write(trajectory)
            same = [(key, value.shape, value.dtype) for key, value in fields.items()] == schema
            if not same or (count + 1) * size > packs.PACK_LIMIT_BYTES:
                break
            count += 1
        return count

    def _write_pack(self, items: Sequence[tuple[Entry, Trajectory | ValidatedTrajectory]]) -> int:
        """Write ``items`` as one pack; 1 (the first written alone) where the pack's arrays
        would not all be described (a codec zarr writes)."""
        import torch  # noqa: PLC0415 (writing: the trajectories' tensors)

        from rbzarr.trajectory.validated import tensors_to_write  # noqa: PLC0415

        entries = [entry for entry, _ in items]
        parts = [tensors_to_write(trajectory) for _, trajectory in items]
        T, B = time_and_envs(entries[0])
        fields = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        plans = self._plans(fields)
        if any(plan.by_zarr for plan in plans.values()):
            self.write(*items[0])
            return 1
        self._record_codecs(plans)
        count = len(items)
        files, description, documents = sharded.encode_trajectory(
            fields, plans, count * T, B, LOCAL_SEPARATOR, False
        )
        dtypes = {key: dtype_name(value.dtype) for key, value in fields.items()}
        ids = [trajectory_id(entry) for entry in entries]
        group = packs.pack_group(ids[0], str(entries[0].get("uuid", "")))
        attrs = {
            packs.PACK_ATTR: {
                "members": [
                    [tid, str(entry.get("uuid", ""))]
                    for tid, entry in zip(ids, entries, strict=True)
                ]
            },
            "shape": [count * T, B],
            FIELDS_ATTR: dtypes,
            sharded.LAYOUT_ATTR: description,
        }
        members = [
            (
                group_path(tid),
                {
                    **dict(entry),
                    FIELDS_ATTR: dtypes,
                    sharded.LAYOUT_ATTR: packs.member_layout(group, member, count),
                },
            )
            for member, (tid, entry) in enumerate(zip(ids, entries, strict=True))
        ]
        for tid in ids:
            self._opener.handles.forget(tid)
        with translate_errors(self.location.url, "writing"):
            self._publisher.publish_pack(
                self.location.path,
                GroupWrite(group, fields, attrs, files, documents),
                members,
                self.location.durable,
            )
        for tid in ids:
            self._opener.handles.forget(tid)
        return count

    def check_writable(self, trajectory: Trajectory | ValidatedTrajectory) -> None:
        # docstring inherited
        from rbzarr.trajectory.validated import tensors_of  # noqa: PLC0415

        fields = tensors_of(trajectory)
        # What a plan depends on: a schema checked once passes at once after.
        shapes = frozenset((k, v.shape[1:], v.shape[0] == 0, v.dtype) for k, v in fields.items())
        if shapes in self._writable:
            return
        unknown = sorted(key for key in self._explicit if key != "default" and key not in fields)
        if unknown:
            raise InvalidCodecError(
                f"codecs name {unknown}, which the trajectories do not have (their keys: "
                f"{sorted(fields)}); correct the key, or use 'default' for every key"
            )
        self._plans(fields)
        self._writable.add(shapes)

    def _plans(self, fields: Mapping[str, torch.Tensor]) -> dict[str, KeyPlan]:
        """The plan of every field (its codec chosen and checked against its shape and
        dtype), remembered for the shapes and dtypes of the latest schemas."""
        shapes = tuple((key, tuple(value.shape), value.dtype) for key, value in fields.items())
        plans = self._plan_memo.get(shapes)
        if plans is None:
            # A copy: the writer thread records codecs into ``self.codecs`` meanwhile, and
            # the shared plans' key iterates them.
            plans = _shared_plans(shapes, fields, dict(self.codecs))
            if len(self._plan_memo) >= _PLAN_MEMO_SIZE:  # trajectories of many lengths
                self._plan_memo.clear()
            self._plan_memo[shapes] = plans
        return plans

    def _durable_folder(self, group: str) -> str | None:
        """The local folder of ``group`` when writes must be durable and zarr's store is
        local (it never syncs), else ``None``; object stores' PUTs are durable."""
        if not (self.location.durable and self.location.is_local):
            return None
        return os.path.join(self.location.path, *group.split("/"))

    def _write_through(
        self,
        entry: Entry,
        attrs: Mapping[str, Any],
        files: Mapping[str, list[Any]],
        description: Mapping[str, Any],
    ) -> None:
        """Keep a written trajectory in the local cache, so its reads make no request."""
        cache = self.shard_cache
        key = cache_key(entry)
        if cache is None or key is None:
            return
        where = f"{self.location.url}/{group_path(key[0])}"
        document = {"zarr_format": 3, "node_type": "group", "attributes": dict(attrs)}
        cache.put_group_document(key, json.dumps(document).encode())
        for array_key, spec in parse_specs(description, where).items():
            assert spec is not None  # a trajectory without zarr-kind arrays
            if spec.fill:  # not stored: its copy is in the group's document
                continue
            parts = files[f"{array_key}/{shard_key(len(spec.shape), spec.separator)}"]
            data = one_buffer(parts)
            if cache.put_shard(key, array_key, spec, data, f"{where}/{array_key}") is not None:
                cache.stats.written_through += 1

    def _record_codecs(self, plans: Mapping[str, KeyPlan]) -> None:
        """Remember the codec each key was written with (the store's metadata records it)."""
        if plans is self._plans_recorded:  # the plans of the schema written before
            return
        with self._recorded_lock:
            for key, plan in plans.items():
                if plan.by_zarr and key not in self._explicit:
                    continue
                if self._recorded.get(key, "lossless") == "lossless":
                    self._recorded[key] = plan.codec.text
                self.codecs.setdefault(key, plan.codec)
            self._plans_recorded = plans

    def adopt_store_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Take on the codecs the store records; a store written before codecs were
        recorded keeps its unlisted keys raw (as it was written).

        Raises
        ------
        CodecConflictError
            This layout was given another codec for a key the store records.
        CodecUnavailableError
            The store records an image codec and imagecodecs cannot be imported.
        """
        recorded = metadata.get(CODECS_KEY)
        if recorded is None:
            self.codecs.setdefault("default", RAW)
            return
        if not isinstance(recorded, dict):
            raise CorruptStoreError(f"{self.location.url}: metadata {CODECS_KEY!r} is not a map")
        with self._recorded_lock:
            for key, text in recorded.items():
                mine = self.codecs.get(key) if key in self._explicit else None
                if mine is not None and not _same_codec(mine, str(text)):
                    raise CodecConflictError(
                        f"{self.location.url}: key {key!r} is stored with codec {text!r}, this "
                        f"writer was given {mine.text!r}; drop the choice to use the store's "
                        "codec, or write elsewhere (`rbzarr recode` re-encodes a store)"
                    )
                if mine is None:
                    try:
                        self.codecs[key] = parse_codec(str(text))
                    except ValueError as exc:
                        raise CodecConflictError(
                            f"{self.location.url}: key {key!r} is stored with codec {text!r}; "
                            "pass that codec object in codecs= to append to this store"
                        ) from exc
                    if self.codecs[key].is_image:  # appending needs it: say so now
                        require_images(f"codec {str(text)!r} of {key!r} (the store's)")
                self._recorded[key] = str(text)
            self._plans_recorded = None

    def format_metadata(self) -> dict[str, Any]:
        """``layout_version`` and the codecs of the keys written (``codecs``)."""
        with self._recorded_lock:
            codecs = dict(self._recorded)
        found: dict[str, Any] = {"layout_version": LAYOUT_VERSION}
        if codecs:
            found[CODECS_KEY] = codecs
        return found

    def write_documents(self, documents: Documents) -> Documents:
        """Adds ``layout_version`` to the metadata and writes the store's head (the
        metadata and the counters, not the index) in the root group's attributes first."""
        metadata = {**documents.metadata, **self.format_metadata()}
        documents = Documents(metadata, documents.trajectory_index)
        self._update_root({ROOT_ATTR: _root_head(documents)})
        store_documents.write_documents(self.location, documents)
        return documents

    def _update_root(self, attrs: dict[str, Any]) -> None:
        """Merge ``attrs`` into the root group's attributes: one read and one atomic write of
        its ``zarr.json`` (created when missing), not a round through zarr's event loop.  A
        root this cannot rewrite (not a Zarr v3 group's document, or past the JSON bound) is
        left as it is, with a warning: the documents are written next all the same."""
        where = f"{self.location.url}/zarr.json"
        try:
            raw = self.location.read_bytes("zarr.json")
        except FileNotFoundError:
            raw = EMPTY_GROUP
        try:
            document = read_json(raw, where, allow_nan=True)
            if (
                not isinstance(document, dict)
                or document.get("zarr_format") != 3
                or document.get("node_type") != "group"
                or not isinstance(document.get("attributes", {}), dict)
            ):
                raise CorruptStoreError(f"{where} is not a Zarr v3 group's document")
        except CorruptStoreError as exc:
            warn_caller(
                f"{exc}: the root's {ROOT_ATTR!r} attributes (the copy of {METADATA_FILE} "
                f"for plain zarr readers) are not written and the file is left as it is; "
                f"{METADATA_FILE} and {INDEX_FILE} are written next (`rbzarr verify` names "
                f"the root)",
                UserWarning,
            )
            return
        document["attributes"] = {**document.get("attributes", {}), **attrs}
        # One line: json's C encoder (``indent`` takes the pure-Python one).
        self.location.write_bytes(json.dumps(document).encode(), "zarr.json")

    def delete(self, entry: Entry) -> None:
        """A pack member's pack goes with the last of its members: before the member's own
        group, so a delete that failed between the two finds the member again on its retry."""
        tid = trajectory_id(entry)
        place = self._membership(tid)
        self._opener.handles.forget(tid)
        if place is not None and self._last_member(place.group, tid):
            self.location.delete(*place.group.split("/"))
        # The group's folder at once (one recursive delete, a bulk delete on S3), not key by
        # key through zarr's event loop.
        self.location.delete(*group_path(tid).split("/"))
        self._opener.handles.forget(tid)

    def stored_bytes(self, entry: Entry) -> int:
        """A pack member's share of its pack's files counts too."""
        found = super().stored_bytes(entry)
        place = self._membership(trajectory_id(entry))
        if place is not None:
            found += self.location.tree_bytes(*place.group.split("/")) // place.members
        return found

    def _membership(self, tid: int) -> packs.Membership | None:
        """The pack trajectory ``tid``'s group names, if it names one (and reads)."""
        attributes = self.written_attributes(tid)
        if attributes is None:
            return None
        try:
            return packs.membership(attributes.get(sharded.LAYOUT_ATTR), group_path(tid))
        except CorruptStoreError:
            return None

    def _unneeded_groups(self, entries: Mapping[int, Entry]) -> list[str]:
        """The packs that list none of ``entries`` (same id and uuid) among their members; a
        pack without a readable marker is an unfinished write's."""
        found = []
        for name in self.location.list_names(packs.PACKS):
            if name == "zarr.json":
                continue
            group = f"{packs.PACKS}/{name}"
            self.location.join(*group.split("/"))  # the gate: a plain name, no link
            where = f"{self.location.url}/{group}/zarr.json"
            try:
                raw = self.location.read_bytes(packs.PACKS, name, "zarr.json")
                members = packs.pack_members(read_json(raw, where).get("attributes", {}), where)
            except (FileNotFoundError, NotADirectoryError, CorruptStoreError, AttributeError):
                members = []
            listed = [
                tid
                for tid, uuid in members
                if tid in entries and str(entries[tid].get("uuid", "")) == uuid
            ]
            if not listed:
                found.append(group)
        return found

    def _last_member(self, group: str, tid: int) -> bool:
        """Whether trajectory ``tid`` is the only member of pack ``group`` whose group is left
        (a pack gone already, or that does not read, is not deleted here: ``verify``)."""
        where = f"{self.location.url}/{group}/zarr.json"
        try:
            attributes = read_json(self.location.read_bytes(*group.split("/"), "zarr.json"), where)
            members = packs.pack_members(attributes.get("attributes", {}), where)
        except (FileNotFoundError, CorruptStoreError, AttributeError):
            return False
        others = [other for other, _ in members if other != tid]
        return not any(self.location.exists(*group_path(other).split("/")) for other in others)

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """A layout-1 trajectory copied into a zarr layout is re-encoded in layout 2, a pack
        member is written again (its rows alone)."""
        if isinstance(target, ZarrLayout):
            opened = self._opener.open_many([entry])[0]
            if not opened.described or opened.members > 1:
                target.write(entry, self.read(entry))
                return
        super().copy_to(target, entry)


# Plans by schema and codecs, shared by every layout of the process: a new buffer's first
# write plans nothing (a few hundred microseconds of a small store), and the arrays' forms
# memoized by plan (``encode``) are found again.
_plans_by_schema: dict[tuple[Any, ...], dict[str, KeyPlan]] = {}


def _shared_plans(
    shapes: tuple[Any, ...], fields: Mapping[str, torch.Tensor], codecs: Mapping[str, Codec]
) -> dict[str, KeyPlan]:
    """The plans of ``fields`` (laid out as ``shapes``) under ``codecs``, made once per
    process; a codec object that cannot be hashed (one given to zarr) plans them anew."""
    try:
        key = (shapes, frozenset(codecs.items()))
        plans = _plans_by_schema.get(key)
    except TypeError:
        return _planned(fields, codecs)
    if plans is None:
        plans = _planned(fields, codecs)
        if len(_plans_by_schema) >= _PLAN_MEMO_SIZE:
            _plans_by_schema.clear()
        _plans_by_schema[key] = plans
    return plans


def _planned(fields: Mapping[str, torch.Tensor], codecs: Mapping[str, Codec]) -> dict[str, KeyPlan]:
    """The plan of every field (:func:`~rbzarr.storage.zarr.chunking.plan_key`)."""
    return {
        key: plan_key(value.shape, to_numpy(value.reshape(-1)[:0]).dtype, codecs, key)
        for key, value in fields.items()
    }


def _same_codec(mine: Codec, recorded: str) -> bool:
    """Whether a writer's codec agrees with the one recorded (``"lossless"`` agrees with
    any lossless image codec)."""
    if mine.text == recorded:
        return True
    try:
        theirs = parse_codec(recorded)
    except ValueError:
        return False
    return isinstance(mine, Lossless) and theirs.is_image and not theirs.lossy


def _root_head(documents: Documents) -> dict[str, Any]:
    """The root group's ``rbzarr`` attribute: the metadata and the index's size, no entries."""
    ids = documents.trajectory_index.get("trajectory_id_list", [])
    return {
        "metadata": documents.metadata,
        "head": {"size": len(ids) if isinstance(ids, list) else 0, "index": "log"},
    }


def _shard_cache(
    location: Location,
    directory: str | os.PathLike[str] | None,
    capacity: int | None,
) -> ShardCache | None:
    """The shard cache of a remote ``location``, or ``None``."""
    if directory is None:
        if capacity is not None:
            raise ValueError("local_cache_bytes needs local_cache_dir")
        return None
    if capacity is None:
        capacity = DEFAULT_LOCAL_CACHE_BYTES
    if capacity <= 0:
        raise ValueError(f"local_cache_bytes must be > 0, got {capacity}")
    if location.is_local:
        return None
    endpoint = location.storage_options.get("endpoint_url") or (
        location.storage_options.get("client_kwargs") or {}
    ).get("endpoint_url")
    return ShardCache(directory, capacity, location.url, endpoint)


class _Warmer:
    """Opens (and so fetches into the shard cache) the window's trajectories on a background
    thread; a failure is left for the reads that need them to raise."""

    def __init__(self, opener: TrajectoryOpener) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._wanted: list[Entry] = []
        self._thread: threading.Thread | None = None

    def submit(self, entries: Sequence[Entry]) -> None:
        """Fetch ``entries`` that are not cached, replacing an earlier request not yet done."""
        with self._lock:
            self._wanted = list(entries)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="rbzarr-warm")
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                batch, self._wanted = self._wanted[:WARM_BATCH], self._wanted[WARM_BATCH:]
                if not batch:
                    self._thread = None
                    return
            try:
                self._opener.open_many(batch)
            except Exception as exc:
                log.info("warming the local cache failed: %s", exc)


def _written_by_rbzarr(name: PurePosixPath) -> bool:
    """Whether a file below a trajectory group is one rbzarr writes (see ``_foreign_files``)."""
    return (
        name.name == "zarr.json"
        or "c" in name.parts[:-1]
        or _DOTTED_CHUNK.fullmatch(name.name) is not None
        or is_temporary_name(name.name)
    )
