"""IndexWriter: how one writer slot commits its index, with two strategies behind one interface.

- :class:`LogWriter` (stores of many writers, zarr): each burst of commits is one record of
  the slot's append-only log (:class:`~rbzarr.storage.index.log.IndexLog`), compacted now and
  then; at close the slot's documents are written once more as a mirror RLinf can read.
- :class:`DocumentsWriter` (RLinf's pt / pkl stores, one writer): the index is kept in
  memory and RLinf's two documents are rewritten whole, at most every
  :data:`DOCUMENTS_INTERVAL` seconds while commits go on, and at every flush and close.

Only :func:`~rbzarr.storage.index.slots.slot_files` chooses between them (for
:meth:`~rbzarr.storage.index.store_index.StoreIndex.writer`).  Each
writer serialises its own writes: the committer's writer thread appends, its caller's
thread flushes and closes.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from rbzarr.errors import StorageUnavailableError, StoreExistsError
from rbzarr.storage.index import format_records
from rbzarr.storage.index.collector import SlotCollector
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.index.log import IndexLog, SlotIndex
from rbzarr.storage.index.retention import Retention
from rbzarr.storage.index.schema import is_rbzarr_store
from rbzarr.storage.index.slots import HeldSlots, log_documents
from rbzarr.storage.index.trajectory_index import FORMAT_VERSION, TrajectoryIndex
from rbzarr.storage.index.writer_slot import WriterSlot
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry

__all__ = ["DOCUMENTS_INTERVAL", "DocumentsWriter", "IndexWriter", "LogWriter"]

# Seconds between rewrites of RLinf's documents while commits go on (flush and close also
# rewrite them).
DOCUMENTS_INTERVAL = 5.0


def _ignore(ids: list[int]) -> None:
    """No one to tell of removed ids."""


class IndexWriter(ABC):
    """The index of one claimed writer slot: append what is committed, flush, fold at close."""

    def __init__(self, layout: TrajectoryLayout, slot: WriterSlot) -> None:
        self.layout = layout
        self.slot = slot
        self._lock = threading.Lock()  # serialises this slot's index writes
        self._collector: SlotCollector | None = None  # with retention (a log only)
        self._protected: Callable[[], Collection[int]] = frozenset
        self._on_removed: Callable[[list[int]], None] = _ignore

    @property
    @abstractmethod
    def counter(self) -> int:
        """The slot's counter as its index records it (above every id it committed)."""

    @property
    @abstractmethod
    def max_rows(self) -> int:
        """The largest ``T * B`` the slot committed."""

    @property
    @abstractmethod
    def is_claimed(self) -> bool:
        """Whether the slot has committed anything (a first, empty commit included)."""

    @abstractmethod
    def append(
        self, entries: Sequence[Entry], *, counter: int, metadata: Mapping[str, Any]
    ) -> None:
        """Commit ``entries`` (their data complete) with the counter and ``metadata.json`` keys."""

    @abstractmethod
    def after_burst(self) -> None:
        """The writer thread finished a burst of commits (a writer may rewrite documents)."""

    @abstractmethod
    def flush(self) -> None:
        """Make what :meth:`append` committed readable as the slot's format wants it now."""

    @abstractmethod
    def _fold(self) -> None:
        """Compact what is compactable and write the documents' mirror."""

    def fold(self) -> None:
        """At close: :meth:`_fold`.  Every commit is in a record already, so a failing store
        only leaves this for the next close (a warning)."""
        try:
            self._fold()
        except StorageUnavailableError as exc:
            warnings.warn(
                f"{self.layout.location.url}: every commit is stored, but folding the index "
                f"log at close failed ({exc}); the next writer's close folds it",
                UserWarning,
                stacklevel=3,
            )

    @abstractmethod
    def full_index(self) -> TrajectoryIndex:
        """Every trajectory the slot committed."""

    def retain(
        self,
        retention: Retention,
        *,
        protected: Callable[[], Collection[int]] = frozenset,
        on_removed: Callable[[list[int]], None] = _ignore,
    ) -> None:
        """Collect the slot as it appends (see :mod:`~rbzarr.storage.index.collector`):
        never an id of ``protected()``; ``on_removed(ids)`` runs once ``ids`` left the log,
        before their data is deleted (on the writer thread, holding no lock of this writer).

        Raises
        ------
        ValueError
            This slot keeps RLinf's documents (a pt / pkl store): only a log collects.
        """
        if not self.layout.capabilities.many_writers:
            raise ValueError(
                f"retention needs a zarr store (its index is a log); "
                f"{self.layout.location.url} is a {self.layout.format!r} store"
            )
        self._collector = SlotCollector(self.layout, self.slot.slot, retention)
        self._protected = protected
        self._on_removed = on_removed

    def held(self) -> HeldSlots:
        """The slots a reader of this process reads from this writer's memory (none here)."""
        return {}

    def copy_in(self, source: TrajectoryLayout, index: TrajectoryIndex) -> list[dict[str, Any]]:
        """Copy ``index``'s trajectories this slot does not list yet from ``source``; the
        entries for the record that lists them (nothing is listed here).

        What the store holds already (same id and uuid) is not copied again, and complete
        copies an earlier import left before its record failed (same id and uuid under a
        commit marker) are kept, never rewritten.

        Raises
        ------
        StoreExistsError
            The store holds other trajectories under some of ``index``'s ids (nothing is
            copied).
        """
        known = self.full_index().entries
        unlisted = {i for i in self.layout.list_ids() if self.slot.owns(i)} - set(known)
        copied_before = {
            i
            for i in unlisted.intersection(index.id_list)
            if (format_records.written_attributes(self.layout, i) or {}).get("uuid")
            == index.entries[i]["uuid"]
        }
        unlisted -= copied_before
        clashes = [
            i
            for i in index.id_list
            if i in unlisted or (i in known and known[i].get("uuid") != index.entries[i]["uuid"])
        ]
        if clashes:
            raise StoreExistsError(
                f"auto_save_path {self.layout.location.url} already holds other trajectories "
                f"with the ids {clashes} of the checkpoint {source.location.url}; nothing was "
                "loaded: build the buffer with a new auto_save_path to load this checkpoint"
            )
        copied = []
        for trajectory_id in index.id_list:
            if trajectory_id not in known:
                if trajectory_id not in copied_before:
                    source.copy_to(self.layout, index.entries[trajectory_id])
                copied.append(dict(index.entries[trajectory_id]))
        return copied


