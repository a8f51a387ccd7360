"""Shards mapped at bays (equal fixed parts) of reserved address ranges: one gather per key.

A batch of state rows touches each key of ~100 trajectories; one numpy gather per
(trajectory, key) out of each shard's own memory map cost ~665 small gathers and their
Python per 4,096-row batch.  Here every shard of one row size and bay size is mapped
read-only into a bay of one range reserved up front (``PROT_NONE``, no memory behind it):
the kernel's ``mmap`` with ``MAP_FIXED`` at ``bay * bay_bytes``, ``bay_bytes`` a multiple
of both the page size and the row size.  Row ``r`` of the shard in bay ``s`` is then row
``s * bay_rows + r`` of one view of the range, and a batch reads each key with one gather
over all its trajectories.  A mapped shard's data starts at offset 0 of its file (its index
is at the end), so the file maps as it is.  Each bay is ``MADV_RANDOM`` (a cold row faults
in its own pages only); rows of at least a page are asked for with ``MADV_WILLNEED`` first.
A shard of rows smaller than a page is faulted in whole when it is mapped, while
:data:`POPULATED` (a quarter of the memory) allows (``MADV_POPULATE_READ``: one call, in
file order, with read-ahead): a batch's gathers then take no page fault at all, where each
of its small rows would otherwise fault in a page of its own.

Measured with the bench's state workload in one process against TorchRL's
``LazyMemmapStorage.get`` of the same rows (thread CPU time, min of 80 batches, 2 busy
cores): one gather per (trajectory, key) 0.33x; bays with one gather per key 0.64x; rows
gathered as one numpy record each instead of as bytes 0.75x (numpy copies 4,096 records of
168 bytes ~2x faster); with the batch's bookkeeping vectorised 0.93x.

A bay is handed back (its pages replaced by the reservation again, so no other mapping can
take the hole) when the shard that holds it is garbage: a read holds its trajectories'
shards, so no bay it gathers from changes under it.  Mappings survive a fork (the child
sees the same bays).  Every map the read path makes is counted against
:data:`MAP_BUDGET` (half of ``vm.max_map_count``): beyond it a shard is read with ``pread``.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "MAP_BUDGET",
    "POPULATED",
    "Bay",
    "MapBudget",
    "Region",
    "place",
    "record_dtype",
]

_PROT_NONE = 0
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
# Virtual bytes one region reserves (address space only: PROT_NONE, no memory, no swap).
REGION_BYTES = 1 << 34
# The fewest bays a region holds, whatever its bay size.
MIN_BAYS = 16


class MapBudget:
    """How many memory mappings (or, for :data:`POPULATED`, populated bytes) the read path
    may hold, counted as they are made and freed.

    Mappings are handed back from finalizers, which the garbage collector may run inside any
    allocation, even one under this budget's lock: :meth:`give` therefore only queues the
    count (a list append takes no lock), and the queue is settled under the lock.

    Parameters
    ----------
    limit
        The most mappings (bytes) held at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._returned: list[int] = []
        self._lock = threading.Lock()

    def _settle(self) -> None:
        """Take the queued returns off the count (call under the lock)."""
        while self._returned:
            self._held -= self._returned.pop()

    @property
    def held(self) -> int:
        """Mappings held now."""
        with self._lock:
            self._settle()
            return self._held

    def take(self, count: int) -> bool:
        """Reserve ``count`` mappings; ``False`` (nothing reserved) when over the limit."""
        with self._lock:
            self._settle()
            if self._held + count > self.limit:
                return False
            self._held += count
            return True

    def give(self, count: int) -> None:
        """Hand back ``count`` mappings."""
        self._returned.append(count)

    def renew_lock(self) -> None:
        """A new lock (in a forked child, where another thread may have held the old one)."""
        self._lock = threading.Lock()


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 65530


