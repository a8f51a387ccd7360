"""Local files written whole, atomically or in place, and durably when asked.

Reading a store's file goes through :func:`open_regular` (or :func:`read_regular`): a FIFO,
socket or device where a file is expected is refused before it is opened (a FIFO would
block the reader forever, a device could be anything); a file swapped for one between the
check and the open is caught on the open descriptor, opened without blocking.

An atomic write goes through a temporary sibling (:func:`~rbzarr.storage.io.names.temporary_name`)
renamed onto the target, so a reader sees the old bytes or the new ones.  A durable write
also survives a machine crash once it returns: the file is ``fsync``'d before it is closed
(and renamed), then its directory, so that the new name is on disk too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rbzarr.errors import UnsafePathError
from rbzarr.storage.io.names import temporary_name

__all__ = [
    "commit_file",
    "create_file",
    "make_directories",
    "open_regular",
    "read_regular",
    "sync_directory",
    "sync_paths",
    "sync_tree",
    "write_file",
    "write_parts",
]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
# The most buffers one writev takes (IOV_MAX; POSIX guarantees at least 16); 1 where there
# is no writev (Windows): one write per part.
_IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024)) if hasattr(os, "writev") else 1
# The most bytes one write or writev asks for.  The kernel sizes the page-cache folios it
# allocates by a write's length, and on this host (a VM that hands free blocks back to its
# host) a large folio meets memory the host took back far more often than a small one, each
# such page costing a host fault: 8 MiB writes ran at ~100 MB/s where 1 MiB ones ran at
# 3.4-4.1 GB/s, and 1 MiB ones in turn swung between 0.28 and 4.3 GB/s into memory just
# freed where 64 KiB ones held 2.7-4.0 GB/s (6 alternating rounds of 88 MB).  A call costs
# ~2 us: 160 calls for a 10 MiB shard.  It also keeps writev under INT_MAX, which os.write
# clamps to and os.writev does not (a shard's many frames can sum past it).
WRITEV_BYTES = 64 << 10
# Concurrent fsyncs: a journaling filesystem commits them together (measured on ext4 here:
# ten fsyncs of a small trajectory took 36 ms one after the other, 2-4 ms at once).
SYNC_THREADS = 16
_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked child has no threads


def _renew_pool_lock() -> None:
    """A forked child's lock: another thread of the parent may have held the old one."""
    global _pool_lock  # noqa: PLW0603 - the module's one lock, replaced whole
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_pool_lock)


_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _refuse_special(mode: int, path: str) -> None:
    """Refuse anything but a regular file: a folder as ``IsADirectoryError`` (missing for a
    reader), a FIFO, socket or device as :class:`UnsafePathError`."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    raise UnsafePathError(
        f"{path}: neither a folder nor a regular file (a FIFO, socket or device); a store "
        "holds only those, and rbzarr does not open anything else"
    )


def open_regular(path: str) -> int:
    """A blocking read-only descriptor of regular file ``path``.

    Anything else is refused before it is opened (``stat``); the open itself does not block
    and its descriptor is checked again, so a file swapped for a FIFO in between is refused
    too.  ``FileNotFoundError`` for a missing file, ``IsADirectoryError`` for a folder,
    :class:`~rbzarr.errors.UnsafePathError` for a FIFO, socket or device.
    """
    _refuse_special(os.stat(path).st_mode, path)
    fd = os.open(path, _READ)
    try:
        _refuse_special(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, start: int = 0, end: int | None = None) -> bytes:
    """Bytes ``start`` to ``end`` (``None``: the end) of regular file ``path``
    (:func:`open_regular`); a negative ``start`` counts from the end."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        first = max(0, size + start) if start < 0 else min(start, size)
        last = size if end is None else max(first, min(end, size))
        parts = []
        while first < last:
            part = os.pread(fd, last - first, first)
            if not part:
                break
            parts.append(part)
            first += len(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def write_file(
    path: str, parts: Iterable[Any], *, atomic: bool = True, durable: bool = False
) -> None:
    """Write ``parts`` (byte-like, written one after the other uncopied) to ``path``.

    Parameters
    ----------
    path
        The file; its directory must exist.
    parts
        The bytes, in pieces.
    atomic
        Write a temporary sibling and rename it onto ``path``; otherwise ``path`` is
        written in place (for files no reader opens before a later commit marker).
    durable
        ``fsync`` the file before closing it and, after an atomic rename, its directory.
        A file written in place leaves its directory to the caller
        (:func:`sync_directory`), which may hold many such files.
    """
    target = temporary_name(path) if atomic else path
    written = False
    try:
        fd = os.open(target, _CREATE, 0o666)
        try:
            write_parts(fd, parts)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if atomic:
            os.replace(target, path)
        written = True
    finally:
        if atomic and not written:
            with contextlib.suppress(OSError):  # not made, or the failure's own cause
                os.remove(target)
    if atomic and durable:
        sync_directory(os.path.dirname(path))


def create_file(path: str, parts: Iterable[Any], *, durable: bool = False) -> bool:
    """Write ``path`` whole unless a file is there already, which is never replaced: a
    temporary sibling hard-linked into place (a link refuses an existing name), then removed;
    where links are refused, renamed into place after a check (a race can replace then).
    Whether this call created it."""
    temporary = temporary_name(path)
    try:
        write_file(temporary, parts, atomic=False, durable=durable)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links on this filesystem
            if os.path.lexists(path):
                return False
            os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)
    if durable:
        sync_directory(os.path.dirname(path))
    return True


