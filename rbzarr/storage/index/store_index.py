"""StoreIndex: the store's catalog, opened with one read.

:meth:`StoreIndex.open` answers, from one probe of the store, whether a store is there, its
format, its ``metadata.json`` keys, its schema and its codecs (the per-trajectory records
the store keeps beside the data are the catalog's too: :attr:`StoreIndex.priorities` and
:attr:`StoreIndex.pins`); the buffer, its committer and
its loader share that snapshot instead of probing again.  :meth:`StoreIndex.read` reads the
index (whole, or the last trajectories of a large store), and :meth:`StoreIndex.writer`
claims a writer slot and returns the slot's :class:`~rbzarr.storage.index.writers.IndexWriter`:
the log for stores of many writers, RLinf's documents for pt / pkl stores, as
:func:`~rbzarr.storage.index.slots.slot_files` (the one place that chooses between them)
decides.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CheckpointNotFoundError, StoreExistsError
from rbzarr.storage.index import format_records
from rbzarr.storage.index.pins import StorePins
from rbzarr.storage.index.priorities import PriorityFiles
from rbzarr.storage.index.slots import read_store_window, slot_files, writer_slots
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import METADATA_FILE, Documents

if TYPE_CHECKING:
    from rbzarr.storage.index.writers import IndexWriter
    from rbzarr.storage.layout import TrajectoryLayout
    from rbzarr.trajectory.model import Schema

__all__ = ["DEFAULT_STORED_FORMAT", "StoreIndex", "stored_format"]

# RLinf writes no format marker and saves ``pt`` files by default.
DEFAULT_STORED_FORMAT = "pt"


def stored_format(metadata: Mapping[str, Any]) -> str:
    """The format ``metadata.json`` names (RLinf's ``"pt"`` when it names none)."""
    return str(metadata.get("trajectory_format", DEFAULT_STORED_FORMAT))


@dataclass(frozen=True)
class StoreIndex:
    """What one read of a store found: whether it exists, and its ``metadata.json`` keys.

    Parameters
    ----------
    location
        The store's root.
    metadata
        The store's ``metadata.json`` keys (the first writer's that committed any), empty
        where no store is; ``None`` where a writer's index document is there but no
        writer's ``metadata.json`` (a damaged store).
    exists
        Whether any writer committed there (a log or a document).
    """

    location: Location
    metadata: Mapping[str, Any] | None
    exists: bool

    @classmethod
    def open(cls, location: Location) -> StoreIndex:
        """Probe the store at ``location`` once: slot 0 first, the other slots only when
        slot 0 committed nothing.

        Raises
        ------
        CorruptStoreError
            A head or document is malformed.
        StorageUnavailableError
            The backend failed.
        """
        found = False
        for slot in _slots(location):
            metadata, exists = slot_files(location, slot).probe()
            if metadata is not None:
                return cls(location, metadata, True)
            found = found or exists
        return cls(location, None if found else {}, found)

    @classmethod
    def assumed(cls, location: Location) -> StoreIndex:
        """The catalog at ``location`` taken to exist, without reading it (for a caller that
        only reads the index: the read says if no store is there)."""
        return cls(location, {}, True)

    @property
    def format(self) -> str | None:
        """The store's ``trajectory_format`` (``"pt"`` if unnamed, as RLinf), ``None`` if no
        store is here.

        Raises
        ------
        CheckpointNotFoundError
            A writer's index document is there but no writer's ``metadata.json``.
        """
        return stored_format(self.recorded) if self.exists else None

    @property
    def recorded(self) -> Mapping[str, Any]:
        """The ``metadata.json`` keys (none where no store is); raises as :attr:`format`."""
        if self.metadata is None:
            raise CheckpointNotFoundError(
                f"{self.location.url}/{METADATA_FILE} not found: {self.location.absence()}"
            )
        return self.metadata

    @property
    def schema(self) -> Schema | None:
        """The schema ``metadata.json`` records, ``None`` if none (RLinf, or no store)."""
        from rbzarr.storage.index.schema import schema_from_json  # noqa: PLC0415 (torch)

        return schema_from_json(self.recorded.get("schema"))

    @property
    def codecs(self) -> dict[str, str]:
        """The codec of each key, as a zarr store records them (none for other formats)."""
        from rbzarr.storage.zarr.layout import CODECS_KEY  # noqa: PLC0415 (zarr, when asked)

        return dict(self.recorded.get(CODECS_KEY) or {})

    @property
    def priorities(self) -> PriorityFiles:
        """The priority files the store keeps beside its trajectories (no read here)."""
        return PriorityFiles(self.location)

    @property
    def pins(self) -> StorePins:
        """The pins of the checkpoints that name the store's trajectories (no read here)."""
        return StorePins(self.location)

    def check_appendable(self, layout: TrajectoryLayout) -> Schema | None:
        """Refuse to append with ``layout`` to a store of another format; ``layout`` takes on
        what the store records of its format (its codecs); the schema the store records.

        Raises
        ------
        StoreExistsError
            The store here is of another format than ``layout``'s.
        """
        if not self.exists:
            return None
        if self.format != layout.format:
            raise StoreExistsError(
                f"auto_save_path {self.location.url} holds a {self.format!r} store and this "
                f"buffer writes {layout.format!r}: build it with trajectory_format="
                f"{self.format!r} to append to that store, or choose another auto_save_path"
            )
        format_records.adopt_store_metadata(layout, self.recorded)
        return self.schema

    def holds_data(self, layout: TrajectoryLayout) -> bool:
        """Whether a store here holds data: ids its index lists or, where no writer
        committed, trajectory data of ``layout`` (a save never goes there)."""
        if not self.exists:
            return bool(layout.list_ids())
        try:
            listed = self.read().trajectory_index["trajectory_id_list"]
        except CheckpointNotFoundError:
            return True  # a writer's document without the other: a damaged store is data
        return bool(listed)

    def read(self, window: int | None = None, writer: IndexWriter | None = None) -> Documents:
        """The index, read now: the union of every writer's, or a large store's last
        ``window`` trajectories; raises as
        :func:`~rbzarr.storage.index.slots.read_store_window`.  ``writer``, this process's
        writer of the store, answers for its own slot from memory."""
        return read_store_window(self.location, window, None if writer is None else writer.held())

    def writer(self, layout: TrajectoryLayout) -> IndexWriter:
        """Claim a writer slot of this store for ``layout`` and return the slot's writer
        (:func:`~rbzarr.storage.index.slots.slot_files` chooses: the log where the layout
        takes many writers, else RLinf's documents).

        Raises
        ------
        StoreExistsError
            No slot is free (a pt / pkl store: another buffer writes it).
        CorruptStoreError
            The slot's index is malformed.
        """
        # Imported here: it imports torch, which `rbzarr info` reads without.
        from rbzarr.storage.index.writer_slot import WriterSlot  # noqa: PLC0415

        slot = WriterSlot.claim(layout)
        try:
            return slot_files(layout.location, slot.slot, writing=layout).writer(layout, slot)
        except BaseException:
            slot.release()
            raise


def _slots(location: Location) -> Iterator[int]:
    """Slot 0, then (listed only if asked for) the other slots."""
    yield 0
    yield from writer_slots(location)
