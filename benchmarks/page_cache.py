"""Truly cold reads: evict a store's pages from the page cache before a timed batch.

Neither ``drop_caches`` nor ``posix_fadvise`` drops memory-mapped pages, so this process's
mappings of the store are first released with ``madvise(MADV_DONTNEED)``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["evict", "process_read_bytes"]

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
MADV_DONTNEED = 4  # Linux


def evict(roots: Iterable[str | os.PathLike[str]], whole_cache: bool = True) -> str:
    """Evict the cached pages of every file below ``roots``; return the method used."""
    folders = [os.path.realpath(root) for root in roots]
    unmapped = _release_mappings(folders)
    os.sync()
    suffix = "+madvise" if unmapped else ""
    if whole_cache:
        try:
            DROP_CACHES.write_text("1\n")
        except OSError:
            pass
        else:
            return "drop_caches" + suffix
    for root in folders:
        for folder, _, names in os.walk(root):
            for name in names:
                _fadvise_dontneed(os.path.join(folder, name))
    return "posix_fadvise" + suffix


def _release_mappings(roots: list[str]) -> int:
    """``madvise(MADV_DONTNEED)`` every mapping of this process of a file below ``roots``; return
    how many there were (0 where ``/proc/self/maps`` is unavailable).
    """
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    released = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        if not any(path.startswith(root + os.sep) for root in roots):
            continue
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED)
        released += 1
    return released


def _fadvise_dontneed(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def process_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage so far (Linux ``/proc/self/io``
    ``read_bytes``: page-cache misses, read-ahead included); ``None`` where unavailable.
    """
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "read_bytes":
            return int(value)
    return None