# Half the kernel's limit: the rest is left to the interpreter, libraries and the user.
MAP_BUDGET = MapBudget(_max_map_count() // 2)


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _libc_mmap() -> Any:
    if _LIBC is None:
        return None
    function = _LIBC.mmap
    function.restype = ctypes.c_void_p
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return function


_MMAP = _libc_mmap()
_FAILED = ctypes.c_void_p(-1).value


def _call_mmap(address: int, length: int, prot: int, flags: int, fd: int) -> int:
    """The kernel's ``mmap``; ``OSError`` when it fails."""
    assert _MMAP is not None
    found = _MMAP(address or None, length, prot, flags, fd, 0)
    if found is None or found == _FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return int(found)


def record_dtype(row_bytes: int) -> np.dtype:
    """One row of ``row_bytes`` bytes as a single numpy record."""
    return np.dtype((np.void, row_bytes))


class _AddressView:
    """Exposes ``nbytes`` of read-only memory at ``address`` to numpy."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, True),
            "version": 3,
        }


class Region:
    """One reserved address range of equal bays, each holding one mapped shard file.

    Parameters
    ----------
    row_bytes
        The row size of every shard placed here.
    bay_bytes
        The bytes of one bay: a multiple of the page size and of ``row_bytes``.
    bays
        How many bays the range holds.

    Raises
    ------
    OSError
        The range could not be reserved.
    """

    def __init__(self, row_bytes: int, bay_bytes: int, bays: int) -> None:
        self.row_bytes = row_bytes
        self.bay_bytes = bay_bytes
        self.bay_rows = bay_bytes // row_bytes
        self.bays = bays
        self.address = _call_mmap(0, bay_bytes * bays, _PROT_NONE, self._reserve_flags, -1)
        view = np.asarray(_AddressView(self.address, bay_bytes * bays))
        self.rows = view.reshape(-1, row_bytes)
        # The same rows as one record each: numpy gathers and scatters records ~2x faster
        # than rows of bytes (measured: 4,096 rows of 168 bytes, 135 us against 307 us).
        self.records = view.view(record_dtype(row_bytes))
        self._free: list[int] = []
        self._next = 0
        self._lock = threading.Lock()

    _reserve_flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE

    def map(self, fd: int, nbytes: int, budget: MapBudget) -> Bay | None:
        """Map ``nbytes`` of file ``fd`` (from offset 0) into a free bay; ``None`` when full.

        The bay hands :data:`BAY_MAPS` back to ``budget`` when released.
        """
        with self._lock:
            if self._free:
                bay = self._free.pop()
            elif self._next < self.bays:
                bay = self._next
                self._next += 1
            else:
                return None
        address = self.address + bay * self.bay_bytes
        populated = 0
        try:
            _call_mmap(address, nbytes, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd)
            # Rows smaller than a page, populated first, with the kernel's read-ahead: a cold
            # shard is read in large sequential requests (under MADV_RANDOM, a page a read).
            if self.row_bytes < mmap.PAGESIZE:
                populated = _populate(address, nbytes)
            _madvise(address, nbytes, mmap.MADV_RANDOM)
        except OSError:
            self.release(bay)
            POPULATED.give(populated)
            raise
        return Bay(self, bay, budget, populated)

    def prefetch(self, rows: np.ndarray) -> None:
        """Ask the kernel to start reading region rows ``rows`` (``MADV_WILLNEED``), so the
        pages of a cold batch arrive in parallel instead of one fault at a time."""
        for row in np.unique(rows).tolist():
            _madvise(self.address + row * self.row_bytes, self.row_bytes, mmap.MADV_WILLNEED)

    def renew_lock(self) -> None:
        """A new lock (in a forked child, where another thread may have held the old one)."""
        self._lock = threading.Lock()

    def release(self, bay: int) -> None:
        """Put the reservation back over ``bay`` (nothing else can map there) and free it.

        Takes no lock (a list append is atomic): finalizers call it, and the garbage
        collector may run them inside :meth:`map`'s locked section.
        """
        address = self.address + bay * self.bay_bytes
        flags = self._reserve_flags | _MAP_FIXED
        _call_mmap(address, self.bay_bytes, _PROT_NONE, flags, -1)
        self._free.append(bay)


@dataclass(frozen=True)
class Bay:
    """A bay of a :class:`Region` holding one shard file (hand it back with :meth:`release`)."""

    region: Region
    index: int
    budget: MapBudget
    populated: int  # bytes of it counted by :data:`POPULATED`

    @property
    def first_row(self) -> int:
        """The region row of the shard's row 0."""
        return self.index * self.region.bay_rows

    def release(self) -> None:
        """Unmap the shard and free the bay (and its share of the map budget)."""
        self.region.release(self.index)
        self.budget.give(BAY_MAPS)
        POPULATED.give(self.populated)


# A bay's mapping splits its region's reservation: at most two more mappings per bay.
BAY_MAPS = 2


def _madvise(address: int, nbytes: int, advice: int) -> None:
    assert _LIBC is not None
    start = address - address % mmap.PAGESIZE
    if _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(nbytes + address - start), advice):
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


