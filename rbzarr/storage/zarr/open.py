"""Opening committed trajectories of the zarr layout, in one round.

:class:`TrajectoryOpener` owns the layout's zarr store and its handle cache.  A batch of
trajectories opens with one concurrent fetch of their group documents, then (layout 2) one
round for the shard indexes of all of them; cached handles are reused.  A local store's
group documents are read in the calling thread, as its shard indexes are, and a layout-2
group (rbzarr reads its shards itself) needs no zarr chunk check: opening local trajectories
makes no round through zarr's event loop and its reading threads, which cost more than the
reads themselves, most of all on a busy host.  A layout-1 group (no ``rbzarr_layout``)
opens as zarr arrays only (:mod:`rbzarr.storage.zarr.arrays`).
After a ``fork`` the child opens its own store client and handles (remote clients do not
survive a fork).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zarr.abc.store import Store, SupportsGetSync
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import StorePath

from rbzarr.errors import CorruptStoreError, RbzarrError
from rbzarr.storage.io.backends import translate_errors
from rbzarr.storage.io.deadlines import sync
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.zarr import packs, sharded
from rbzarr.storage.zarr.arrays import gather
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.describe import CONSOLIDATED, FIELDS_ATTR, TRAJECTORIES
from rbzarr.storage.zarr.handles import (
    HandleCache,
    check_array_shapes,
    time_and_envs,
    trajectory_id,
)
from rbzarr.storage.zarr.remote import checked_bytes
from rbzarr.storage.zarr.shard_cache import ShardCache, cache_key
from rbzarr.storage.zarr.sharded import ShardedTrajectory
from rbzarr.storage.zarr.spec import MAX_CHUNK_BYTES, NUMERIC_KINDS
from rbzarr.trajectory.dtypes import storage_dtype

__all__ = ["FIELDS_ATTR", "TRAJECTORIES", "TrajectoryOpener", "group_path"]

# Shards fetched whole into the shard cache are fetched this many bytes at a time (a round is
# written to the cache, by CACHE_WRITERS threads, while the next one downloads).
FETCH_ROUND_BYTES = 64 << 20
CACHE_WRITERS = 2
# The most chunks an array that zarr reads (layout 1, other codecs) may have.
MAX_ARRAY_CHUNKS = 1 << 20


def group_path(tid: int) -> str:
    """The path of a trajectory's group below the root."""
    return f"{TRAJECTORIES}/{tid}"


