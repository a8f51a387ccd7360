"""What a layout can do beyond the interface: :class:`LayoutCapabilities`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LayoutCapabilities"]


@dataclass(frozen=True)
class LayoutCapabilities:
    """What a layout can do beyond the interface; callers ask these, never the format.

    Attributes
    ----------
    many_writers
        Many buffers may append to one store at once, each in a writer slot of its own.
    local_cache
        Takes ``local_cache_dir`` / ``local_cache_bytes``: a local copy of a remote store's
        data.
    """

    many_writers: bool = False
    local_cache: bool = False