def write_parts(fd: int, parts: Iterable[Any]) -> None:
    """Write ``parts`` (byte-like) to ``fd`` in order, each call at most :data:`WRITEV_BYTES`:
    ``write`` calls for one part, else ``writev`` calls of up to :data:`_IOV_MAX` parts (a
    shard of many small frames is one call, not one per frame)."""
    views = [memoryview(part).cast("B") for part in parts]
    if len(views) == 1 or _IOV_MAX == 1:
        for part in views:
            left = part
            while left.nbytes:
                left = left[os.write(fd, left[:WRITEV_BYTES]) :]
        return
    first = 0
    while first < len(views):
        batch, room = [], WRITEV_BYTES
        for view in views[first : first + _IOV_MAX]:
            batch.append(view if view.nbytes <= room else view[:room])
            room -= batch[-1].nbytes
            if not room:
                break
        written = os.writev(fd, batch)
        # Past the parts written whole; a part written in part goes on from where it ended.
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:
            views[first] = views[first][written:]


def commit_file(
    path: str, parts: Iterable[Any], *, durable: bool = False, synced: Sequence[str] = ()
) -> None:
    """Write ``path`` atomically, as the commit marker of the files ``synced`` written before.

    With ``durable``, the paths of ``synced`` (files and directories) and the new bytes are
    ``fsync``'d together before the rename, then ``path``'s directory: once this returns,
    the marker and everything it commits survive a machine crash, and a crash before never
    leaves the marker without them.
    """
    temp = temporary_name(path)
    try:
        write_file(temp, parts, atomic=False)
        if durable:
            sync_paths([*synced, temp])
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # not written, or the failure's own cause
            os.remove(temp)
        raise
    if durable:
        sync_directory(os.path.dirname(path))


def sync_paths(paths: Sequence[str]) -> None:
    """``fsync`` files and directories ``paths``, concurrently."""
    if len(paths) < 2:
        for path in paths:
            _sync(path)
        return
    with _pool_lock:
        pool = _pools.get(os.getpid())
        if pool is None:
            _pools.clear()
            pool = _pools[os.getpid()] = ThreadPoolExecutor(
                SYNC_THREADS, thread_name_prefix="rbzarr-sync"
            )
    for future in [pool.submit(_sync, path) for path in paths]:
        future.result()


def _sync(path: str) -> None:
    """``fsync`` one file or directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: str, durable: bool = False) -> None:
    """Create directory ``path`` and its missing parents; ``durable`` syncs the parent of
    each one created, so the new names survive a machine crash."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        if os.path.lexists(directory) and not os.path.isdir(directory):
            # A file where a folder must be: no retry can cure it (makedirs says EEXIST).
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
        os.makedirs(directory, exist_ok=True)
        if durable:
            sync_directory(os.path.dirname(directory))


def sync_tree(path: str) -> None:
    """``fsync`` every file and directory below directory ``path``, then ``path`` and its
    parent: for trees written by others (zarr's ``LocalStore`` never syncs)."""
    found = [os.path.dirname(path)]
    for folder, _, names in os.walk(path):
        found.append(folder)
        found.extend(os.path.join(folder, name) for name in names)
    sync_paths(found)


def sync_directory(path: str) -> None:
    """``fsync`` directory ``path``, so the names created in it survive a machine crash."""
    _sync(path)