class TrajectoryOpener:
    """Opens trajectories below ``location`` and caches their handles.

    Parameters
    ----------
    location
        The store's root.
    store
        A zarr store rooted there, or ``None`` to open ``location.zarr_store()``.
    cache_size
        How many trajectories keep their handles.
    source
        Where shard indexes of remote trajectories are read from.
    shard_cache
        A local copy of a remote store's shards: trajectories open from it, and those not
        in it are fetched whole into it (``None``: read the store directly).
    """

    def __init__(
        self,
        location: Location,
        store: Store | None,
        cache_size: int,
        source: ByteSource,
        shard_cache: ShardCache | None = None,
    ) -> None:
        self._location = location
        self._zarr_store = store
        self._own_store = store is None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.handles = HandleCache(cache_size, fork_safe=location.is_local)
        self.source = source
        self.shard_cache = None if location.is_local else shard_cache
        self._opening: dict[tuple[int, str], threading.Event] = {}

    @property
    def local_files(self) -> bool:
        """Whether the store is this opener's own local store."""
        return self._own_store and self._location.is_local

    def store(self) -> Store:
        """The zarr store, opened on first use."""
        with self._lock:
            if self._own_store and self._pid != os.getpid():
                self._zarr_store = None
                self._location = Location.from_url(
                    self._location.url,
                    self._location.storage_options,
                    follow_links=self._location.follow_links,
                )
                self._pid = os.getpid()
            if self._zarr_store is None:
                self._zarr_store = self._location.zarr_store()
            return self._zarr_store

    def location(self) -> Location:
        """The store's location."""
        self.store()
        return self._location

    def open_many(
        self, entries: Sequence[Entry], keys: Sequence[str] | None = None
    ) -> list[ShardedTrajectory]:
        """Handles of ``entries`` (cached ones reused); new ones open in one round.

        A trajectory another thread is opening meanwhile (the background warmer) is waited
        for, not fetched twice.  With ``keys``, a trajectory not cached opens only those
        keys' arrays (no other shard index is read) and is not cached.
        """
        if keys is not None:
            return self._open_keys(entries, keys)
        found, generation = self.handles.get_many([_handle_key(entry) for entry in entries])
        if all([opened is not None for opened in found]):  # all cached: a batch's usual case
            return found  # type: ignore[return-value]
        missing = [
            (position, entry, generation)
            for position, (entry, opened) in enumerate(zip(entries, found, strict=True))
            if opened is None
        ]
        mine, theirs = self._claim(missing)
        try:
            if mine:
                with translate_errors(self._location.url, "reading"):
                    new = self._open_new([entry for _, entry, _ in mine])
                for (position, entry, generation), opened in zip(mine, new, strict=True):
                    self.handles.put(_handle_key(entry), opened, generation)
                    found[position] = opened
        finally:
            self._release(mine)
        for (position, entry, _), event in theirs:
            event.wait()
            found[position] = self.open_many([entry])[0]
        return [opened for opened in found if opened is not None]

    def _open_keys(self, entries: Sequence[Entry], keys: Sequence[str]) -> list[ShardedTrajectory]:
        """:meth:`open_many` of only ``keys``: cached handles, else partial ones, uncached."""
        found, _ = self.handles.get_many([_handle_key(entry) for entry in entries])
        missing = [entry for entry, opened in zip(entries, found, strict=True) if opened is None]
        if not missing:
            return [opened for opened in found if opened is not None]
        with translate_errors(self._location.url, "reading"):
            new = iter(self._open_new(missing, set(keys)))
        return [next(new) if opened is None else opened for opened in found]

    def _claim(
        self, missing: list[tuple[int, Entry, int]]
    ) -> tuple[list[tuple[int, Entry, int]], list[tuple[tuple[int, Entry, int], threading.Event]]]:
        """Split ``missing`` into what this thread opens and what another thread is opening."""
        mine, theirs = [], []
        with self._lock:
            for item in missing:
                key = _handle_key(item[1])
                event = self._opening.get(key)
                if event is None:
                    self._opening[key] = threading.Event()
                    mine.append(item)
                else:
                    theirs.append((item, event))
        return mine, theirs

    def _release(self, mine: list[tuple[int, Entry, int]]) -> None:
        with self._lock:
            for _, entry, _ in mine:
                self._opening.pop(_handle_key(entry)).set()

    def _open_new(
        self, entries: Sequence[Entry], keys: set[str] | None = None
    ) -> list[ShardedTrajectory]:
        """Open ``entries``: every key, or only ``keys``."""
        store = self.store()
        location = self.location()
        tids = [trajectory_id(entry) for entry in entries]
        raws = self._group_documents(store, entries)
        opened: list[ShardedTrajectory | None] = []
        pending: list[Any] = []
        in_packs: list[tuple[int, int, Entry, dict[str, str], packs.Membership, str]] = []
        for tid, entry, raw in zip(tids, entries, raws, strict=True):
            attrs, members = _group_attrs(tid, raw, location.url)
            _check_claim(entry, attrs, f"{location.url}/{group_path(tid)}")
            try:
                fields = {key: name for key, name in attrs[FIELDS_ATTR].items()}
                for name in fields.values():
                    storage_dtype(name)  # one rbzarr stores, else ValueError
                layout = attrs.get(sharded.LAYOUT_ATTR)
                place = packs.membership(layout, f"{location.url}/{group_path(tid)}")
                if place is not None:  # opened with its pack, below
                    # the member's own uuid: the one its pack lists (the log's is only kept)
                    own = str(attrs.get("uuid", ""))
                    in_packs.append((len(opened), tid, entry, fields, place, own))
                    opened.append(None)
                    continue
                if layout is None:
                    arrays = self._open_arrays(
                        tid, [key for key in fields if keys is None or key in keys]
                    )
                    where = f"{location.url}/{group_path(tid)}"
                    check_array_shapes(arrays, entry, where)
                    _check_every_chunk(arrays, where)
                    T, B = time_and_envs(entry)
                    specs = dict.fromkeys(fields, None)
                    opened.append(
                        ShardedTrajectory(
                            group_path(tid), T, B, fields, specs, arrays=arrays, described=False
                        )
                    )
                    continue
                handles, remote = sharded.describe_sharded(
                    location, group_path(tid), time_and_envs(entry), fields, layout, members, keys
                )
            except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                raise _unreadable(exc, tid, location.url) from exc
            zarr_keys = [
                key
                for key, spec in handles.specs.items()
                if spec is None and (keys is None or key in keys)
            ]
            zarr_arrays = self._open_arrays(tid, zarr_keys)
            _check_every_chunk(zarr_arrays, f"{location.url}/{group_path(tid)}")
            handles.arrays.update(zarr_arrays)
            pending.extend((handles, request, cache_key(entry)) for request in remote)
            if self.shard_cache is not None:
                self._cache_inline(handles, cache_key(entry))
            opened.append(handles)
        if in_packs:
            self._open_members(store, location, in_packs, opened, pending, keys)
        if pending and self.shard_cache is not None:
            pending = self._open_cached(location, pending)
        if pending:
            sharded.open_pending(location.fs, [(h, r) for h, r, _ in pending], self.source)
        return [handles for handles in opened if handles is not None]

    def _open_members(
        self,
        store: Store,
        location: Location,
        in_packs: Sequence[tuple[int, int, Entry, dict[str, str], packs.Membership, str]],
        opened: list[ShardedTrajectory | None],
        pending: list[Any],
        keys: set[str] | None,
    ) -> None:
        """Open the packs of the members ``in_packs`` (each once, their documents in one
        round) and place each member's view of its pack at its position in ``opened``; the
        packs' remote shards join ``pending`` (read from the store: a pack is not kept in
        the shard cache).  A pack must list each member, with the uuid its group records,
        where the group says."""
        groups = sorted({place.group for *_, place, _ in in_packs})
        raws = self._documents(store, [f"{group}/zarr.json" for group in groups])
        found: dict[str, tuple[ShardedTrajectory, list[tuple[int, str]]]] = {}
        for group, raw in zip(groups, raws, strict=True):
            where = f"{location.url}/{group}"
            if raw is None:
                raise CorruptStoreError(
                    f"{where}: the pack holding listed trajectories is missing; run `rbzarr "
                    f"verify --repair --drop-damaged {location.url}` to drop them from the index"
                )
            try:
                document = read_json(raw, f"{where}/zarr.json")
                attrs = document["attributes"]
                members = (document.get(CONSOLIDATED) or {}).get("metadata")
                listed = packs.pack_members(attrs, where)
                rows, envs = (int(n) for n in attrs["shape"][:2])
                if not isinstance(attrs[FIELDS_ATTR], dict):
                    raise TypeError(f"{FIELDS_ATTR!r} is not a mapping")
                handles, remote = sharded.describe_sharded(
                    location,
                    group,
                    (rows, envs),
                    attrs[FIELDS_ATTR],
                    attrs[sharded.LAYOUT_ATTR],
                    members,
                    keys,
                )
            except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                if isinstance(exc, RbzarrError):
                    raise
                raise CorruptStoreError(
                    f"{where}: the pack's attributes do not read: {exc}"
                ) from exc
            if any(spec is None for spec in handles.specs.values()):
                raise CorruptStoreError(f"{where}: a pack's arrays are all described")
            pending.extend((handles, request, None) for request in remote)
            found[group] = handles, listed
        for position, tid, entry, fields, place, uuid in in_packs:
            handles, listed = found[place.group]
            where = f"{location.url}/{place.group}"
            packs.check_member(listed, place, tid, uuid, where)
            T, B = time_and_envs(entry)
            same = list(fields.items()) == list(handles.dtypes.items())
            if not same or (T * place.members, B) != (handles.T, handles.B):
                raise CorruptStoreError(
                    f"{where}: holds {place.members} x [{handles.T // place.members}, "
                    f"{handles.B}] rows of {handles.dtypes}; trajectory {tid} is "
                    f"[{T}, {B}] of {fields}"
                )
            opened[position] = handles.member_view(place.member, place.members, T)

    def _documents(self, store: Store, paths: Sequence[str]) -> list[bytes | None]:
        """The documents at ``paths`` below the root (``None`` where missing), in one round."""
        prototype = default_buffer_prototype()
        location = self.location()
        for path in paths:
            location.join(*path.split("/"))  # the gate: plain names, no link inside
        if self.local_files and isinstance(store, SupportsGetSync):  # see the module
            fetched = [store.get_sync(path, prototype=prototype) for path in paths]
        else:
            fetched = sync(gather(*(store.get(path, prototype) for path in paths)))
        return [None if raw is None else raw.to_bytes() for raw in fetched]

    def _group_documents(self, store: Store, entries: Sequence[Entry]) -> list[Any]:
        """The group documents of ``entries`` (bytes, or ``None`` for a missing group):
        from the shard cache where it has them, the rest in one round (and kept there)."""
        keys = [cache_key(entry) for entry in entries]
        found: list[Any] = [None] * len(entries)
        if self.shard_cache is not None:
            for position, key in enumerate(keys):
                if key is not None:
                    found[position] = self.shard_cache.group_document(key)
        missing = [position for position, raw in enumerate(found) if raw is None]
        if missing:
            paths = [f"{group_path(trajectory_id(entries[p]))}/zarr.json" for p in missing]
            for position, raw in zip(missing, self._documents(store, paths), strict=True):
                found[position] = raw
                key = keys[position]
                if self.shard_cache is not None and key is not None and raw is not None:
                    self.shard_cache.put_group_document(key, raw)
        return found

    def _cache_inline(self, handles: ShardedTrajectory, ckey: Any) -> None:
        """Keep the shards ``handles`` opened from their group document in the shard cache
        too, and read them from there: memory-mapped, as the fetched ones are."""
        cache = self.shard_cache
        if cache is None or ckey is None:
            return
        for key, shard in list(handles.remote.items()):
            if shard.data is None or shard.spec.fill:  # a shard not stored stays with them
                continue
            copy = cache.open_shard(ckey, key, shard.spec, shard.where)
            if copy is None:
                copy = cache.put_shard(ckey, key, shard.spec, shard.data, shard.where)
            if copy is not None:
                handles.local[key] = copy
                del handles.remote[key]

    def _open_cached(self, location: Location, pending: list[Any]) -> list[Any]:
        """Open the shards of ``pending`` that the shard cache holds, fetch the others whole
        into it (in rounds of bounded bytes) and open those; returns what is left to read
        from the store (the cache stepped aside, or the entry has no uuid)."""
        cache = self.shard_cache
        assert cache is not None
        left: list[Any] = []
        wanted: list[Any] = []
        for handles, (key, path, spec, where), ckey in pending:
            shard = None if ckey is None else cache.open_shard(ckey, key, spec, where)
            if shard is not None:
                handles.local[key] = shard
            elif ckey is None:
                left.append((handles, (key, path, spec, where), ckey))
            else:
                wanted.append((handles, (key, path, spec, where), ckey))
        # Each round's shards are written while the next round downloads.
        placed = []
        with ThreadPoolExecutor(CACHE_WRITERS, thread_name_prefix="rbzarr-cache-write") as pool:
            for batch in _rounds(wanted, FETCH_ROUND_BYTES):
                paths = [path for _, (_, path, _, _), _ in batch]
                # One byte past the written size: a larger object shows by the same request.
                ends: list[int | None] = [spec.shard_bytes + 1 for _, (_, _, spec, _), _ in batch]
                results = self.source.cat_ranges(location.fs, paths, [0] * len(paths), ends)
                for (handles, request, ckey), result in zip(batch, results, strict=True):
                    key, _, spec, where = request
                    data = checked_bytes(result, where)
                    cache.stats.fetched += 1
                    cache.stats.fetched_bytes += len(data)
                    written = pool.submit(cache.put_shard, ckey, key, spec, data, where)
                    placed.append((handles, request, ckey, written))
        for handles, request, ckey, written in placed:
            shard = written.result()
            if shard is None:
                left.append((handles, request, ckey))
            else:
                handles.local[request[0]] = shard
        return left

    def _open_arrays(self, tid: int, keys: Sequence[str]) -> dict[str, AsyncArray[Any]]:
        if not keys:
            return {}
        store = self.store()
        group = group_path(tid)
        for key in keys:
            # The gate; zarr reads these arrays' chunk files itself, so locally the whole
            # folder is checked for links too.
            self._location.child(TRAJECTORIES, str(tid), *key.split("/")).check_tree()
        try:
            arrays = sync(
                gather(*(AsyncArray.open(StorePath(store, f"{group}/{key}")) for key in keys))
            )
        except FileNotFoundError as exc:
            raise CorruptStoreError(
                f"trajectory {tid} at {self._location.url}/{group} is committed but an array "
                f"is missing: {exc}"
            ) from exc
        except (ValueError, TypeError, KeyError) as exc:  # zarr refused an array document
            raise CorruptStoreError(
                f"trajectory {tid} at {self._location.url}/{group}: an array's zarr.json is "
                f"not one rbzarr reads: {exc}"
            ) from exc
        return dict(zip(keys, arrays, strict=True))


