"""One thread pool per process, for work that releases the GIL (codecs, zstd, file reads).

A pool created before a ``fork`` has no threads in the child, so the pool is keyed by the
process id and rebuilt after a fork.  Work is only handed to it when it is large enough to
pay for the hop (see the callers).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["WORKERS", "run_all"]

_T = TypeVar("_T")
_R = TypeVar("_R")
_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}  # by process id


def _renew_lock() -> None:
    """A forked child's lock: another thread of the parent may have held the old one."""
    global _lock  # noqa: PLW0603 - the module's one lock, replaced whole
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_lock)


def _cores() -> int:
    """The cores this process may run on (its affinity, where the platform tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 2


# One thread per core: image codecs and zstd release the GIL, so encoding uses every core.
WORKERS = max(2, _cores())


def _executor() -> ThreadPoolExecutor:
    """This process's pool, rebuilt after a fork."""
    with _lock:
        pool = _pools.get(os.getpid())
        if pool is None:
            _pools.clear()  # a parent's pool has no threads here
            pool = _pools[os.getpid()] = ThreadPoolExecutor(WORKERS, thread_name_prefix="rbzarr-io")
        return pool


def run_all(fn: Callable[[_T], _R], items: Sequence[_T], threaded: bool) -> list[_R]:
    """``[fn(item) for item in items]``, split over the pool when ``threaded`` (and worth it).

    The calling thread takes the first share itself; results keep the order of ``items`` and an
    exception from ``fn`` propagates unchanged, once every share has ended (no call of ``fn``
    still runs when this returns or raises: a caller cleaning up after a failure races none).
    """
    if not threaded or len(items) < 2:
        return [fn(item) for item in items]
    share = -(-len(items) // WORKERS)
    batches = [items[i : i + share] for i in range(0, len(items), share)]
    futures = [_executor().submit(_each, fn, batch) for batch in batches[1:]]
    try:
        results = _each(fn, batches[0])
    finally:
        wait(futures)
    for future in futures:
        results.extend(future.result())
    return results


def _each(fn: Callable[[_T], _R], batch: Iterable[_T]) -> list[_R]:
    """``fn`` over one share."""
    return [fn(item) for item in batch]
