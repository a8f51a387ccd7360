"""From a path or URL to a place to read and write: the one resolver, and the one boundary.

A :class:`Location` pairs an fsspec filesystem with a root path inside it.  It is the only
way rbzarr builds child paths: :meth:`Location.child` accepts plain names only and rejects
anything that could leave the root (``..``, separators, absolute parts, NUL).

It is also where backend failures become rbzarr's: :func:`translate_errors` turns anything
that means "the storage failed" into :class:`~rbzarr.errors.StorageUnavailableError` naming
the URL (the backend's error is its ``__cause__``), and :data:`S3_DEFAULTS` bounds how long
an unreachable S3 endpoint can stall a call (see "S3" in the README to tune it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import fsspec
import zarr.storage
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import Store

from rbzarr.errors import RbzarrError, StorageUnavailableError, StoreExistsError, UnsafePathError

__all__ = [
    "S3_DEFAULTS",
    "Location",
    "backend_errors",
    "is_temporary_name",
    "safe_name",
    "translate_errors",
    "with_s3_defaults",
]

# Temporary files of an interrupted atomic write: ours (``<name>.tmp-<hex>``) and those of
# zarr's LocalStore (``<stem>.<hex>.partial``).
TEMP_SUFFIX = ".tmp-"
_TEMPORARY_NAME = re.compile(r".+\.tmp-[0-9a-f]{32}|.+\.[0-9a-f]{32}\.partial")


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is a leftover temporary file of an interrupted atomic write."""
    return _TEMPORARY_NAME.fullmatch(name) is not None


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


# botocore's own settings for every S3 location unless the caller sets them: give up
# connecting after 5 s and waiting for a response after 20 s, 2 attempts per request.
# s3fs retries a failed request itself (S3_RETRIES times here); the product bounds a call.
S3_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 20,
    "retries": {"max_attempts": 2, "mode": "standard"},
}
S3_RETRIES = 3
_S3_PROTOCOLS = ("s3", "s3a")

# Transport failures of optional backends, none of which derives from OSError: botocore's
# (connection, timeouts, credentials) and aiohttp's.
_TRANSPORT_ERRORS = (("botocore.exceptions", "BotoCoreError"), ("aiohttp", "ClientError"))
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")


def with_s3_defaults(url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`S3_DEFAULTS` filled into ``config_kwargs`` for S3 URLs.

    Keys the caller sets win, one by one; other URLs get ``options`` unchanged.

    Parameters
    ----------
    url
        The location's URL.
    options
        The caller's fsspec storage options.

    Returns
    -------
    dict
        The options to open the filesystem with.
    """
    merged = dict(options)
    protocol = fsspec.core.split_protocol(url)[0]
    if protocol in _S3_PROTOCOLS:
        merged["config_kwargs"] = {**S3_DEFAULTS, **dict(merged.get("config_kwargs") or {})}
    return merged


def _bound_retries(fs: fsspec.AbstractFileSystem) -> None:
    """Cap s3fs's own retries of a failed request at :data:`S3_RETRIES` (5 by default).

    s3fs takes no constructor argument for it: it is an attribute of the instance.
    """
    if type(fs).__name__ == "S3FileSystem":
        fs.retries = min(int(getattr(fs, "retries", S3_RETRIES)), S3_RETRIES)


def _same_filesystem(one: fsspec.AbstractFileSystem, other: fsspec.AbstractFileSystem) -> bool:
    """Whether two instances reach the same storage the same way (one can copy for both)."""
    return type(one) is type(other) and one.storage_options == other.storage_options


@functools.cache
def backend_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the backend failed", not "the thing is missing".

    Returns
    -------
    tuple of exception types
        ``OSError``, timeouts, and the transport errors of the installed backends
        (botocore's, aiohttp's).  ``FileNotFoundError`` is an ``OSError`` too: callers
        that treat "missing" as a value catch it first.
    """
    found: list[type[BaseException]] = [OSError, TimeoutError, ConnectionError]
    for module_name, name in _TRANSPORT_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, name))
    return tuple(found)