def _rounds(items: list[Any], limit: int) -> list[list[Any]]:
    """``items`` (``(handles, (key, path, spec, where), ckey)``) in consecutive groups of at
    most ``limit`` shard bytes (at least one each)."""
    groups: list[list[Any]] = []
    size = 0
    for item in items:
        nbytes = item[1][2].shard_bytes
        if not groups or size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += nbytes
    return groups


def _check_every_chunk(arrays: dict[str, AsyncArray[Any]], where: str) -> None:
    """Arrays zarr reads are written with every chunk: a missing one is damage, not zeros.

    Their grids and chunks are bounded first (numeric dtypes, at most
    :data:`MAX_ARRAY_CHUNKS` chunks of at most :data:`MAX_CHUNK_BYTES` decoded bytes), so a
    description cannot ask for a walk or an allocation of any size.
    """
    for key, array in arrays.items():
        dtype = array.dtype
        kind = getattr(dtype, "kind", "")
        chunk_bytes = math.prod(array.chunks) * getattr(dtype, "itemsize", 0)
        if kind not in NUMERIC_KINDS or dtype.fields is not None:
            raise CorruptStoreError(f"{where}/{key}: dtype {dtype} is not one rbzarr stores")
        if array.nchunks > MAX_ARRAY_CHUNKS or chunk_bytes > MAX_CHUNK_BYTES:
            raise CorruptStoreError(
                f"{where}/{key}: a grid of {array.nchunks} chunks of {chunk_bytes} bytes; "
                f"rbzarr writes at most {MAX_ARRAY_CHUNKS} chunks of {MAX_CHUNK_BYTES} bytes"
            )
    if not arrays:  # a layout-2 trajectory's shards are all rbzarr's: no round to the loop
        return
    found = sync(gather(*(array.nchunks_initialized() for array in arrays.values())))
    for (key, array), count in zip(arrays.items(), found, strict=True):
        if count != array.nchunks:
            raise CorruptStoreError(
                f"{where}/{key}: {array.nchunks - count} of its {array.nchunks} chunks are missing"
            )


