"""What a trajectory group records about its keys' codecs, for ``rbzarr info``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rbzarr.storage.zarr.spec import parse_specs

__all__ = ["KeyCodec", "key_codecs"]


class KeyCodec:
    """One key's codec in one trajectory: its spec, its rows' raw bytes, its recorded PSNR."""

    __slots__ = ("codec", "psnr", "raw_bytes")

    def __init__(self, codec: str, raw_bytes: int, psnr: float | None) -> None:
        self.codec = codec
        self.raw_bytes = raw_bytes
        self.psnr = psnr


def key_codecs(description: Any, where: str) -> dict[str, KeyCodec]:
    """The keys a v2 group's layout description lists (``{}`` for other groups).

    ``raw_bytes`` counts every row of the key, those of a ``next_obs`` key stored once
    (read from ``curr_obs``) included.
    """
    if not isinstance(description, Mapping):
        return {}
    found = {}
    for key, spec in parse_specs(description, where).items():
        if spec is None:  # written through zarr: its zarr.json names the codec
            continue
        rows = spec.rows or spec.shape[:2]
        frame = math.prod(spec.shape[2:]) if len(spec.shape) > 2 else 1
        raw = math.prod(rows) * frame * spec.dtype.itemsize if spec.rows else spec.data_bytes
        found[key] = KeyCodec(spec.codec or "raw", raw, spec.psnr)
    return found
