"""Truly cold reads: evict a store's pages from the page cache before a timed batch.

As root, ``sync; echo 1 > /proc/sys/vm/drop_caches`` drops every clean cached page of the
machine.  Elsewhere :func:`os.posix_fadvise` with ``POSIX_FADV_DONTNEED`` on each file of the
store asks the kernel to drop that file's pages.  Either way, pages a process keeps memory
mapped may stay cached: what :func:`process_read_bytes` counts is what really came from disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["evict", "process_read_bytes"]

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def evict(roots: Iterable[str | os.PathLike[str]], whole_cache: bool = True) -> str:
    """Evict the cached pages of every file below ``roots``; return the method used.

    Parameters
    ----------
    roots
        Directories whose files must be read from disk next time.
    whole_cache
        Try ``drop_caches`` first (root only); ``False`` goes straight to
        ``posix_fadvise`` (smoke runs on a shared machine).

    Returns
    -------
    str
        ``"drop_caches"`` (the whole page cache, as root) or ``"posix_fadvise"`` (the
        files below ``roots`` only).
    """
    os.sync()
    if whole_cache:
        try:
            DROP_CACHES.write_text("1\n")
        except OSError:
            pass
        else:
            return "drop_caches"
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                _fadvise_dontneed(os.path.join(folder, name))
    return "posix_fadvise"


def _fadvise_dontneed(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def process_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage so far (Linux ``/proc/self/io``
    ``read_bytes``: page-cache misses, read-ahead included); ``None`` where unavailable."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "read_bytes":
            return int(value)
    return None
