"""StoreCommitter: the commit protocol, i.e. what each write does to the auto-save store.

It keeps the queue of accepted trajectories (on a
:class:`~rbzarr.buffer.background.BackgroundWriter`, each held in memory until its data is
complete, so sampling never waits for storage) and commits in order: the layout's write
(data, then commit marker), then, once per burst, the append of the slot's
:class:`~rbzarr.storage.index.writers.IndexWriter` (the log, or RLinf's documents) that
lists them.  Other buffers may append to the same zarr store at once, each to its own slot
and ids; a new trajectory never gets the id of data already in the store.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.background import DEFAULT_TIMEOUT, BackgroundWriter
from rbzarr.buffer.checkpoint import LoadedCheckpoint, check_adoptable
from rbzarr.errors import WriterFailedError
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.backends import permanent_cause
from rbzarr.storage.io.writable import check_store_folder
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["MAX_WRITTEN_TOGETHER", "StoreCommitter"]

# The most queued writes offered to the layout at once (it may write several as one).
MAX_WRITTEN_TOGETHER = 64


class StoreCommitter:
    """Commits accepted trajectories to one store in order: the data first, the index last."""

    def __init__(
        self,
        layout: TrajectoryLayout,
        *,
        max_pending_writes: int = 8,
        metadata: Mapping[str, Any] | None = None,
        on_committed: Callable[[int, bool], None] | None = None,
        store: StoreIndex | None = None,  # as the buffer opened it (else read here)
    ) -> None:
        self.layout = layout
        # Called on the writer thread with each committed id and whether more writes are
        # queued behind it, holding none of this object's locks: it must not block (the
        # writes behind it wait), and what it raises is ignored.
        self._on_committed = on_committed
        self._writer = BackgroundWriter(
            max_pending=max_pending_writes, target=layout.location.url, permanent=permanent_cause
        )
        self._lock = threading.Lock()
        self._metadata = dict(metadata or {})
        # Accepted, data not complete yet: by id, in the order queued.
        self._pending: dict[int, tuple[dict[str, Any], ValidatedTrajectory]] = {}
        self._unrecorded: list[dict[str, Any]] = []  # data complete, not in a record yet
        store = store or StoreIndex.open(layout.location)
        check_store_folder(layout.location, is_store=store.exists)
        self.stored_schema: Schema | None = store.check_appendable(layout)
        self.index = store.writer(layout)
        self.slot = self.index.slot
        try:
            # The next id: above everything committed, and above data no record lists (a
            # write interrupted by a crash keeps its id too).
            self._counter = self.slot.first_unused_id(max(self.index.counter, self.slot.first_id))
        except BaseException:
            self.slot.release()
            raise

    def first_free_id(self, counter: int) -> int:
        """``counter`` if it is a free id of this writer's slot, else the slot's next id."""
        next_id = self.next_id
        return counter if self.slot.owns(counter) and counter >= next_id else next_id

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

    def pending_trajectory(self, trajectory_id: int) -> ValidatedTrajectory | None:
        """The in-memory copy of a trajectory whose data is not complete yet, else ``None``."""
        with self._lock:
            found = self._pending.get(trajectory_id)
        return None if found is None else found[1]

    def warm(self, entries: Sequence[Entry]) -> None:
        """Tell the layout the sample window ``entries``, and which of them are committed (a
        layout with a local copy of a remote store fetches those ahead)."""
        with self._lock:
            committed = [e for e in entries if e["trajectory_id"] not in self._pending]
        self.layout.sample_window(len(entries), committed)

    def pending_flats(self, ids: Iterable[int]) -> dict[int, dict[str, torch.Tensor]]:
        """The flat views (not copies) of those of ``ids`` still being written."""
        with self._lock:
            pending = self._pending  # empty (the usual case): no id is looked up
            return {i: pending[i][1].flat for i in ids if i in pending} if pending else {}

    def set_metadata(self, **values: Any) -> None:
        """Set ``metadata.json`` keys (``seed=``, ``schema=``, ...) for the next commit."""
        with self._lock:
            self._metadata.update(values)

    def check(self, trajectory: ValidatedTrajectory) -> None:
        """Raise if the file name built from ``model_weights_id`` would leave the store, or
        the layout cannot write the trajectory (its codecs)."""
        self.layout.trajectory_path(
            {"trajectory_id": 0, "model_weights_id": trajectory.trajectory.model_weights_id}
        )
        self.layout.check_writable(trajectory)

    def wait_for_room(self, count: int) -> None:
        """Block until ``count`` writes fit in the queue; refuse while storage fails."""
        self._writer.wait_for_room(count)

    def submit(self, items: Sequence[tuple[Entry, ValidatedTrajectory]]) -> None:
        """Queue the writes of ``items`` in order, holding each in memory until it is written."""
        with self._lock:
            for entry, trajectory in items:
                self._pending[int(entry["trajectory_id"])] = (dict(entry), trajectory)
        self._writer.submit([functools.partial(self._commit, dict(e), t) for e, t in items])

    def _commit(self, entry: dict[str, Any], trajectory: ValidatedTrajectory) -> None:
        """Writer thread: the data (with the writes queued behind it where the layout writes
        several as one: a pack), then (last of a burst) one log record listing the burst."""
        # A new store is first committed empty (claimed), so a crash during its first write
        # leaves a store that loads.
        if not self.index.is_claimed:
            self._record([], publish=True)
        trajectory_id = int(entry["trajectory_id"])
        # A retried task resumes at its first step not done: data and marker (once: a group
        # whose write completed is never rewritten), then the record.
        with self._lock:  # this one, then those queued behind it, in order
            written = trajectory_id not in self._pending
            queued = (
                []
                if written
                else list(itertools.islice(self._pending.values(), MAX_WRITTEN_TOGETHER))
            )
        if not written:
            if queued[0][0]["trajectory_id"] != entry["trajectory_id"]:
                queued = [(entry, trajectory)]
            # Validated once, on add: not again.
            count = self.layout.write_many(queued)
            with self._lock:
                for done, _ in queued[:count]:
                    self._unrecorded.append(done)
                    self._counter = max(self._counter, int(done["trajectory_id"]) + 1)
                    # The data is complete and readable from the store from here on.
                    self._pending.pop(int(done["trajectory_id"]), None)
        with self._lock:
            # With more writes queued behind this one, the last of them commits for all.
            last = self._writer.pending <= 1
        if last:
            self._record_unrecorded()
        if self._on_committed is not None:
            # The commit stands whatever the callback does: a failure must not make the
            # writer retry (and rewrite) a trajectory that is already listed.
            with contextlib.suppress(Exception):
                self._on_committed(trajectory_id, not last)

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
        self.index.after_burst()

    def _record(self, entries: Sequence[dict[str, Any]], publish: bool = False) -> None:
        """Append one record listing ``entries`` (whose data is complete); with ``publish``,
        flush the index writer too (RLinf's documents are rewritten)."""
        with self._lock:
            metadata = dict(self._metadata)
            counter = self._counter
        self.index.append(entries, counter=counter, metadata=metadata)
        if publish:
            self.index.flush()

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target`` (a checkpoint), whether committed or not."""
        # A trajectory still being written may be half-written in the store: save its copy.
        pending = self.pending_trajectory(int(entry["trajectory_id"]))
        if pending is not None:
            target.write(entry, pending)
        else:
            self.layout.copy_to(target, entry)

    def adopt(self, loaded: LoadedCheckpoint) -> None:
        """Make the store hold a loaded checkpoint's trajectories, so it stays self-contained
        (call it with no write queued: after flush)."""
        if not check_adoptable(loaded, self.url, self.slot):
            return
        copied = self.index.copy_in(loaded.source, loaded.share)
        counter = self.first_free_id(loaded.share.trajectory_counter)  # no write is queued
        with self._lock:
            self._counter = max(self._counter, counter)
        self._record(copied, publish=True)

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed (else :class:`WriterFailedError`
        names the trajectories), then flush the index writer."""
        try:
            self._writer.flush(timeout)
        except WriterFailedError as exc:
            with self._lock:
                waiting = sorted(self._pending)
            more = f" and {len(waiting) - 10} more" if len(waiting) > 10 else ""
            message = f"{exc}; trajectories not in the store yet: {waiting[:10]}{more}"
            raise WriterFailedError(message) from exc.__cause__
        with self._lock:
            unrecorded = [int(e["trajectory_id"]) for e in self._unrecorded]
        if unrecorded:
            raise WriterFailedError(
                f"{self.url}: trajectories {unrecorded} are written but no record lists them "
                "yet; call flush() again to retry"
            )
        self.index.flush()

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
                    self._record([], publish=True)
                self.index.fold()
        finally:
            # Without waiting, the writes left are abandoned (lost if this process ends): the
            # slot is given up as a killed writer's would be.
            self.slot.release()
