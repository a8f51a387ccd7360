"""The cache of opened trajectories of the zarr layout, and what index entries say.

:class:`HandleCache` keeps the most recently used ones, keyed by ``(id, uuid)``.  It is
bounded in trajectories and in open file descriptors, forgets remote handles in a forked
child (they do not survive a fork; local maps and descriptors do) and, through a
generation counter, never caches handles opened while a write or delete ran.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from zarr.core.array import AsyncArray

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.zarr.describe import trajectory_id
from rbzarr.storage.zarr.sharded import ShardedTrajectory

__all__ = ["HandleCache", "check_array_shapes", "time_and_envs", "trajectory_id"]


def _file_budget() -> int:
    """A quarter of the process's descriptor limit and of the kernel's map count limit
    (a local handle holds a descriptor and a map per array), at least 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = soft if soft != resource.RLIM_INFINITY else 65536
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as limit:
            budget = min(budget, int(limit.read()))
    except (OSError, ValueError):  # not Linux: the descriptors alone
        pass
    return max(64, budget // 4)


class HandleCache:
    """LRU cache of opened trajectories, bounded in count and in open file descriptors.

    Parameters
    ----------
    size
        The most trajectories kept (0 keeps none).  The handles together also hold at most
        a quarter of the process's file-descriptor limit (at least 64).
    fork_safe
        Whether the handles stay valid in a forked child (local memory maps and
        descriptors read with ``pread`` do); when ``False`` a forked child starts empty.
    """

    def __init__(self, size: int, fork_safe: bool) -> None:
        self.size = size
        self.fork_safe = fork_safe
        self.file_budget = _file_budget()
        self._handles: OrderedDict[tuple[int, str], ShardedTrajectory] = OrderedDict()
        self._files = 0
        self._generation = 0
        self._evictions = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def get_many(
        self, keys: Sequence[tuple[int, str]]
    ) -> tuple[list[ShardedTrajectory | None], int]:
        """The cached handles of each key (``None`` where not cached) and the current
        generation, under one hold of the lock (a batch asks for ~100); hits become the most
        recently used entries."""
        with self._lock:
            self._check_fork()
            found = [self._handles.get(key) for key in keys]
            for key, opened in zip(keys, found, strict=True):
                if opened is not None:
                    self._handles.move_to_end(key)
            return found, self._generation

    def put(self, key: tuple[int, str], opened: ShardedTrajectory, generation: int) -> None:
        """Cache ``opened`` unless a write or delete ran since ``generation``.

        The least recently used entries are evicted beyond the bounds; a key already cached
        keeps its handles.
        """
        with self._lock:
            if generation != self._generation or self.size == 0 or key in self._handles:
                return
            self._handles[key] = opened
            self._files += opened.files
            while self._handles and (
                len(self._handles) > self.size or self._files > self.file_budget
            ):
                _, evicted = self._handles.popitem(last=False)
                self._files -= evicted.files
                self._evictions += 1

    def version(self) -> tuple[int, int]:
        """A value that changes whenever a cached handle may go (a write, a delete, an
        eviction, a fork that drops them): what was taken from the cache stays valid while
        it is the same."""
        with self._lock:
            self._check_fork()
            return self._generation, self._evictions

    def keep_at_least(self, size: int) -> None:
        """Keep up to ``size`` trajectories (or more, if already so; the file budget still
        bounds them)."""
        with self._lock:
            self.size = max(self.size, size)

    def forget(self, tid: int | None = None) -> None:
        """Drop the handles of trajectory ``tid`` and start a new generation.

        Handles being opened meanwhile are then not cached (see :meth:`put`).
        """
        with self._lock:
            self._generation += 1
            for key in [key for key in self._handles if tid is None or key[0] == tid]:
                self._files -= self._handles.pop(key).files

    def _check_fork(self) -> None:
        if self._pid != os.getpid() and not self.fork_safe:
            self._pid = os.getpid()
            self._handles.clear()
            self._files = 0
            self._generation += 1


def time_and_envs(entry: Entry) -> tuple[int, int]:
    """``(T, B)`` of an index entry."""
    shape = entry.get("shape")
    if not isinstance(shape, Sequence) or len(shape) < 2:
        raise CorruptStoreError(f"index entry has no [T, B, ...] 'shape': {entry!r}")
    return int(shape[0]), int(shape[1])


def check_array_shapes(arrays: Mapping[str, AsyncArray[Any]], entry: Entry, where: str) -> None:
    """Refuse zarr arrays (``[T(+E), B, ...]``, ``E`` dividing ``T``) whose shape disagrees
    with their index entry's ``shape``; 0-d and 1-d arrays are not checked."""
    T, B = time_and_envs(entry)
    for key, array in arrays.items():
        if array.ndim < 2:
            continue
        rows, envs = int(array.shape[0]), int(array.shape[1])
        if envs != B or rows < T or (rows > T and T % (rows - T) != 0):
            raise CorruptStoreError(
                f"{where}/{key}: shape {tuple(array.shape)} disagrees with the "
                f"index entry's shape {list(entry['shape'])}"
            )
