"""The writability probe: refuse a store path that can never be written, before any write.

A local path is probed by creating and removing a temporary file (see
:func:`~rbzarr.storage.io.names.temporary_name`) in it, or, when it does not exist yet, in its
nearest existing ancestor (nothing is created that stays).  Object stores are not probed
here: the writer's claim (:mod:`rbzarr.storage.index.claims`), a PUT made at construction
anyway, is their probe, and later permanent errors are classified when a write meets them
(:func:`~rbzarr.storage.io.backends.permanent_cause`).
"""

from __future__ import annotations

import errno
import os

from rbzarr.errors import StoreExistsError, StoreNotWritableError
from rbzarr.storage.io.backends import translate_errors
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import temporary_name

__all__ = ["check_store_folder", "check_writable"]


def check_store_folder(location: Location, *, is_store: bool) -> None:
    """Refuse an ``auto_save_path`` that is a file (not asked where ``is_store``: a store
    was found there, so it is a folder), or that can never be written."""
    if not is_store:
        with translate_errors(location.url, "opening"):
            is_file = location.fs.isfile(location.path, **deadline_options(location.fs))
        if is_file:
            raise StoreExistsError(
                f"auto_save_path {location.url} is a file: it must be a folder (new, or "
                "holding a store to append to); choose another auto_save_path"
            )
    check_writable(location)


def check_writable(location: Location) -> None:
    """Raise :class:`StoreNotWritableError` if files cannot be created at a local ``location``."""
    if not location.is_local:
        return
    probe_dir = location.path
    while not os.path.exists(probe_dir):
        parent = os.path.dirname(probe_dir)
        if parent == probe_dir:
            break
        probe_dir = parent
    probe = temporary_name(os.path.join(probe_dir, ".rbzarr-probe"))
    try:
        if not os.path.isdir(probe_dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", probe_dir)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise StoreNotWritableError(
            f"auto_save_path {location.url} cannot be written: {exc.strerror or exc} "
            f"({probe_dir}); choose another auto_save_path or fix its permissions"
        ) from exc
