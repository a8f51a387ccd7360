"""StoreCommitter: the commit protocol, i.e. what each write does to the auto-save store.

It opens the store (appending to one that exists, refusing one it cannot append to), runs
each accepted trajectory's write on a :class:`~rbzarr.buffer.background.BackgroundWriter`
and commits in order: the trajectory's data, then its group attributes (the layout's commit
marker), then the two documents that list it, once per burst of writes.  It keeps the
in-memory copy of every trajectory until its data is complete, so sampling never waits for
storage.

While a buffer runs, this is the only writer of its slot of the store
(:class:`~rbzarr.buffer.writers.WriterSlot`): other buffers may append to the same zarr
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.background import DEFAULT_TIMEOUT, BackgroundWriter
from rbzarr.buffer.checkpoint import LoadedCheckpoint, is_rbzarr_store, schema_from_json
from rbzarr.buffer.index import TrajectoryIndex
from rbzarr.buffer.writers import WriterSlot
from rbzarr.errors import CheckpointConflictError, StoreExistsError
from rbzarr.storage.backends import permanent_cause, translate_errors
from rbzarr.storage.deadlines import deadline_options
from rbzarr.storage.documents import Documents, Entry
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import stored_format
from rbzarr.storage.writable import check_writable
from rbzarr.storage.writers import COMMIT_TIMES
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["StoreCommitter"]


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
        self._metadata = dict(metadata or {})
        self._pending: dict[int, ValidatedTrajectory] = {}
        self.stored_schema: Schema | None = None
        self._commit_times: dict[int, float] = {}
        self._check_folder()
        self.slot = WriterSlot.claim(layout)
        try:
            self._committed = self._read_existing()
        except BaseException:
            self.slot.release()
            raise
        self._claimed = self.slot.has_documents()

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

    def _read_existing(self) -> TrajectoryIndex:
        """This slot's index of the store already here (empty if none); sets ``stored_schema``."""
        location = self.layout.location
        committed = TrajectoryIndex(trajectory_counter=self.slot.first_id)
        if self.layout.has_documents():
            # Every writer's documents (the union) name the store's format and schema.
            union = self.layout.read_documents()
            self._check_format(union)
            self.stored_schema = schema_from_json(union.metadata.get("schema"))
        documents = self.slot.read_documents()
        if documents is not None:
            committed = TrajectoryIndex.from_documents(documents, location.url)
            if not is_rbzarr_store(documents.metadata):
                # RLinf lists ids it never saved; rbzarr's documents list only what exists.
                present = set(self.layout.list_ids())
                committed = committed.subset(i for i in committed.id_list if i in present)
            times = documents.trajectory_index.get(COMMIT_TIMES, {})
            self._commit_times = {int(i): float(t) for i, t in times.items()}
        # Data the documents do not list (an interrupted write) keeps its id too.
        stored = [i for i in self.layout.list_ids() if self.slot.owns(i)]
        committed.trajectory_counter = max(
            committed.trajectory_counter, self.slot.first_id, max(stored, default=-1) + 1
        )
        return committed

    def _check_format(self, documents: Documents) -> None:
        """Refuse a store of another format than this buffer writes."""
        fmt = stored_format(documents)
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
            return max(self._committed.trajectory_counter, max(self._pending, default=-1) + 1)

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
            return self._pending.get(trajectory_id)

    def committed_shapes(self) -> list[tuple[int, int]]:
        """``(T, B)`` of every trajectory committed to the store."""
        with self._lock:
            return [tuple(e["shape"][:2]) for e in self._committed.entries.values()]

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
        """Raise if the file name built from ``model_weights_id`` would leave the store."""
        self.layout.trajectory_path(
            {"trajectory_id": 0, "model_weights_id": trajectory.trajectory.model_weights_id}
        )

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
        """Writer thread: the data, then (last of a burst) the documents that list it."""
        # A new store is first committed empty (claimed), so a crash during its first write
        # leaves a store that loads.
        if not self._claimed:
            with self._lock:
                documents = self._committed.to_documents(self.layout.format, self._metadata)
                times = dict(self._commit_times)
            self.slot.write_documents(documents, times)
            self._claimed = True
        self.layout.write(entry, trajectory)  # validated once, on add: not again
        trajectory_id = int(entry["trajectory_id"])
        with self._lock:
            committed = self._committed
            if trajectory_id not in committed.entries:
                committed.entries[trajectory_id] = entry
                committed.id_list.append(trajectory_id)
                self._commit_times[trajectory_id] = time.time()
            committed.trajectory_counter = max(committed.trajectory_counter, trajectory_id + 1)
            # The data is complete and readable from the store from here on.
            self._pending.pop(trajectory_id, None)
            # With more writes queued behind this one, the last of them commits for all.
            last = self._writer.pending <= 1
            documents = committed.to_documents(self.layout.format, self._metadata)
            times = dict(self._commit_times)
        if last:
            self.slot.write_documents(documents, times)
        if self._on_committed is not None:
            # The commit stands whatever the callback does: a failure must not make the
            # writer retry (and rewrite) a trajectory that is already listed.
            with contextlib.suppress(Exception):
                self._on_committed(trajectory_id)

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
        if loaded.source.location.url == self.url and loaded.is_partial:
            raise CheckpointConflictError(
                f"{self.url}: a rank's share cannot continue in place in the shared "
                "auto_save store: ranks appending to one store would write the same new ids; "
                "give each rank its own auto_save_path"
            )
        share = loaded.share
        if loaded.source.location.url == self.url:
            # Continuing in place: other writers' trajectories stay listed by their documents.
            share = share.subset(i for i in share.id_list if self.slot.owns(i))
        elif self.slot.slot != 0 and not all(self.slot.owns(i) for i in share.id_list):
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
        with self._lock:
            known = dict(self._committed.entries)
        unlisted = {i for i in self.layout.list_ids() if self.slot.owns(i)} - set(known)
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
        for trajectory_id in index.id_list:
            if trajectory_id not in known:
                source.copy_to(self.layout, index.entries[trajectory_id])
        counter = self.first_free_id(index.trajectory_counter)
        with self._lock:
            for trajectory_id in index.id_list:
                if trajectory_id not in self._committed.entries:
                    self._committed.entries[trajectory_id] = dict(index.entries[trajectory_id])
                    self._committed.id_list.append(trajectory_id)
                    self._commit_times[trajectory_id] = time.time()
            self._committed.trajectory_counter = counter
            documents = self._committed.to_documents(self.layout.format, self._metadata)
            times = dict(self._commit_times)
        self.slot.write_documents(documents, times)

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed."""
        self._writer.flush(timeout)

    def close(self, timeout: float = DEFAULT_TIMEOUT, wait: bool = True) -> None:
        """Stop accepting writes, wait for the queued ones (unless ``wait`` is false), then
        give the writer slot up."""
        self._writer.close(timeout, wait)
        # Without waiting, the writes left are abandoned (lost if this process ends): the
        # slot is given up as a killed writer's would be.
        self.slot.release()
