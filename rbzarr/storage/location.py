"""From a path or URL to a place to read and write: the one resolver.

A :class:`Location` pairs an fsspec filesystem with a root path inside it.  It is the only
way rbzarr builds child paths: :meth:`Location.child` accepts plain names only and rejects
anything that could leave the root (``..``, separators, absolute parts, NUL).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import fsspec
import zarr
import zarr.abc.store
import zarr.storage
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import Store

from rbzarr.errors import StorageUnavailableError, UnsafePathError

__all__ = ["Location", "safe_name", "translate_errors"]

_FORBIDDEN = ("/", "\\", "\x00")


def safe_name(name: str, root: str = "") -> str:
    """Return ``name`` if it is a plain file name, else raise :class:`UnsafePathError`."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(ch in name for ch in _FORBIDDEN)
        or PurePosixPath(name).is_absolute()
    ):
        raise UnsafePathError(f"unsafe name {name!r}: it must be a plain file name inside {root!r}")
    return name


# Transport failures of optional backends (s3fs raises botocore's after its own retries;
# aiohttp-based filesystems raise aiohttp's).  None of them derives from OSError.
_TRANSPORT_ERRORS = (("botocore.exceptions", "HTTPClientError"), ("aiohttp", "ClientError"))


@functools.cache
def _unavailable_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the backend failed", not "the thing is missing"."""
    found: list[type[BaseException]] = [OSError, TimeoutError, ConnectionError]
    for module_name, name in _TRANSPORT_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, name))
    return tuple(found)


@contextlib.contextmanager
def translate_errors(url: str, action: str) -> Iterator[None]:
    """Turn backend failures into :class:`StorageUnavailableError` naming ``url``.

    ``FileNotFoundError`` (a value: "missing") and rbzarr's own errors pass through.  Besides
    ``OSError`` and timeouts, connection failures of botocore (``EndpointConnectionError``,
    ``ConnectionClosedError``, read/connect timeouts) and aiohttp are translated, so an
    unreachable object store never reads as "empty" or "not found".
    """
    try:
        yield
    except (FileNotFoundError, StorageUnavailableError, UnsafePathError):
        raise
    except _unavailable_errors() as exc:
        raise StorageUnavailableError(f"{action} {url!r} failed: {exc}") from exc


@dataclass(frozen=True)
class Location:
    """A root path on an fsspec filesystem."""

    url: str
    fs: fsspec.AbstractFileSystem = field(repr=False, compare=False)
    path: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_url(
        cls,
        url: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Location:
        """Resolve a local path, ``file://``, ``memory://`` or ``s3://`` URL."""
        if isinstance(url, Location):
            return url
        text = os.fspath(url)
        if not text:
            raise ValueError("empty location: expected a local path or an fsspec URL")
        options = dict(storage_options or {})
        fs, path = fsspec.core.url_to_fs(text, **options)
        if isinstance(fs, LocalFileSystem):
            path = os.path.abspath(path)
            text = path
        return cls(
            url=text.rstrip("/") or text,
            fs=fs,
            path=path.rstrip("/") or path,
            storage_options=options,
        )

    @property
    def is_local(self) -> bool:
        """True on the local filesystem (where rename is atomic)."""
        return isinstance(self.fs, LocalFileSystem)

    def child(self, *names: str) -> Location:
        """The location ``names`` below this one; each name must be a plain name."""
        for name in names:
            safe_name(name, self.url)
        suffix = "/".join(names)
        return Location(
            url=f"{self.url}/{suffix}",
            fs=self.fs,
            path=f"{self.path}/{suffix}",
            storage_options=self.storage_options,
        )

    def join(self, *names: str) -> str:
        """The filesystem path of ``names`` below the root (each a plain name)."""
        return self.child(*names).path if names else self.path

    def exists(self, *names: str) -> bool:
        """Whether the root (or ``names`` below it) exists."""
        with translate_errors(self.url, "checking"):
            return bool(self.fs.exists(self.join(*names)))

    def read_bytes(self, *names: str) -> bytes:
        """The bytes of a file below the root; ``FileNotFoundError`` names it if missing."""
        target = self.join(*names)
        with translate_errors(self.url, "reading"):
            try:
                return bytes(self.fs.cat_file(target))
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.url}/{'/'.join(names)} does not exist") from None

    def write_bytes(self, data: bytes, *names: str) -> None:
        """Write a file below the root atomically: readers see the old or the new bytes.

        Locally that is a temporary file renamed into place; on object stores a single PUT.
        """
        target = self.join(*names)
        with translate_errors(self.url, "writing"):
            if not self.is_local:
                self.fs.pipe_file(target, data)
                return
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temp = f"{target}.tmp-{uuid.uuid4().hex}"
            try:
                with open(temp, "wb") as handle:
                    handle.write(data)
                os.replace(temp, target)
            finally:
                if os.path.exists(temp):
                    os.remove(temp)

    def delete(self, *names: str) -> None:
        """Remove a file or a directory tree below the root; missing is not an error."""
        target = self.join(*names)
        with translate_errors(self.url, "deleting"):
            if self.fs.exists(target):
                self.fs.rm(target, recursive=True)

    def list_names(self, *names: str) -> list[str]:
        """Names directly below the root (or below ``names``); empty if missing."""
        target = self.join(*names)
        with translate_errors(self.url, "listing"):
            try:
                entries = self.fs.ls(target, detail=False)
            except FileNotFoundError:
                return []
        return sorted(PurePosixPath(str(entry)).name for entry in entries)

    def copy_tree(self, destination: Location) -> None:
        """Copy everything below this root to ``destination`` (object level, no decoding)."""
        with translate_errors(self.url, "copying"):
            if self.fs is destination.fs or type(self.fs) is type(destination.fs):
                destination.fs.makedirs(os.path.dirname(destination.path) or "/", exist_ok=True)
                self.fs.copy(self.path, destination.path, recursive=True)
                return
            for source_path in self.fs.find(self.path):
                relative = source_path[len(self.path) :].lstrip("/")
                destination.fs.pipe_file(
                    f"{destination.path}/{relative}", self.fs.cat_file(source_path)
                )

    def zarr_store(self, read_only: bool = False) -> Store:
        """A zarr store rooted here: ``LocalStore`` locally, ``FsspecStore`` elsewhere."""
        if self.is_local:
            return zarr.storage.LocalStore(self.path, read_only=read_only)
        return zarr.storage.FsspecStore.from_url(
            self.url, storage_options=dict(self.storage_options), read_only=read_only
        )
