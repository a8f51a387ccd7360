"""Memory for staged copies, handed out again once nothing holds the copy that used it.

``add_trajectories`` copies each large tensor once, into a staging buffer that the writer
hands straight to the file.  Fresh memory is slow to fill: the kernel faults in and zeroes
every page first, and on this host the zeroing alone cost 1.7x the copy (``perf``:
``clear_page_erms`` 24% of an add of camera frames, the copy 14%).  So a staging buffer's
memory goes back to a pool when the last array, tensor or view of it is gone, and the next
copy of the same size class reuses it, its pages already there.  Blocks from
:data:`MIN_POOLED_BYTES` up are pooled: the allocator hands such sizes fresh mappings too
(glibc maps them, or trims its heap of them when freed), and a 16-trajectory add of 0.5 MB
state tensors measured 7-12 ms through the allocator against 3 ms in pooled blocks.  Large
blocks ask for huge pages, where the platform lets a mapping ask.

The pool keeps at most :data:`IDLE_BYTES` unused (the rest is unmapped).  A forked child
starts its pool over: a new lock (another thread may have held the parent's) and nothing
idle; the blocks it inherited lent are its own private copies, and come back to it.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import defaultdict

import numpy as np

__all__ = [
    "BLOCK_BYTES",
    "IDLE_BYTES",
    "MIN_POOLED_BYTES",
    "StagingPool",
    "release_idle",
    "staging_buffer",
]

# Size classes are whole huge pages: the sizes one run stages repeat (the same frames every
# step), so a class is nearly always the buffer's own size.
BLOCK_BYTES = 2 << 20
# Below a huge page, classes are multiples of this; below it, the allocator's own memory.
MIN_POOLED_BYTES = 64 << 10
# Unused memory the pool keeps for reuse: a few steps of camera frames.
IDLE_BYTES = 512 << 20


class StagingPool:
    """Blocks of anonymous memory by size class, lent as arrays and taken back when the array
    (and every view of it) is garbage."""

    def __init__(self, idle_bytes: int = IDLE_BYTES) -> None:
        self.idle_bytes = idle_bytes
        # Re-entrant: a collection inside a locked section may run a lent array's finalizer.
        self._lock = threading.RLock()
        self._idle: defaultdict[int, list[mmap.mmap]] = defaultdict(list)
        self._kept = 0

    @property
    def kept(self) -> int:
        """Bytes of unused blocks held for reuse."""
        return self._kept

    def lend(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of writable ``uint8`` memory; its block comes back to the pool when the
        array and every array or tensor made from it are gone (below
        :data:`MIN_POOLED_BYTES`, plain memory from the allocator, which reuses its own)."""
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(nbytes, np.uint8)
        step = BLOCK_BYTES if nbytes >= BLOCK_BYTES else MIN_POOLED_BYTES
        size = -(-nbytes // step) * step
        block = self._take(size) or _new_block(size)
        lent = np.frombuffer(block, np.uint8, count=nbytes)
        weakref.finalize(lent, self._give_back, block).atexit = False
        return lent

    def release_idle(self) -> int:
        """Let every idle block be unmapped; the bytes they held."""
        with self._lock:
            released, self._kept = self._kept, 0
            self._idle.clear()
        return released

    def start_over(self) -> None:
        """Forget the idle blocks and take a new lock (in a forked child, where another
        thread of the parent may have held the old one)."""
        self._lock = threading.RLock()
        self._idle = defaultdict(list)
        self._kept = 0

    def _take(self, size: int) -> mmap.mmap | None:
        """An idle block of ``size`` bytes, if the pool holds one."""
        with self._lock:
            idle = self._idle.get(size)
            if not idle:
                return None
            self._kept -= size
            return idle.pop()

    def _give_back(self, block: mmap.mmap) -> None:
        """Keep ``block`` for reuse while the pool has room, else let it be unmapped."""
        with self._lock:
            if self._kept + len(block) > self.idle_bytes:
                return
            self._idle[len(block)].append(block)
            self._kept += len(block)


def _new_block(size: int) -> mmap.mmap:
    """``size`` bytes of new private anonymous memory, in huge pages where it may ask (a
    block of whole huge pages)."""
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size % BLOCK_BYTES == 0 and hasattr(mmap, "MADV_HUGEPAGE"):
        block.madvise(mmap.MADV_HUGEPAGE)
    return block


_POOL = StagingPool()
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_POOL.start_over)


def staging_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of staging memory from this process's pool (see the module docs)."""
    return _POOL.lend(nbytes)


def release_idle() -> int:
    """Hand the staging memory this process keeps for reuse back to the system.

    Returns
    -------
    int
        The bytes released (at most :data:`IDLE_BYTES`).
    """
    return _POOL.release_idle()
