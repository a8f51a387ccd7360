"""zarr's ``LocalStore``, reading regular files only.

zarr reads a key's file with a plain ``open``: a FIFO in place of a ``zarr.json`` or a chunk
would block the reader forever.  :class:`RegularFileStore` reads through
:func:`~rbzarr.storage.io.files.read_regular`, which refuses a FIFO, socket or device before
opening it (:class:`~rbzarr.errors.UnsafePathError`); a folder reads as missing, as in
zarr.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore

from rbzarr.storage.io.files import read_regular

__all__ = ["RegularFileStore"]


def _read(path: str, byte_range: ByteRequest | None) -> bytes | None:
    """The bytes of ``byte_range`` of ``path``; ``None`` when it is missing or a folder."""
    start, end = 0, None
    if isinstance(byte_range, RangeByteRequest):
        start, end = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start = byte_range.offset
    elif isinstance(byte_range, SuffixByteRequest):
        start = -byte_range.suffix
    elif byte_range is not None:
        raise TypeError(f"unexpected byte range {byte_range!r}")
    try:
        return read_regular(path, start, end)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _buffer(data: bytes | None, prototype: BufferPrototype | None) -> Buffer | None:
    """``data`` in a buffer of ``prototype`` (zarr's default when ``None``); ``None`` stays."""
    if data is None:
        return None
    return (prototype or default_buffer_prototype()).buffer.from_bytes(data)


class RegularFileStore(LocalStore):
    """A ``LocalStore`` whose reads open regular files only (see the module)."""

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        """The bytes of ``key`` (``None``: missing); a FIFO, socket or device is refused."""
        if not self._is_open:
            await self._open()
        return _buffer(await asyncio.to_thread(_read, str(self.root / key), byte_range), prototype)

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        """:meth:`get`, synchronously."""
        self._ensure_open_sync()
        return _buffer(_read(str(self.root / key), byte_range), prototype)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        """:meth:`get` of each ``(key, byte range)``."""
        return list(
            await asyncio.gather(
                *(self.get(key, prototype, byte_range) for key, byte_range in key_ranges)
            )
        )