class LogWriter(IndexWriter):
    """A slot that keeps its index as an append-only log (see :mod:`~rbzarr.storage.index.log`)."""

    def __init__(self, layout: TrajectoryLayout, slot: WriterSlot) -> None:
        super().__init__(layout, slot)
        self._log = slot.open_log()
        self._metadata: dict[str, Any] | None = None  # as last appended by this writer
        self._reopen = False  # a failed collection may have rewritten the log: read it again

    @property
    def counter(self) -> int:
        # docstring inherited
        return self._log.trajectory_counter

    @property
    def max_rows(self) -> int:
        # docstring inherited
        return self._log.max_rows

    @property
    def is_claimed(self) -> bool:
        # docstring inherited
        return not self._log.is_empty()

    def append(
        self, entries: Sequence[Entry], *, counter: int, metadata: Mapping[str, Any]
    ) -> None:
        # docstring inherited
        with self._lock:
            self._reopen_if_due()
            self._log.append(entries, counter=counter, metadata=_marked(self.layout, metadata))
            self._metadata = dict(metadata)
            if self._collector is not None:
                self._collector.noted(entries)

    def after_burst(self) -> None:
        """Collect what falls outside retention, if due; a storage failure leaves it for the
        next burst (every commit is in a record already)."""
        collector = self._collector
        if collector is None or not collector.is_due(self._log):
            return
        protected = self._protected()  # the buffer's lock: taken before this writer's
        try:
            with self._lock:
                self._reopen_if_due()
                removed = collector.collect(self._log, protected)
            if removed:
                self._on_removed(removed)
            with self._lock:
                collector.delete_expired()
        except StorageUnavailableError:
            with self._lock:
                collector.forget()
                self._reopen = True

    def _reopen_if_due(self) -> None:
        """Read the log again after a failed collection (under the lock)."""
        if self._reopen:
            self._log = IndexLog(self._log.location)
            self._reopen = False

    def flush(self) -> None:
        """Retry a compaction that failed (a failure again is left for the next flush)."""
        with self._lock:
            self._reopen_if_due()
            self._log.compact_if_due()

    def _fold(self) -> None:
        """Compact the log, then write the slot's documents whole (a mirror RLinf reads);
        nothing if this writer appended nothing."""
        with self._lock:
            self._reopen_if_due()
            if self._collector is not None:
                # Data whose deletes fail stays for the slot's next writer (its record says so).
                with contextlib.suppress(StorageUnavailableError):
                    self._collector.delete_expired()
            if self._metadata is None:
                return
            self._log.compact()
            if self._log.is_empty():
                return
            index = self._held_index()
            self.slot.write_documents(index.to_documents(self.layout.format, self._metadata))

    def held(self) -> HeldSlots:
        """This slot: its log's state is this writer's (only it writes the slot)."""
        return {self.slot.slot: self._read_log}

    def _read_log(self, last: int | None) -> SlotIndex | None:
        """The log's counters and last ``last`` entries, from memory (and full blocks);
        ``None`` before the slot's first commit."""
        with self._lock:
            self._reopen_if_due()
            return None if self._log.is_empty() else self._log.read(last)

    def full_index(self) -> TrajectoryIndex:
        """Every trajectory the slot committed (the log as this writer holds it: only the
        blocks before its open ones are read)."""
        with self._lock:
            return self._held_index()

    def _held_index(self) -> TrajectoryIndex:
        """:meth:`full_index`, holding the lock."""
        state = self._log.read(check=False)  # from_documents parses every entry
        if not state.begun:
            return TrajectoryIndex(trajectory_counter=self._log.trajectory_counter)
        url = self._log.location.url
        index = TrajectoryIndex.from_documents(log_documents(state, url), url)
        index.trajectory_counter = max(index.trajectory_counter, self._log.trajectory_counter)
        return index