def _handle_key(entry: Entry) -> tuple[int, str]:
    try:  # trajectory_id(entry), inline: a batch asks for the keys of ~230 entries
        return int(entry["trajectory_id"]), str(entry.get("uuid", ""))
    except (KeyError, TypeError, ValueError):
        return trajectory_id(entry), ""  # raises the entry's error


def _group_attrs(tid: int, raw: Any, url: str) -> tuple[dict[str, Any], Any]:
    """A group document's attributes and its consolidated members (``None``: a group
    written before they were consolidated, its arrays' documents are files)."""
    group = group_path(tid)
    repair = f"run `rbzarr verify --repair --drop-damaged {url}` to drop it from the index"
    if raw is None:
        raise CorruptStoreError(
            f"trajectory {tid}: the index of {url} lists it but its data ({url}/{group}) is "
            f"missing; {repair}"
        )
    try:
        document = read_json(raw, f"{url}/{group}/zarr.json")
        attrs = document.get("attributes", {})
        members = (document.get(CONSOLIDATED) or {}).get("metadata")
    except (ValueError, AttributeError) as exc:
        raise _unreadable(exc, tid, url) from exc
    if not isinstance(attrs, dict) or not isinstance(attrs.get(FIELDS_ATTR), dict):
        raise CorruptStoreError(
            f"trajectory {tid}: the index of {url} lists it but its data ({url}/{group}) is "
            f"incomplete (its write never finished); {repair}"
        )
    return attrs, members


def _check_claim(entry: Entry, attrs: dict[str, Any], where: str) -> None:
    """Refuse a group whose attributes name another trajectory id than the entry that
    points at it (its folder holds another trajectory's data)."""
    if "trajectory_id" in attrs and str(attrs["trajectory_id"]) != str(entry["trajectory_id"]):
        raise CorruptStoreError(
            f"{where}: the index lists trajectory {entry['trajectory_id']!r} here but the "
            f"group holds trajectory {attrs['trajectory_id']!r}: the index or the group was "
            "tampered with; run `rbzarr verify`"
        )


def _unreadable(exc: BaseException, tid: int, url: str) -> BaseException:
    if isinstance(exc, RbzarrError):
        return exc
    return CorruptStoreError(
        f"{url}/{group_path(tid)}: trajectory {tid} has unreadable metadata: {exc}"
    )
