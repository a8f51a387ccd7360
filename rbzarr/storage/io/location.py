"""From a path or URL to a place to read and write: the one resolver.

A :class:`Location` pairs an fsspec filesystem with a root path inside it.  It is the only
way rbzarr builds child paths: :meth:`Location.child` accepts plain names only and rejects
anything that could leave the root (``..``, separators, absolute parts, NUL, control
characters; see :func:`~rbzarr.storage.io.names.safe_name`).  On the local disk it also refuses
a path through a symbolic link inside the store (the root itself may be one), unless the
location was opened with ``follow_links=True``: a store made by someone else cannot point
rbzarr at files outside it.  Every call that touches the backend goes through
:func:`~rbzarr.storage.io.backends.translate_errors`, so a failed backend reads as
:class:`~rbzarr.errors.StorageUnavailableError`, never as "missing".
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from rbzarr.errors import StoreExistsError, UnsafePathError
from rbzarr.storage.io.backends import (
    bound_retries,
    bucket_of,
    check_storage_options,
    missing_bucket_message,
    translate_errors,
    with_s3_defaults,
)
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.files import make_directories, read_regular, write_file
from rbzarr.storage.io.names import safe_name

if TYPE_CHECKING:
    from zarr.abc.store import Store

__all__ = ["Location"]


def link_message(path: str, top: str) -> str:
    """Why a path through a symbolic link inside a store is refused, and the opt-in."""
    return (
        f"{path} is a symbolic link inside the store {top}: rbzarr does not follow links "
        "inside a store (they could reach files outside it); for a trusted store whose "
        "folders you linked on purpose, pass follow_links=True (open_buffer, load_checkpoint) "
        "or --follow-links (the rbzarr command)"
    )


def _same_filesystem(one: fsspec.AbstractFileSystem, other: fsspec.AbstractFileSystem) -> bool:
    """Whether two instances reach the same storage the same way (one can copy for both)."""
    return type(one) is type(other) and one.storage_options == other.storage_options


def _missing_client(url: str, exc: ImportError) -> str:
    """What to install for a URL whose fsspec filesystem is missing."""
    protocol = fsspec.core.split_protocol(url)[0]
    if protocol in ("s3", "s3a"):
        return f"{url}: S3 needs s3fs, in rbzarr's s3 extra: pip install 'rbzarr[s3]'"
    return f"{url}: {exc}"


@dataclass(frozen=True)
class Location:
    """A root path on an fsspec filesystem.

    Build one with :meth:`from_url`; :meth:`child` is the only way to go below it.  Every
    method taking ``*names`` raises :class:`~rbzarr.errors.UnsafePathError` for a name that
    could leave the root, and :class:`~rbzarr.errors.StorageUnavailableError` when the
    backend fails.

    Parameters
    ----------
    url
        The location as users name it (an absolute path for local ones), no trailing ``/``.
    fs
        The fsspec filesystem.
    path
        The root's path inside ``fs``.
    storage_options
        The fsspec options ``fs`` was opened with (a forked child reopens with them).
    durable
        Whether writes must survive a machine crash once they return: local files (and
        their directories) are ``fsync``'d; an object store's PUT is durable as it is.
        :meth:`with_durable` gives such a location; children inherit it.
    follow_links
        Local only: follow symbolic links below :attr:`top` (else a path through one raises
        :class:`~rbzarr.errors.UnsafePathError`).
    top
        The store's root path, below which links are refused (``""``: :attr:`path`).
    """

    url: str
    fs: fsspec.AbstractFileSystem = field(repr=False, compare=False)
    path: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    durable: bool = field(default=False, repr=False, compare=False)
    follow_links: bool = field(default=False, repr=False, compare=False)
    top: str = field(default="", repr=False, compare=False)

    @classmethod
    def from_url(
        cls,
        url: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
        *,
        follow_links: bool = False,
    ) -> Location:
        """Resolve a local path or a ``file://``, ``memory://`` or ``s3://`` URL; creates nothing.

        S3 URLs get :data:`~rbzarr.storage.io.backends.S3_DEFAULTS` for the options not given; a
        :class:`Location` is returned as it is.  An empty URL or an unknown protocol raises
        ``ValueError``.  ``follow_links`` lets local paths go through symbolic links inside
        the store (the root itself may always be one): only for a trusted store.
        """
        if isinstance(url, Location):
            return url
        text = os.fspath(url)
        if not text:
            raise ValueError("empty location: expected a local path or an fsspec URL")
        check_storage_options(text, storage_options or {})
        options = with_s3_defaults(text, storage_options or {})
        with translate_errors(text, "opening"):
            try:
                fs, path = fsspec.core.url_to_fs(text, **options)
            except ImportError as exc:
                raise ImportError(_missing_client(text, exc)) from exc
        bound_retries(fs)
        if isinstance(fs, LocalFileSystem):
            path = os.path.abspath(path)
            text = path
        return cls(
            url=text.rstrip("/") or text,
            fs=fs,
            path=path.rstrip("/") or path,
            storage_options=options,
            follow_links=follow_links,
        )

    @property
    def is_local(self) -> bool:
        """Whether this is the local filesystem (where rename is atomic)."""
        return isinstance(self.fs, LocalFileSystem)

    def _deadline(self, nbytes: int = 0) -> dict[str, float]:
        """The deadline keyword of a call on ``fs`` (:func:`deadline_options`)."""
        return deadline_options(self.fs, nbytes)

    def with_durable(self, durable: bool = True) -> Location:
        """This location, its writes durable (or not): see ``durable``."""
        return replace(self, durable=durable)

    def child(self, *names: str) -> Location:
        """The location ``names`` below this one; each must be a plain name (:func:`safe_name`),
        and locally none a symbolic link (unless :attr:`follow_links`)."""
        for name in names:
            safe_name(name, self.url)
        suffix = "/".join(names)
        found = Location(
            url=f"{self.url}/{suffix}",
            fs=self.fs,
            path=f"{self.path}/{suffix}",
            storage_options=self.storage_options,
            durable=self.durable,
            follow_links=self.follow_links,
            top=self.top or self.path,
        )
        if names and self.is_local and not self.follow_links:
            # This location's own path was checked when it was made: only the new parts.
            found.refuse_links(self.path)
        return found

    def without_links(self) -> Location:
        """This location, refusing paths through symbolic links (what a repair writes through)."""
        return dataclasses.replace(self, follow_links=False)

    def refuse_links(self, checked: str = "") -> None:
        """Raise :class:`UnsafePathError` if a local path component below :attr:`top` (or
        below ``checked``, a prefix known to be free of links) down to this location is a
        symbolic link; a missing one ends the check."""
        top = self.top or self.path
        current = checked or top
        for part in self.path[len(current) :].strip("/").split("/"):
            if not part:
                continue
            current = f"{current}/{part}"
            try:
                mode = os.lstat(current).st_mode
            except OSError:
                return
            if stat.S_ISLNK(mode):
                raise UnsafePathError(link_message(current, top))

    def join(self, *names: str) -> str:
        """The filesystem path of ``names`` below the root (none: the root's path)."""
        return self.child(*names).path if names else self.path

    def exists(self, *names: str) -> bool:
        """Whether a file or directory is at the root or ``names`` below it."""
        target = self.join(*names)
        with translate_errors(self.url, "checking"):
            if self.is_local:  # one stat, as fsspec's local filesystem does
                return os.path.exists(target)
            return bool(self.fs.exists(target, **self._deadline()))

    def absence(self) -> str:
        """Why no store is here, with the fix: a missing bucket or folder, a file, or neither."""
        with translate_errors(self.url, "checking"):
            if not self.is_local:
                bucket = bucket_of(self.url)
                if bucket and not self.fs.exists(bucket, **self._deadline()):
                    return missing_bucket_message(bucket)
                return "not an rbzarr or RLinf store"
            found = self.path  # the nearest part of the path that exists
            while not os.path.lexists(found) and os.path.dirname(found) != found:
                found = os.path.dirname(found)
            if os.path.isfile(found):
                return (
                    f"{found} is a file, expected a store folder (the save_path of "
                    "save_checkpoint or an auto_save_path)"
                )
            if found != self.path:
                return f"no folder {self.path}: check the path"
        return "not an rbzarr or RLinf store"

    def read_bytes(self, *names: str) -> bytes:
        """The bytes of a file below the root (``FileNotFoundError`` names a missing one); a
        local FIFO, socket or device there is :class:`UnsafePathError`, never opened."""
        target = self.join(*names)
        with translate_errors(self.url, "reading"):
            try:
                if self.is_local:  # never a FIFO, socket or device
                    return read_regular(target)
                return bytes(self.fs.cat_file(target, **self._deadline()))
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.url}/{'/'.join(names)} does not exist") from None

    def write_bytes(self, data: bytes, *names: str) -> None:
        """Write a file below the root atomically: readers see the old or the new bytes.

        Locally that is a temporary sibling renamed into place (parent directories created),
        ``fsync``'d with its directory when the location is ``durable``; on object stores a
        single PUT.
        """
        target = self.join(*names)
        with translate_errors(self.url, "writing"):
            if not self.is_local:
                self.fs.pipe_file(target, data, **self._deadline(len(data)))
                return
            try:  # the parent is there but for a file's first write in its folder
                write_file(target, [data], durable=self.durable)
            except FileNotFoundError:
                make_directories(os.path.dirname(target), self.durable)
                write_file(target, [data], durable=self.durable)

    def delete(self, *names: str) -> None:
        """Remove a file or directory tree below the root (none: the root); missing is fine."""
        target = self.join(*names)
        with translate_errors(self.url, "deleting"):
            if self.is_local:
                try:  # a file (a link is removed, never followed): one call
                    os.remove(target)
                    return
                except FileNotFoundError:
                    return
                except (IsADirectoryError, PermissionError):
                    pass  # a folder (Linux says EISDIR, macOS EPERM): its tree, below
            if self.fs.exists(target, **self._deadline()):
                self.fs.rm(target, recursive=True, **self._deadline())

    def tree_bytes(self, *names: str) -> int:
        """Bytes of the files below ``names`` (or of the file itself), in one listing; 0
        when nothing is there."""
        target = self.join(*names)
        with translate_errors(self.url, "listing"):
            try:
                found = self.fs.find(target, detail=True, **self._deadline())
            except (FileNotFoundError, NotADirectoryError):
                return 0
        return sum(int(info.get("size") or 0) for info in found.values())

    def list_names(self, *names: str) -> list[str]:
        """Names directly below the root (or ``names``), sorted; none for a missing directory."""
        target = self.join(*names)
        with translate_errors(self.url, "listing"):
            try:
                if self.is_local:  # one call, no object per entry
                    return sorted(os.listdir(target))
                # Never a cached listing: a reader must see what writers added since.
                entries = self.fs.ls(target, detail=False, refresh=True, **self._deadline())
            except (FileNotFoundError, NotADirectoryError):
                return []
        return sorted(PurePosixPath(str(entry)).name for entry in entries)

    def list_files(self, *names: str) -> list[str]:
        """Every file below ``names`` (or the file itself), ``/``-joined relative to it, sorted."""
        target = self.join(*names).rstrip("/")
        with translate_errors(self.url, "listing"):
            found = [str(path).rstrip("/") for path in self.fs.find(target, **self._deadline())]
        prefix = f"{target}/"
        return sorted(
            path.removeprefix(prefix) if path != target else PurePosixPath(path).name
            for path in found
        )

    def check_tree(self) -> None:
        """Locally, refuse (:class:`UnsafePathError`) a tree holding anything but folders and
        regular files: a symbolic link (unless :attr:`follow_links`), a FIFO, a device."""
        if not self.is_local:
            return
        for current, folders, files in os.walk(self.path, followlinks=self.follow_links):
            for name in [*folders, *files]:
                path = os.path.join(current, name)
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode) and not self.follow_links:
                    raise UnsafePathError(link_message(path, self.top or self.path))
                if not (stat.S_ISLNK(mode) or stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    raise UnsafePathError(
                        f"{path}: neither a folder nor a regular file; a store holds only those"
                    )

    def copy_into(self, destination: Location) -> None:
        """Copy the file or tree here to ``destination``; :class:`StoreExistsError` if it exists.

        fsspec moves the bytes: ``copy`` within one filesystem, ``put`` / ``get`` between
        the local disk and another one, a bulk ``cat`` and ``pipe`` otherwise.  Nothing at
        ``destination`` is ever replaced or deleted.  Each remote call has a deadline for
        the bytes it moves (:func:`~rbzarr.storage.io.deadlines.deadline_options`): the size
        comes from the one listing that finds the files.
        """
        if destination.exists():
            raise StoreExistsError(f"{destination.url} already exists; a copy never overwrites")
        self.refuse_links()
        self.check_tree()
        with translate_errors(f"{self.url} -> {destination.url}", "copying"):
            recursive = self.fs.isdir(self.path, **self._deadline())
            sizes = self._sizes(recursive)
            nbytes = sum(sizes.values())
            if self.fs is destination.fs or _same_filesystem(self.fs, destination.fs):
                if self.is_local:
                    self.fs.makedirs(os.path.dirname(destination.path), exist_ok=True)
                self.fs.copy(
                    self.path, destination.path, recursive=recursive, **self._deadline(nbytes)
                )
            elif self.is_local:
                destination.fs.put(
                    self.path,
                    destination.path,
                    recursive=recursive,
                    **deadline_options(destination.fs, nbytes),
                )
            elif destination.is_local:
                os.makedirs(os.path.dirname(destination.path), exist_ok=True)
                self.fs.get(
                    self.path, destination.path, recursive=recursive, **self._deadline(nbytes)
                )
            else:
                # Two remote filesystems: one concurrent bulk read, one bulk write.
                found = self.fs.cat(list(sizes), on_error="raise", **self._deadline(nbytes))
                contents = found if isinstance(found, dict) else {self.path: found}
                root = self.path.rstrip("/")
                destination.fs.pipe(
                    {
                        destination.path + str(path)[len(root) :]: data
                        for path, data in contents.items()
                    },
                    **deadline_options(destination.fs, nbytes),
                )

    def _sizes(self, recursive: bool) -> dict[str, int]:
        """The size of every file here (the file itself, or the tree's), in one listing."""
        if not recursive:
            return {self.path: int(self.fs.size(self.path, **self._deadline()))}
        found = self.fs.find(self.path, detail=True, **self._deadline())
        return {str(path): int(info.get("size") or 0) for path, info in found.items()}

    def zarr_store(self, read_only: bool = False) -> Store:
        """A new zarr store rooted here: locally a ``LocalStore`` reading regular files only
        (:class:`~rbzarr.storage.io.local_store.RegularFileStore`), else ``FsspecStore``."""
        # zarr loads only when a store is opened (`rbzarr info` / `ls` answer without it)
        import zarr.storage  # noqa: PLC0415

        from rbzarr.storage.io.local_store import RegularFileStore  # noqa: PLC0415

        if self.is_local:
            return RegularFileStore(self.path, read_only=read_only)
        store = zarr.storage.FsspecStore.from_url(
            self.url, storage_options=dict(self.storage_options), read_only=read_only
        )
        bound_retries(store.fs)
        return store
