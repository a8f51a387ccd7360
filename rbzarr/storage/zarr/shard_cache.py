"""A bounded local copy of a remote store's shards, shared by the processes of one machine.

Remote trajectories are fetched whole (each shard in one GET) into a local directory and read
from there through the local memory-map path (:class:`~rbzarr.storage.zarr.local.LocalShard`).
Below the directory each store has its own folder, named by a digest of its URL and endpoint,
so two stores never mix::

    <dir>/<digest>/store.json                 {"url", "endpoint_url"}: the store it caches
    <dir>/<digest>/<id>-<uuid>/group.json     the trajectory group's document
    <dir>/<digest>/<id>-<uuid>/<key>/shard    the shard's bytes, read-only
    <dir>/<digest>/<id>-<uuid>/<key>/shard.ok {"size", "ino", "mtime_ns"} of the shard file

A trajectory is named by its id *and* the uuid of its index entry, so a store cleared and
written again never serves an old copy.  Trust: a shard is served only when its ``.ok``
record matches the file (size, inode and modification time: a truncated, replaced or edited
file does not) and its size is the one the layout description gives; its index is then
checked as any local shard's.  Files are written under a temporary name and renamed into
place before their record is written, so a crash mid-download leaves nothing the next run
trusts (temporary files older than an hour are removed).  Processes share a directory
safely: renames are atomic, a copy another process evicts stays readable through the maps
already open (the kernel keeps an unlinked file until its last map goes), and one that
disappears between the check and the open is fetched again.

The cache is bounded in bytes of shards (each trajectory's records and group document add a
few KiB).  Over the bound, trajectories that left this process's sample
window go first, then the least recently used (last use: the folder's modification time,
which reads bring forward).  A full disk shrinks the cache to what it holds and, if a write
still fails, the cache steps aside for a minute: reads go to the store meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.files import write_parts
from rbzarr.storage.io.names import TEMP_SUFFIX, number_name, safe_name, temporary_name
from rbzarr.storage.zarr.local import LocalShard
from rbzarr.storage.zarr.spec import ArraySpec

__all__ = ["DEFAULT_LOCAL_CACHE_BYTES", "CacheKey", "CacheStats", "ShardCache", "cache_key"]

log = logging.getLogger(__name__)

CacheKey = tuple[int, str]
# The bound when only the directory is given: 16 GiB.
DEFAULT_LOCAL_CACHE_BYTES = 16 << 30
# Uuids of index entries rbzarr writes; anything else is not cached (it names a folder).
_UUID = re.compile(r"[0-9a-fA-F-]{1,64}")
# A full disk: the cache shrinks, then steps aside this long.
STEP_ASIDE_S = 60.0
# Temporary files older than this are left over from a crash.
STALE_TEMP_S = 3600.0
_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)


def cache_key(entry: Mapping[str, Any]) -> CacheKey | None:
    """The cache's name for an index entry's trajectory, or ``None`` when it has no uuid."""
    uuid = str(entry.get("uuid", ""))
    if not _UUID.fullmatch(uuid):
        return None
    return int(entry["trajectory_id"]), uuid


@dataclass
class CacheStats:
    """What the cache did since it opened (this process only)."""

    hits: int = 0
    fetched: int = 0
    fetched_bytes: int = 0
    written_through: int = 0
    evicted: int = 0
    rejected: int = 0
    disk_full: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dict(vars(self))


class ShardCache:
    """Whole shards of one remote store, kept in a local directory up to a byte bound.

    Parameters
    ----------
    directory
        The cache directory (created if missing); several stores and processes may share it.
    capacity
        The most bytes this store's copies may take.
    url
        The store's URL.
    endpoint_url
        The object store's endpoint, part of the store's identity (two servers may hold
        buckets of the same name).

    Raises
    ------
    ValueError
        ``capacity`` is not positive.
    OSError
        The directory cannot be created.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity: int,
        url: str,
        endpoint_url: str | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"local_cache_bytes must be > 0, got {capacity}")
        self.capacity = int(capacity)
        self.url = url
        identity = json.dumps({"url": url, "endpoint_url": endpoint_url}, sort_keys=True)
        self.root = os.path.join(
            os.path.abspath(os.fspath(directory)),
            hashlib.sha256(identity.encode()).hexdigest()[:24],
        )
        os.makedirs(self.root, exist_ok=True)
        _claim_root(self.root, identity)
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._window: set[CacheKey] = set()
        self._used: dict[CacheKey, float] = {}
        self._aside_until = 0.0
        self._bytes = self._scan_bytes()

    # -- reading ----------------------------------------------------------------------
    def group_document(self, key: CacheKey) -> bytes | None:
        """The cached group document of ``key``'s trajectory, or ``None``."""
        try:
            with open(os.path.join(self._folder(key), "group.json"), "rb") as handle:
                return handle.read()
        except OSError:
            return None

    def open_shard(
        self, key: CacheKey, array_key: str, spec: ArraySpec, where: str
    ) -> LocalShard | None:
        """The trusted local copy of one shard, opened; ``None`` when there is none.

        A copy whose record does not match it (truncated, edited, an unfinished write) is
        removed, so the caller fetches it again.
        """
        path = self._shard_path(key, array_key)
        if path is None or not self._trusted(path, spec):
            return None
        try:
            shard = LocalShard(path, spec, where)
        except CorruptStoreError:
            self._discard(path)  # evicted meanwhile, or damaged under a matching record
            self.stats.rejected += 1
            return None
        self.stats.hits += 1
        return shard

    def used(self, keys: Iterable[CacheKey]) -> None:
        """Note that ``keys`` were read now (the eviction order)."""
        now = time.time()
        with self._lock:
            for key in keys:
                self._used[key] = now

    def retain(self, keys: Iterable[CacheKey]) -> None:
        """The trajectories of this process's sample window: evicted last."""
        with self._lock:
            self._window = set(keys)

    # -- writing ----------------------------------------------------------------------
    def put_group_document(self, key: CacheKey, raw: bytes) -> None:
        """Keep a trajectory group's document."""
        folder = self._folder(key)
        if folder is None or self._stepped_aside():
            return
        self._write(os.path.join(folder, "group.json"), raw, record=False)

    def put_shard(
        self,
        key: CacheKey,
        array_key: str,
        spec: ArraySpec,
        data: bytes | memoryview,
        where: str,
    ) -> LocalShard | None:
        """Keep a fetched or written shard and open the copy; ``None`` when the cache steps
        aside (a full disk) or cannot name it.

        Raises
        ------
        CorruptStoreError
            ``data`` is not a whole shard of ``spec`` (wrong size or a damaged index).
        """
        if len(data) != spec.shard_bytes:
            state = "truncated" if len(data) < spec.shard_bytes else "larger than written"
            raise CorruptStoreError(
                f"{where}: the shard holds {len(data)} bytes, expected {spec.shard_bytes} ({state})"
            )
        path = self._shard_path(key, array_key)
        if path is None or self._stepped_aside():
            return None
        with self._lock:
            self._used[key] = time.time()  # the newest: evicted last while it is written
        self._make_room(len(data))
        return self._write(path, data, record=True, spec=spec, where=where)

    # -- eviction ---------------------------------------------------------------------
    def evict(self, target: int | None = None) -> int:
        """Remove whole trajectories until the copies take at most ``target`` bytes (the
        capacity by default): those outside the window first, then the least recently used.

        Returns the bytes the copies take afterwards.
        """
        target = self.capacity if target is None else target
        with _exclusive(os.path.join(self.root, ".lock")):
            with self._lock:
                window, used = set(self._window), dict(self._used)
            folders = self._folders(used)
            total = sum(size for _, size, _ in folders)
            # Outside the window first, then by last use (oldest first).
            folders.sort(key=lambda item: (item[0] in window, item[2]))
            for key, size, _ in folders:
                if total <= target:
                    break
                shutil.rmtree(os.path.join(self.root, _folder_name(key)), ignore_errors=True)
                total -= size
                self.stats.evicted += 1
            self._remove_stale_temporaries()
        with self._lock:
            self._bytes = total
        return total

    @property
    def nbytes(self) -> int:
        """The bytes the copies take, as this process last counted them."""
        with self._lock:
            return self._bytes

    # -- internals --------------------------------------------------------------------
    def _folder(self, key: CacheKey) -> str:
        return os.path.join(self.root, _folder_name(key))

    def _shard_path(self, key: CacheKey, array_key: str) -> str | None:
        parts = array_key.split("/")
        try:
            for part in parts:
                safe_name(part, self.url)
        except ValueError:
            return None
        return os.path.join(self._folder(key), *parts, "shard")

    def _trusted(self, path: str, spec: ArraySpec) -> bool:
        if not os.path.exists(f"{path}.ok"):
            return False
        try:
            trusted = _record_matches(path) and os.stat(path).st_size == spec.shard_bytes
        except OSError:  # evicted meanwhile
            return False
        if not trusted:
            self._discard(path)
            self.stats.rejected += 1
        return trusted

    def _discard(self, path: str) -> None:
        for name in (f"{path}.ok", path):
            with contextlib.suppress(OSError):
                os.remove(name)

    def _write(
        self,
        path: str,
        data: bytes | memoryview,
        record: bool,
        spec: ArraySpec | None = None,
        where: str = "",
    ) -> LocalShard | None:
        """Write ``data`` to ``path`` by rename (and its record after it); a full disk
        shrinks the cache and retries once, then steps aside."""
        for attempt in range(2):
            try:
                return _write_renamed(path, data, record, spec, where)
            except OSError as exc:
                if exc.errno not in _SPACE_ERRORS:
                    log.warning("local cache %s: cannot write %s: %s", self.root, path, exc)
                    return None
                self.stats.disk_full += 1
                if attempt == 0:
                    self.evict(max(0, self.nbytes - 2 * len(data)))
        with self._lock:
            self._aside_until = time.monotonic() + STEP_ASIDE_S
        log.warning(
            "local cache %s: the disk is full; reading %s from the store for %.0f s",
            self.root,
            self.url,
            STEP_ASIDE_S,
        )
        return None

    def _stepped_aside(self) -> bool:
        with self._lock:
            return time.monotonic() < self._aside_until

    def _make_room(self, incoming: int) -> None:
        with self._lock:
            self._bytes += incoming
            over = self._bytes > self.capacity
        if over:
            self.evict(max(0, self.capacity - incoming))
            with self._lock:
                self._bytes += incoming

    def _folders(self, used: Mapping[CacheKey, float]) -> list[tuple[CacheKey, int, float]]:
        """``(key, bytes, last use)`` of every trajectory folder; this process's uses are
        written to the folders' times first, so all processes share one order."""
        found = []
        for name in _listdir(self.root):
            key = _parse_folder_name(name)
            if key is None:
                continue
            folder = os.path.join(self.root, name)
            if key in used:
                try:
                    os.utime(folder, (used[key], used[key]))
                except OSError:
                    continue
            try:
                last = os.stat(folder).st_mtime
            except OSError:
                continue
            found.append((key, _tree_bytes(folder), last))
        return found

    def _scan_bytes(self) -> int:
        return sum(
            _tree_bytes(os.path.join(self.root, name))
            for name in _listdir(self.root)
            if _parse_folder_name(name) is not None
        )

    def _remove_stale_temporaries(self) -> None:
        cutoff = time.time() - STALE_TEMP_S
        for folder, _, files in os.walk(self.root):
            for name in files:
                if TEMP_SUFFIX not in name:
                    continue
                path = os.path.join(folder, name)
                try:
                    if os.stat(path).st_mtime < cutoff:
                        os.remove(path)
                except OSError:
                    pass