# MADV_POPULATE_READ (Linux 5.14): map every page of a range now, reading it in file order.
_MADV_POPULATE_READ = 22


def _populate(address: int, nbytes: int) -> int:
    """Fault in ``nbytes`` mapped at ``address`` while :data:`POPULATED` allows; the bytes
    counted against it (0: not populated, over the budget or refused by the kernel).

    A sampled window's rows are all read in time; without this each row's first read takes a
    page fault of its own (a few us each: most of a 256-row batch's time at 10^7 rows).
    Populated in one call, a shard's pages arrive in file order.  Beyond the budget (a store
    larger than memory) shards are left to fault in as rows are read.
    """
    if not POPULATED.take(nbytes):
        return 0
    try:
        _madvise(address, nbytes, _MADV_POPULATE_READ)
    except OSError:  # an older kernel, or the file shrank: its rows fault in when read
        POPULATED.give(nbytes)
        return 0
    return nbytes


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 32


# Bytes of shards populated when mapped: a quarter of the machine's memory.
POPULATED = MapBudget(_memory_bytes() // 4)

_regions: dict[tuple[int, int], list[Region]] = {}
_regions_lock = threading.Lock()


def _renew_locks() -> None:
    """In a forked child: new locks for the regions and the budgets, any of which another
    thread of the parent may have held (the regions stay: the child has their mappings)."""
    global _regions_lock  # noqa: PLW0603 - the module's one lock, replaced whole
    _regions_lock = threading.Lock()
    for budget in (MAP_BUDGET, POPULATED):
        budget.renew_lock()
    for family in _regions.values():
        for region in family:
            region.renew_lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_locks)


def place(fd: int, nbytes: int, row_bytes: int) -> Bay | None:
    """Map ``nbytes`` of shard file ``fd`` into a bay of a region of its row size, or
    ``None`` where regions are unavailable (not Linux) or the map budget is spent."""
    budget = MAP_BUDGET
    if _MMAP is None or not budget.take(BAY_MAPS):
        return None
    unit = math.lcm(mmap.PAGESIZE, row_bytes)
    # A power of two of units: trajectories of varied lengths share a few regions (the slack
    # is reserved address space only, no memory).
    bay_bytes = unit << (-(-nbytes // unit) - 1).bit_length()
    try:
        with _regions_lock:
            family = _regions.setdefault((row_bytes, bay_bytes), [])
            for region in family:
                bay = region.map(fd, nbytes, budget)
                if bay is not None:
                    return bay
            region = Region(row_bytes, bay_bytes, max(MIN_BAYS, REGION_BYTES // bay_bytes))
            family.append(region)
            bay = region.map(fd, nbytes, budget)
    except OSError:
        bay = None
    if bay is None:
        budget.give(BAY_MAPS)
    return bay
