"""The base of the classes that read and write one kind of a store's own files (pins,
priority files, the priority change record), all below the store's root."""

from __future__ import annotations

from rbzarr.storage.io.location import Location

__all__ = ["StoreFiles"]


class StoreFiles:
    """One kind of file of the store at ``location``.

    Parameters
    ----------
    location
        The store's root.
    """

    def __init__(self, location: Location) -> None:
        self.location = location