def _claim_root(root: str, identity: str) -> None:
    """Record which store a folder caches; refuse a folder that caches another one."""
    path = os.path.join(root, "store.json")
    try:
        with open(path, "rb") as handle:
            found = handle.read().decode()
    except FileNotFoundError:
        _write_renamed(path, identity.encode(), False, None, "")
        return
    if json.loads(found) != json.loads(identity):
        raise CorruptStoreError(f"{root} caches another store ({found}), not {identity}")


def _write_renamed(
    path: str, data: bytes | memoryview, record: bool, spec: ArraySpec | None, where: str
) -> LocalShard | None:
    """Write ``path`` through a temporary sibling; with ``record``, open the shard and write
    the record that makes it trusted (unless another process placed a trusted copy first:
    then that one stays, and this process reads its own bytes through the map it holds)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = temporary_name(path)
    placed = True
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            write_parts(fd, [data])  # in calls the page cache takes well (WRITEV_BYTES)
        finally:
            os.close(fd)
        opened = None
        if not record:
            os.replace(temp, path)
            return None
        assert spec is not None
        opened = LocalShard(temp, spec, where)  # the map outlives the rename
        try:
            os.link(temp, path)
        except FileExistsError:
            placed = not _record_matches(path)
            if placed:
                os.replace(temp, path)
        opened.path = path  # the same bytes, under the name that stays
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    if placed:
        found = os.stat(path)
        stamp = {"size": found.st_size, "ino": found.st_ino, "mtime_ns": found.st_mtime_ns}
        _write_renamed(f"{path}.ok", json.dumps(stamp).encode(), False, None, where)
    return opened


def _record_matches(path: str) -> bool:
    """Whether ``path`` has a record that matches it (another process's finished copy)."""
    try:
        with open(f"{path}.ok", "rb") as handle:
            record = json.loads(handle.read())
        found = os.stat(path)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record == {
        "size": found.st_size,
        "ino": found.st_ino,
        "mtime_ns": found.st_mtime_ns,
    }


class _exclusive:
    """An exclusive ``flock`` on ``path`` for the block (one evicting process at a time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _folder_name(key: CacheKey) -> str:
    return f"{key[0]}-{key[1]}"


def _parse_folder_name(name: str) -> CacheKey | None:
    tid, _, uuid = name.partition("-")
    number = number_name(tid)
    if number is None or not _UUID.fullmatch(uuid):
        return None
    return number, uuid


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _tree_bytes(folder: str) -> int:
    """The bytes of the shards below ``folder`` (what the bound counts)."""
    total = 0
    for parent, _, files in os.walk(folder):
        if "shard" in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, "shard")).st_size
    return total
