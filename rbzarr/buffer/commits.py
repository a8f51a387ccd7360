"""StoreCommitter: the commit protocol, i.e. what each write does to the auto-save store.

It opens the store (appending to one that exists, refusing one it cannot append to), runs
each accepted trajectory's write on a :class:`~rbzarr.buffer.background.BackgroundWriter`
and commits in order: the trajectory's data, then its group attributes (the layout's commit
marker), then the two documents that list it, once per burst of writes.  It keeps the
in-memory copy of every trajectory until its data is complete, so sampling never waits for
storage.

While a buffer runs, this is the only writer of its slot of the store
(:class:`~rbzarr.storage.index.writer_slot.WriterSlot`): other buffers may append to the same zarr
store at once, each to its own documents and ids.  Deletions have two owners, and
both delete only what rbzarr wrote: here, rewriting a trajectory (a retried write) first
clears what an earlier attempt left in that trajectory's own group; offline,
``rbzarr verify --repair`` (:mod:`rbzarr.analysis.verify`) deletes orphan groups (data no
index lists, left by a crash before the commit) and temporary files.  A user's files in or
beside a store are never touched, and a new trajectory never gets the id of data already in
the store.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.background import DEFAULT_TIMEOUT, BackgroundWriter
from rbzarr.buffer.checkpoint import LoadedCheckpoint
from rbzarr.errors import (
    CheckpointConflictError,
    StorageUnavailableError,
    StoreExistsError,
    WriterFailedError,
)
from rbzarr.storage.index.log import IndexLog
from rbzarr.storage.index.schema import is_rbzarr_store, schema_from_json
from rbzarr.storage.index.trajectory_index import FORMAT_VERSION, TrajectoryIndex
from rbzarr.storage.index.writer_slot import WriterSlot
from rbzarr.storage.io.backends import permanent_cause, translate_errors
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.writable import check_writable
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import stored_format
from rbzarr.storage.rlinf.documents import Documents, Entry
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["DOCUMENTS_INTERVAL", "StoreCommitter"]

# Seconds between rewrites of RLinf's documents while commits go on (flush and close also
# rewrite them).
DOCUMENTS_INTERVAL = 5.0


class StoreCommitter:
    """Commits accepted trajectories to one store in order: the data first, the documents last."""

    def __init__(
        self,
        layout: TrajectoryLayout,
        *,
        max_pending_writes: int = 8,
        metadata: Mapping[str, Any] | None = None,
        on_committed: Callable[[int], None] | None = None,
    ) -> None:
        self.layout = layout
        # Called on the writer thread with each committed id, holding none of this object's
        # locks: it must not block (the writes behind it wait), and what it raises is ignored.
        self._on_committed = on_committed
        self._writer = BackgroundWriter(
            max_pending=max_pending_writes, target=layout.location.url, permanent=permanent_cause
        )
        self._lock = threading.Lock()
        # Serialises the rewrites of RLinf's documents (the writer thread, flush and close).
        self._documents_lock = threading.Lock()
        # Serialises the log's writes (the writer thread's records, flush's compaction).
        self._log_lock = threading.Lock()
        self._metadata = dict(metadata or {})
        self._pending: dict[int, ValidatedTrajectory] = {}
        self._unrecorded: list[dict[str, Any]] = []  # data complete, not in a record yet
        self.stored_schema: Schema | None = None
        self._counter = 0  # the next id: above everything committed or written
        self._check_folder()
        self.slot = WriterSlot.claim(layout)
        try:
            # A store of many writers keeps an append-only log per writer; RLinf's formats
            # (one writer) keep RLinf's documents, exact and whole (RLinf reads them; the
            # index stays in memory).
            self._check_existing()
            self._log: IndexLog | None = None
            if layout.supports_many_writers:
                self._log = self.slot.open_log()
            self._read_counter()
            self._documents: TrajectoryIndex | None = None
            if self._log is None:
                self._documents = self._full_index()
                self._counter = max(self._counter, self._documents.trajectory_counter)
        except BaseException:
            self.slot.release()
            raise
        self._claimed = self._log is not None and not self._log.is_empty()
        self._claimed = self._claimed or (self._log is None and self.slot.has_documents())
        self._documents_dirty = False
        self._documents_written = time.monotonic()
        self._recorded = False  # whether this writer committed anything

    def _check_folder(self) -> None:
        """Refuse an ``auto_save_path`` that is a file."""
        location = self.layout.location
        with translate_errors(location.url, "opening"):
            is_file = location.fs.isfile(location.path, **deadline_options(location.fs))
        if is_file:
            raise StoreExistsError(
                f"auto_save_path {location.url} is a file: it must be a folder (new, or holding "
                "a store to append to); choose another auto_save_path"
            )
        check_writable(location)

    def _check_existing(self) -> None:
        """Refuse a store of another format already here; set ``stored_schema``."""
        if self.layout.has_documents():
            # Every writer's metadata names the store's format and schema.
            metadata = self.layout.read_store_metadata()
            self._check_format(metadata)
            self.layout.adopt_store_metadata(metadata)
            self.stored_schema = schema_from_json(metadata.get("schema"))

    def _read_counter(self) -> None:
        """The next id of this slot: above everything it committed or left written."""
        logged = 0 if self._log is None else self._log.trajectory_counter
        self._counter = max(logged, self.slot.first_id)
        # Data no record lists (a write interrupted by a crash) keeps its id too.
        self._counter = self.slot.first_unused_id(self._counter)

    def _full_index(self) -> TrajectoryIndex:
        """Every trajectory this slot committed (reads the whole log)."""
        documents = self.slot.read_documents()
        if documents is None:
            return TrajectoryIndex(trajectory_counter=self._counter)
        index = TrajectoryIndex.from_documents(documents, self.url)
        if not is_rbzarr_store(documents.metadata):
            # RLinf lists ids it never saved; rbzarr's documents list only what exists.
            present = set(self.layout.list_ids())
            index = index.subset(i for i in index.id_list if i in present)
        index.trajectory_counter = max(index.trajectory_counter, self._counter)
        return index

    def _check_format(self, metadata: Mapping[str, Any]) -> None:
        """Refuse a store of another format than this buffer writes."""
        fmt = stored_format(Documents(dict(metadata), {}))
        if fmt != self.layout.format:
            raise StoreExistsError(
                f"auto_save_path {self.url} holds a {fmt!r} store and this buffer "
                f"writes {self.layout.format!r}: build it with trajectory_format={fmt!r} to "
                "append to that store, or choose another auto_save_path"
            )

    def first_free_id(self, counter: int) -> int:
        """``counter`` if it is a free id of this writer's slot, else the slot's next id."""
        next_id = self.next_id
        return counter if self.slot.owns(counter) and counter >= next_id else next_id

    # -- what the store holds ---------------------------------------------------------------
    @property
    def url(self) -> str:
        """The store's URL."""
        return self.layout.location.url

    @property
    def next_id(self) -> int:
        """The smallest id above everything committed or queued here."""
        with self._lock:
            return max(self._counter, max(self._pending, default=-1) + 1)

    @property
    def pending(self) -> int:
        """Writes queued or running."""
        return self._writer.pending

    @property
    def last_error(self) -> BaseException | None:
        """The error the current write keeps failing with, if any."""
        return self._writer.last_error

    @property
    def largest_committed(self) -> int:
        """The largest ``T * B`` of the trajectories committed to this slot."""
        with self._lock:
            if self._log is not None:
                return self._log.max_rows
            assert self._documents is not None  # kept whenever there is no log
            entries = self._documents.entries.values()
            return max((int(e["shape"][0]) * int(e["shape"][1]) for e in entries), default=0)

    def pending_trajectory(self, trajectory_id: int) -> ValidatedTrajectory | None:
        """The in-memory copy of a trajectory whose data is not complete yet, else ``None``."""
        with self._lock:
            return self._pending.get(trajectory_id)

    def warm(self, entries: Iterable[Entry]) -> None:
        """Tell the layout which committed trajectories form the sample window (a layout with
        a local copy of a remote store fetches them ahead)."""
        with self._lock:
            committed = [e for e in entries if e["trajectory_id"] not in self._pending]
        self.layout.warm(committed)

    def pending_flats(self, ids: Iterable[int]) -> dict[int, dict[str, torch.Tensor]]:
        """The flat views (not copies) of those of ``ids`` still being written."""
        with self._lock:
            return {i: self._pending[i].flat for i in ids if i in self._pending}

    def set_metadata(self, **values: Any) -> None:
        """Set ``metadata.json`` keys (``seed=``, ``schema=``, ...) for the next commit."""
        with self._lock:
            self._metadata.update(values)

    # -- writing ----------------------------------------------------------------------------
    def check(self, trajectory: ValidatedTrajectory) -> None:
        """Raise if the file name built from ``model_weights_id`` would leave the store, or
        the layout cannot write the trajectory (its codecs)."""
        self.layout.trajectory_path(
            {"trajectory_id": 0, "model_weights_id": trajectory.trajectory.model_weights_id}
        )
        self.layout.check_writable(trajectory.trajectory)

    def wait_for_room(self, count: int) -> None:
        """Block until ``count`` writes fit in the queue; refuse while storage fails."""
        self._writer.wait_for_room(count)

    def submit(self, items: Sequence[tuple[Entry, ValidatedTrajectory]]) -> None:
        """Queue the writes of ``items`` in order, holding each in memory until it is written."""
        with self._lock:
            for entry, trajectory in items:
                self._pending[int(entry["trajectory_id"])] = trajectory
        self._writer.submit([functools.partial(self._commit, dict(e), t) for e, t in items])

    def _commit(self, entry: dict[str, Any], trajectory: ValidatedTrajectory) -> None:
        """Writer thread: the data, then (last of a burst) one log record listing the burst."""
        # A new store is first committed empty (claimed), so a crash during its first write
        # leaves a store that loads.
        if not self._claimed:
            self._record([])
            self._claimed = True
            self.flush_documents()
        trajectory_id = int(entry["trajectory_id"])
        # A retried task resumes at its first step not done: data and marker (once: a group
        # whose write completed is never rewritten), then the record.
        with self._lock:
            written = trajectory_id not in self._pending
        if not written:
            self.layout.write(entry, trajectory)  # validated once, on add: not again
            with self._lock:
                self._unrecorded.append(entry)
                self._counter = max(self._counter, trajectory_id + 1)
                # The data is complete and readable from the store from here on.
                self._pending.pop(trajectory_id, None)
        with self._lock:
            # With more writes queued behind this one, the last of them commits for all.
            last = self._writer.pending <= 1
        if last:
            self._record_unrecorded()
        if self._on_committed is not None:
            # The commit stands whatever the callback does: a failure must not make the
            # writer retry (and rewrite) a trajectory that is already listed.
            with contextlib.suppress(Exception):
                self._on_committed(trajectory_id)

    def _record_unrecorded(self) -> None:
        """Writer thread: list every trajectory whose data is complete in one record."""
        with self._lock:
            entries = list(self._unrecorded)
        if entries:
            self._record(entries)
        with self._lock:
            # They leave the queue only once their record is durable: a failed record
            # leaves them all for the retry.
            del self._unrecorded[: len(entries)]
        if self._documents is not None and time.monotonic() - self._documents_written >= (
            DOCUMENTS_INTERVAL
        ):
            self._write_documents()

    def _record(self, entries: Sequence[dict[str, Any]]) -> None:
        """Append one record listing ``entries`` (whose data is complete)."""
        with self._lock:
            metadata = {
                **self._metadata,
                **self.layout.format_metadata(),
                "trajectory_format": self.layout.format,
                "rbzarr_format_version": FORMAT_VERSION,
            }
            counter = self._counter
        if self._log is not None:
            with self._log_lock:
                self._log.append(entries, counter=counter, metadata=metadata)
        self._recorded = True
        if self._documents is not None:
            with self._lock:
                for entry in entries:
                    trajectory_id = int(entry["trajectory_id"])
                    if trajectory_id not in self._documents.entries:
                        self._documents.entries[trajectory_id] = dict(entry)
                        self._documents.id_list.append(trajectory_id)
                self._documents.trajectory_counter = max(
                    self._documents.trajectory_counter, counter
                )
                self._documents_dirty = True

    def _write_documents(self, mirror: bool = False) -> None:
        """Rewrite RLinf's two documents whole if commits changed them (pt / pkl), or, with
        ``mirror``, a log's full mirror (at close)."""
        with self._documents_lock:
            if self._documents is None:
                if not mirror or self._log is None or self._log.is_empty():
                    return
                index = self._full_index()
            else:
                with self._lock:
                    if not self._documents_dirty:
                        return
                    index = self._documents.subset(self._documents.id_list)
                    self._documents_dirty = False
            with self._lock:
                metadata = dict(self._metadata)
            try:
                self.slot.write_documents(index.to_documents(self.layout.format, metadata))
            except BaseException:
                if self._documents is not None:
                    with self._lock:
                        self._documents_dirty = True  # the next flush writes them again
                raise
            self._documents_written = time.monotonic()

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target`` (a checkpoint), whether committed or not."""
        # A trajectory still being written may be half-written in the store: save its copy.
        pending = self.pending_trajectory(int(entry["trajectory_id"]))
        if pending is not None:
            target.write(entry, pending)
        else:
            self.layout.copy_to(target, entry)

    def adopt(self, loaded: LoadedCheckpoint) -> None:
        """Make the store hold a loaded checkpoint's trajectories, so it stays self-contained."""
        if loaded.source.location.url == self.url:
            if loaded.is_partial:
                raise CheckpointConflictError(
                    f"{self.url}: a rank's share cannot continue in place in the shared "
                    "auto_save store: ranks appending to one store would write the same new "
                    "ids; give each rank its own auto_save_path"
                )
            # Continuing in place: the store lists every trajectory of the share already.
            return
        share = loaded.share
        if self.slot.slot != 0 and not all(self.slot.owns(i) for i in share.id_list):
            raise CheckpointConflictError(
                f"{self.url} has other writers: this buffer writes its slot {self.slot.slot} "
                f"(ids from {self.slot.first_id}) and cannot import the checkpoint "
                f"{loaded.source.location.url}, whose ids belong to other slots; load it "
                "where no other writer runs, or into a new auto_save_path"
            )
        self.import_trajectories(loaded.source, share)

    def import_trajectories(self, source: TrajectoryLayout, index: TrajectoryIndex) -> None:
        """Make the store hold ``index``'s trajectories too, copied from ``source``."""
        # Call with no write queued (after flush); what the store holds already (same id and
        # uuid) is not copied again.
        known = self._full_index().entries
        unlisted = {i for i in self.layout.list_ids() if self.slot.owns(i)} - set(known)
        # An earlier load that failed before its record left complete copies: this one
        # resumes after them (same id and uuid under a commit marker), never rewriting them.
        copied_before = {
            i
            for i in unlisted.intersection(index.id_list)
            if (self.layout.written_attributes(i) or {}).get("uuid") == index.entries[i]["uuid"]
        }
        unlisted -= copied_before
        clashes = [
            i
            for i in index.id_list
            if i in unlisted or (i in known and known[i].get("uuid") != index.entries[i]["uuid"])
        ]
        if clashes:
            raise StoreExistsError(
                f"auto_save_path {self.url} already holds other trajectories with the ids "
                f"{clashes} of the checkpoint {source.location.url}; nothing was loaded: build "
                "the buffer with a new auto_save_path to load this checkpoint"
            )
        copied = []
        for trajectory_id in index.id_list:
            if trajectory_id not in known:
                if trajectory_id not in copied_before:
                    source.copy_to(self.layout, index.entries[trajectory_id])
                copied.append(dict(index.entries[trajectory_id]))
        with self._lock:
            self._counter = max(self._counter, self.first_free_id_locked(index.trajectory_counter))
        self._record(copied)
        self.flush_documents()

    def first_free_id_locked(self, counter: int) -> int:
        """:meth:`first_free_id` for a caller holding the lock."""
        next_id = max(self._counter, max(self._pending, default=-1) + 1)
        return counter if self.slot.owns(counter) and counter >= next_id else next_id

    def _fold(self) -> None:
        """At close: compact the log and write the documents' mirror.  Every commit is in a
        record already, so a failing store only leaves this for the next close (a warning)."""
        try:
            if self._log is not None:
                with self._log_lock:
                    self._log.compact()
            self._write_documents(mirror=True)
        except StorageUnavailableError as exc:
            warnings.warn(
                f"{self.url}: every commit is stored, but folding the index log at close "
                f"failed ({exc}); the next writer's close folds it",
                UserWarning,
                stacklevel=3,
            )

    def flush_documents(self) -> None:
        """Rewrite RLinf's documents now if commits changed them (pt / pkl stores)."""
        if self._documents is not None:
            self._write_documents()

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed (and RLinf's documents rewritten).

        Raises
        ------
        WriterFailedError
            A write or record is not committed: the error names the trajectories.
        """
        try:
            self._writer.flush(timeout)
        except WriterFailedError as exc:
            with self._lock:
                waiting = sorted(self._pending)
            more = f" and {len(waiting) - 10} more" if len(waiting) > 10 else ""
            named = WriterFailedError(
                f"{exc}; trajectories not in the store yet: {waiting[:10]}{more}"
            )
            raise named from exc.__cause__
        with self._lock:
            unrecorded = [int(e["trajectory_id"]) for e in self._unrecorded]
        if unrecorded:
            raise WriterFailedError(
                f"{self.url}: trajectories {unrecorded} are written but no record lists them "
                "yet; call flush() again to retry"
            )
        self.flush_documents()
        if self._log is not None:
            with self._log_lock:
                self._log.compact_if_due()  # a failed compaction is retried, never raised

    def close(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        wait: bool = True,
        final_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Stop accepting writes, wait for the queued ones (unless ``wait`` is false), record
        ``final_metadata`` (the samplers' state at close) in one more record, fold the log and
        write the documents' mirror, then give the writer slot up."""
        try:
            self._writer.close(timeout, wait)
            if wait and self._writer.last_error is None:
                if final_metadata:
                    self.set_metadata(**final_metadata)
                    self._record([])
                    self.flush_documents()
                if self._recorded:
                    self._fold()
        finally:
            # Without waiting, the writes left are abandoned (lost if this process ends): the
            # slot is given up as a killed writer's would be.
            self.slot.release()