class DocumentsWriter(IndexWriter):
    """A slot that keeps RLinf's two documents, exact and whole (RLinf reads them; the index
    stays in memory between rewrites)."""

    def __init__(self, layout: TrajectoryLayout, slot: WriterSlot) -> None:
        super().__init__(layout, slot)
        self._write_lock = threading.Lock()  # serialises the rewrites
        self._claimed = slot.has_documents()
        self._index = _stored_index(layout, slot, 0)
        self._metadata: dict[str, Any] = {}
        self._dirty = False
        self._written = time.monotonic()

    @property
    def counter(self) -> int:
        # docstring inherited
        return self._index.trajectory_counter

    @property
    def max_rows(self) -> int:
        # docstring inherited
        with self._lock:
            entries = self._index.entries.values()
            return max((int(e["shape"][0]) * int(e["shape"][1]) for e in entries), default=0)

    @property
    def is_claimed(self) -> bool:
        # docstring inherited
        return self._claimed

    def append(
        self, entries: Sequence[Entry], *, counter: int, metadata: Mapping[str, Any]
    ) -> None:
        # docstring inherited
        with self._lock:
            for entry in entries:
                trajectory_id = int(entry["trajectory_id"])
                if trajectory_id not in self._index.entries:
                    self._index.entries[trajectory_id] = IndexEntry.parse(
                        entry, self.layout.location.url
                    )
                    self._index.id_list.append(trajectory_id)
            self._index.trajectory_counter = max(self._index.trajectory_counter, counter)
            self._metadata = dict(metadata)
            self._dirty = True
            self._claimed = True

    def after_burst(self) -> None:
        """Rewrite the documents if :data:`DOCUMENTS_INTERVAL` passed since the last rewrite."""
        if time.monotonic() - self._written >= DOCUMENTS_INTERVAL:
            self.flush()

    def flush(self) -> None:
        """Rewrite RLinf's two documents whole if commits changed them."""
        with self._write_lock:
            with self._lock:
                if not self._dirty:
                    return
                index = self._index.subset(self._index.id_list)
                metadata = dict(self._metadata)
                self._dirty = False
            try:
                self.slot.write_documents(index.to_documents(self.layout.format, metadata))
            except BaseException:
                with self._lock:
                    self._dirty = True  # the next flush writes them again
                raise
            self._written = time.monotonic()

    def _fold(self) -> None:
        """Rewrite the documents if commits changed them (there is nothing to compact)."""
        self.flush()

    def full_index(self) -> TrajectoryIndex:
        """Every trajectory the slot committed (a copy of the index held in memory)."""
        with self._lock:
            return self._index.subset(self._index.id_list)


def _marked(layout: TrajectoryLayout, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with the format marker and the layout's own keys, as a record holds it."""
    return {
        **metadata,
        **format_records.format_metadata(layout),
        "trajectory_format": layout.format,
        "rbzarr_format_version": FORMAT_VERSION,
    }


def _stored_index(layout: TrajectoryLayout, slot: WriterSlot, counter: int) -> TrajectoryIndex:
    """The slot's committed index as stored, its counter at least ``counter``."""
    documents = slot.read_documents()
    if documents is None:
        return TrajectoryIndex(trajectory_counter=counter)
    index = TrajectoryIndex.from_documents(documents, layout.location.url)
    if not is_rbzarr_store(documents.metadata):
        # RLinf lists ids it never saved; rbzarr's documents list only what exists.
        present = set(layout.list_ids())
        index = index.subset(i for i in index.id_list if i in present)
    index.trajectory_counter = max(index.trajectory_counter, counter)
    return index
