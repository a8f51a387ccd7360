"""StoreCommitter: the commit protocol, i.e. what each write does to the auto-save store.

It opens the store (appending to one that exists, refusing one it cannot append to), runs
each accepted trajectory's write on a :class:`~rbzarr.buffer.background.BackgroundWriter`
and commits in order: the trajectory's data, then its group attributes (the layout's commit
marker), then the two documents that list it, once per burst of writes.  It keeps the
in-memory copy of every trajectory until its data is complete, so sampling never waits for
storage.

While a buffer runs, this is the only writer of its store.  Deletions have two owners, and
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.background import DEFAULT_TIMEOUT, BackgroundWriter
from rbzarr.buffer.checkpoint import LoadedCheckpoint, is_rbzarr_store, schema_from_json
from rbzarr.buffer.index import TrajectoryIndex
from rbzarr.errors import CheckpointConflictError, StoreExistsError
from rbzarr.storage.backends import permanent_cause, translate_errors
from rbzarr.storage.deadlines import deadline_options
from rbzarr.storage.documents import Entry, read_documents
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import stored_format
from rbzarr.storage.writable import check_writable
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
        self._committed = self._read_existing()
        self._claimed = self.layout.has_documents()

    def _read_existing(self) -> TrajectoryIndex:
        """The index of the store already here (empty if none); sets ``stored_schema``."""
        location = self.layout.location
        with translate_errors(location.url, "opening"):
            is_file = location.fs.isfile(location.path, **deadline_options(location.fs))
        if is_file:
            raise StoreExistsError(
                f"auto_save_path {location.url} is a file: it must be a folder (new, or holding "
                "a store to append to); choose another auto_save_path"
            )
        check_writable(location)
        committed = TrajectoryIndex()
        if self.layout.has_documents():
            documents = read_documents(location)
            fmt = stored_format(documents)
            if fmt != self.layout.format:
                raise StoreExistsError(
                    f"auto_save_path {location.url} holds a {fmt!r} store and this buffer "
                    f"writes {self.layout.format!r}: build it with trajectory_format={fmt!r} to "
                    "append to that store, or choose another auto_save_path"
                )
            committed = TrajectoryIndex.from_documents(documents, location.url)
            self.stored_schema = schema_from_json(documents.metadata.get("schema"))
            if not is_rbzarr_store(documents.metadata):
                # RLinf lists ids it never saved; rbzarr's documents list only what exists.
                present = set(self.layout.list_ids())
                committed = committed.subset(i for i in committed.id_list if i in present)
        # Data the documents do not list (an interrupted write) keeps its id too.
        committed.trajectory_counter = max(
            committed.trajectory_counter, max(self.layout.list_ids(), default=-1) + 1
        )
        return committed

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
            self.layout.write_documents(documents)
            self._claimed = True
        self.layout.write(entry, trajectory)  # validated once, on add: not again
        trajectory_id = int(entry["trajectory_id"])
        with self._lock:
            committed = self._committed
            if trajectory_id not in committed.entries:
                committed.entries[trajectory_id] = entry
                committed.id_list.append(trajectory_id)
            committed.trajectory_counter = max(committed.trajectory_counter, trajectory_id + 1)
            # The data is complete and readable from the store from here on.
            self._pending.pop(trajectory_id, None)
            # With more writes queued behind this one, the last of them commits for all.
            last = self._writer.pending <= 1
            documents = committed.to_documents(self.layout.format, self._metadata)
        if last:
            self.layout.write_documents(documents)
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
        self.import_trajectories(loaded.source, loaded.share)

    def import_trajectories(self, source: TrajectoryLayout, index: TrajectoryIndex) -> None:
        """Make the store hold ``index``'s trajectories too, copied from ``source``."""
        # Call with no write queued (after flush); what the store holds already (same id and
        # uuid) is not copied again.
        with self._lock:
            known = dict(self._committed.entries)
        unlisted = set(self.layout.list_ids()) - set(known)
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
        with self._lock:
            for trajectory_id in index.id_list:
                if trajectory_id not in self._committed.entries:
                    self._committed.entries[trajectory_id] = dict(index.entries[trajectory_id])
                    self._committed.id_list.append(trajectory_id)
            self._committed.trajectory_counter = max(
                self._committed.trajectory_counter, index.trajectory_counter
            )
            documents = self._committed.to_documents(self.layout.format, self._metadata)
        self.layout.write_documents(documents)

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed."""
        self._writer.flush(timeout)

    def close(self, timeout: float = DEFAULT_TIMEOUT, wait: bool = True) -> None:
        """Stop accepting writes and wait for the queued ones."""
        self._writer.close(timeout, wait)
