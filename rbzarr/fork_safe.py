"""Locks taken around ``os.fork``, so that a forked child never starts with one held.

A child has only the thread that forked.  A lock another thread held at that moment stays
locked in the child forever: the first call there that takes it (a DataLoader worker reading
the buffer's ids, say) hangs.  Each lock registered here is acquired by the forking thread
just before the fork, once no other thread holds it, and released on both sides after, so
the child finds it free and the state it guards whole.

Only outer locks belong here: ones held briefly, never around a fork, and never by a thread
that waits for a lock the forking thread may hold then (a module's own lock, say, which
:func:`os.register_at_fork` renews in the child instead).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol, TypeVar

__all__ = ["hold_across_fork"]


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


# Registration order is acquisition order; a lock is forgotten with its owner.
_locks: list[weakref.ref[_Lock]] = []
_registry_lock = threading.Lock()
_taken: list[_Lock] = []


_L = TypeVar("_L", bound=_Lock)


def hold_across_fork(lock: _L) -> _L:
    """Have the forking thread hold ``lock`` across every later ``os.fork`` (see above);
    ``lock`` itself."""
    with _registry_lock:
        _locks[:] = [ref for ref in _locks if ref() is not None]
        _locks.append(weakref.ref(lock))
    return lock


def _before_fork() -> None:
    """Take the registry's lock and then every registered lock, in registration order."""
    _registry_lock.acquire()
    for ref in _locks:
        lock = ref()
        if lock is not None:
            lock.acquire()
            _taken.append(lock)


def _after_fork() -> None:
    """Release what :func:`_before_fork` took, in reverse order (parent and child alike)."""
    while _taken:
        _taken.pop().release()
    _registry_lock.release()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