def _describe_failure(exc: BaseException) -> str:
    """The backend error in one line, with advice where the cause is a usual one."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ in _CREDENTIAL_ERRORS:
        return (
            f"no usable credentials ({text}); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, pass storage_options key= and secret=, or anon=True for a "
            "public bucket"
        )
    return text


@contextlib.contextmanager
def translate_errors(url: str, action: str) -> Iterator[None]:
    """Turn backend failures into :class:`StorageUnavailableError` naming ``url``.

    ``FileNotFoundError`` (a value: "missing") and rbzarr's own errors pass through.  Besides
    ``OSError`` and timeouts, every botocore error (unreachable endpoint, closed connection,
    timeouts, missing credentials) and aiohttp's client errors are translated, so an
    unreachable object store never reads as "empty" or "not found".  The backend error is
    kept as ``__cause__``.

    Parameters
    ----------
    url
        The location named in the error.
    action
        What was being done, e.g. ``"reading"``.

    Raises
    ------
    StorageUnavailableError
        The backend failed inside the block.
    """
    try:
        yield
    except (FileNotFoundError, RbzarrError):
        raise
    except backend_errors() as exc:
        raise StorageUnavailableError(f"{action} {url!r} failed: {_describe_failure(exc)}") from exc


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
        """Resolve a local path, ``file://``, ``memory://`` or ``s3://`` URL.

        Parameters
        ----------
        url
            The path or URL (a :class:`Location` is returned as it is).
        storage_options
            fsspec options; S3 URLs get :data:`S3_DEFAULTS` for the keys not given.

        Returns
        -------
        Location
            The resolved location (nothing is created).

        Raises
        ------
        ValueError
            ``url`` is empty or names an unknown protocol.
        StorageUnavailableError
            The filesystem cannot be set up (e.g. a missing optional package).
        """
        if isinstance(url, Location):
            return url
        text = os.fspath(url)
        if not text:
            raise ValueError("empty location: expected a local path or an fsspec URL")
        options = with_s3_defaults(text, storage_options or {})
        with translate_errors(text, "opening"):
            fs, path = fsspec.core.url_to_fs(text, **options)
        _bound_retries(fs)
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
            temp = f"{target}{TEMP_SUFFIX}{uuid.uuid4().hex}"
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

    def list_files(self, *names: str) -> list[str]:
        """Every file below ``names`` (or the file ``names`` itself), as ``/``-joined names
        relative to ``names``; empty if missing."""
        target = self.join(*names).rstrip("/")
        with translate_errors(self.url, "listing"):
            found = [str(path).rstrip("/") for path in self.fs.find(target)]
        prefix = f"{target}/"
        return sorted(
            path.removeprefix(prefix) if path != target else PurePosixPath(path).name
            for path in found
        )

    def copy_into(self, destination: Location) -> None:
        """Copy the file or tree at this root to ``destination``, which must not exist.

        fsspec moves the bytes: ``copy`` within one filesystem, ``put`` / ``get`` between
        the local disk and another one, a bulk ``cat`` and ``pipe`` otherwise.  Nothing at
        ``destination`` is ever replaced or deleted.

        Parameters
        ----------
        destination
            Where the copy goes (a path that does not exist yet).

        Raises
        ------
        StoreExistsError
            ``destination`` exists.
        StorageUnavailableError
            Either backend failed.
        """
        if destination.exists():
            raise StoreExistsError(f"{destination.url} already exists; a copy never overwrites")
        with translate_errors(f"{self.url} -> {destination.url}", "copying"):
            recursive = self.fs.isdir(self.path)
            if self.fs is destination.fs or _same_filesystem(self.fs, destination.fs):
                if self.is_local:
                    self.fs.makedirs(os.path.dirname(destination.path), exist_ok=True)
                self.fs.copy(self.path, destination.path, recursive=recursive)
            elif self.is_local:
                destination.fs.put(self.path, destination.path, recursive=recursive)
            elif destination.is_local:
                os.makedirs(os.path.dirname(destination.path), exist_ok=True)
                self.fs.get(self.path, destination.path, recursive=recursive)
            else:
                # Two remote filesystems: one concurrent bulk read, one bulk write.
                files = self.fs.find(self.path) if recursive else [self.path]
                found = self.fs.cat(files, on_error="raise")
                contents = found if isinstance(found, dict) else {self.path: found}
                root = self.path.rstrip("/")
                destination.fs.pipe(
                    {
                        destination.path + str(path)[len(root) :]: data
                        for path, data in contents.items()
                    }
                )

    def zarr_store(self, read_only: bool = False) -> Store:
        """A zarr store rooted here: ``LocalStore`` locally, ``FsspecStore`` elsewhere."""
        if self.is_local:
            return zarr.storage.LocalStore(self.path, read_only=read_only)
        store = zarr.storage.FsspecStore.from_url(
            self.url, storage_options=dict(self.storage_options), read_only=read_only
        )
        _bound_retries(store.fs)
        return store
