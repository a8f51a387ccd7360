"""Reading a JSON document that a store holds, within bounds.

A store may come from someone else: :func:`read_json` refuses a document larger than
:func:`max_json_bytes` (64 MiB unless ``RBZARR_MAX_JSON_BYTES`` says otherwise), nested
deeper than :data:`MAX_JSON_DEPTH`, holding ``NaN`` / ``Infinity``, or not UTF-8 JSON, each
with a :class:`~rbzarr.errors.CorruptStoreError` naming the document.  Decoding never
raises ``RecursionError`` or ``OverflowError``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from rbzarr.errors import CorruptStoreError

__all__ = [
    "JSON_BYTES_VARIABLE",
    "MAX_JSON_DEPTH",
    "DocumentTooLargeError",
    "check_size",
    "max_json_bytes",
    "read_json",
]

# Environment variable raising (or lowering) the size bound, in bytes.
JSON_BYTES_VARIABLE = "RBZARR_MAX_JSON_BYTES"
_DEFAULT_MAX_BYTES = 64 << 20
# Deepest nesting of objects and arrays (rbzarr's own documents nest 6 deep at most).
MAX_JSON_DEPTH = 64


class DocumentTooLargeError(CorruptStoreError):
    """A store's JSON document is larger than the bound (``RBZARR_MAX_JSON_BYTES``)."""


def max_json_bytes() -> int:
    """The size bound of a JSON document: ``RBZARR_MAX_JSON_BYTES``, else 64 MiB."""
    raw = os.environ.get(JSON_BYTES_VARIABLE, "")
    try:
        return int(raw) if raw else _DEFAULT_MAX_BYTES
    except ValueError:
        raise ValueError(
            f"{JSON_BYTES_VARIABLE}={raw!r}: expected a whole number of bytes"
        ) from None


def check_size(size: int, where: str) -> None:
    """Refuse (:class:`DocumentTooLargeError`) a document of ``size`` bytes past the bound."""
    bound = max_json_bytes()
    if size > bound:
        raise DocumentTooLargeError(
            f"{where}: {size} bytes, more than the {bound} bytes a JSON document may have; "
            f"set {JSON_BYTES_VARIABLE} to a larger number of bytes to read it"
        )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_LENIENT = json.JSONDecoder()


def read_json(raw: bytes | str, where: str, *, allow_nan: bool = False) -> Any:
    """The JSON value in ``raw``, checked for size, nesting and numbers (``where`` names it).

    Parameters
    ----------
    raw
        The document's bytes.
    where
        The document's path or URL, named in errors.
    allow_nan
        Take ``NaN`` and ``Infinity`` as numbers (as zarr writes attributes), not refuse them.

    Returns
    -------
    Any
        The decoded value.

    Raises
    ------
    DocumentTooLargeError
        ``raw`` is larger than :func:`max_json_bytes`.
    CorruptStoreError
        ``raw`` is not UTF-8 JSON, holds ``NaN`` or ``Infinity`` (unless ``allow_nan``), or
        nests deeper than :data:`MAX_JSON_DEPTH`.
    """
    check_size(len(raw), where)
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH:  # else it cannot nest deeper
        _check_depth(data, where)
    try:
        document = (_LENIENT if allow_nan else _DECODER).decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptStoreError(f"{where} is not valid JSON: {exc}") from exc
    return document


_STRUCTURE = b'[]{}"'
_NOT_STRUCTURE = bytes(set(range(256)) - set(_STRUCTURE))


def _check_depth(raw: bytes, where: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_JSON_DEPTH`, from its bytes (before decoding).

    Escapes go first (``\\\\`` pairs, then ``\\"``), so every quote left delimits a string;
    the brackets outside strings give the depth.
    """
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    marks = np.frombuffer(plain, dtype=np.uint8)
    quotes = marks == ord('"')
    outside = (np.cumsum(quotes, dtype=np.int64) & 1) == 0
    opens = ((marks == ord("[")) | (marks == ord("{"))) & outside
    closes = ((marks == ord("]")) | (marks == ord("}"))) & outside
    steps = opens.astype(np.int32) - closes.astype(np.int32)
    if steps.size and int(np.cumsum(steps, dtype=np.int32).max()) > MAX_JSON_DEPTH:
        raise CorruptStoreError(
            f"{where}: nested deeper than {MAX_JSON_DEPTH} levels of objects and arrays"
        )
