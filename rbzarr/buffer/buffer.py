"""TrajectoryReplayBuffer: RLinf's trajectory buffer, rebuilt on Zarr.

The buffer is a coordinator.  It validates, takes its lock and delegates: ids and counters
to :class:`~rbzarr.storage.index.trajectory_index.TrajectoryIndex`, sampling to its
:class:`~rbzarr.sampling.reader.StoreReader`, hot rows to
:class:`~rbzarr.buffer.cache.RowCache`, persistence to the
:class:`~rbzarr.buffer.commits.StoreCommitter`, and checkpoints to
:mod:`rbzarr.buffer.checkpoint`.  RLinf's other names for its calls come from
:class:`~rbzarr.buffer.rlinf_compat.RLinfCompatMixin`.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Self

import torch

from rbzarr.buffer import checkpoint, manifest, references
from rbzarr.buffer.background import DEFAULT_TIMEOUT
from rbzarr.buffer.cache import RowCache
from rbzarr.buffer.commits import StoreCommitter
from rbzarr.buffer.held import BufferRows
from rbzarr.buffer.local_cache_settings import LocalCacheSettings
from rbzarr.buffer.read_ahead import ReadAhead
from rbzarr.buffer.rlinf_compat import RLinfCompatMixin
from rbzarr.errors import BufferClosedError, CheckpointNotFoundError, TrajectoryListError
from rbzarr.fork_safe import hold_across_fork
from rbzarr.sampling.arguments import check_count, check_window_size
from rbzarr.sampling.damaged import check_on_damaged
from rbzarr.sampling.front import SamplingFront
from rbzarr.sampling.priorities import PrioritizedReplay, WindowPriorities, check_priorities
from rbzarr.sampling.reader import StoreReader
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.index.priorities import PriorityChanges, PriorityFiles
from rbzarr.storage.index.retention import Retention, check_retention
from rbzarr.storage.index.schema import schema_to_json
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.finite import check_finite
from rbzarr.trajectory.model import Schema, Trajectory
from rbzarr.trajectory.validated import ValidatedTrajectory, clone_trajectory

__all__ = ["TrajectoryReplayBuffer"]

DEFAULT_FORMAT = "zarr"
# Staged bytes after which an add queues the trajectories copied so far (see
# add_trajectories): a trajectory of 128 px camera frames (~30 MiB) is queued alone.
PIPELINED_BYTES = 1 << 23


def _listed(trajectories: object) -> list[Trajectory]:
    """``trajectories`` as a list; refuse what is not a collection of trajectories.

    Raises
    ------
    TrajectoryListError
        ``trajectories`` is a string, bytes, a mapping or not iterable (e.g. one trajectory).
    """
    if isinstance(trajectories, str | bytes | Mapping) or not isinstance(trajectories, Iterable):
        raise TrajectoryListError(
            "add_trajectories takes a list of trajectories, got "
            f"{type(trajectories).__name__}: pass [trajectory] to add one; nothing was added"
        )
    return list(trajectories)


def _spared(reader: StoreReader, saving: set[int]) -> frozenset[int]:
    """Writer thread, before a collection: the ids it must keep (the window, and those a
    checkpoint being saved names before its pin is written)."""
    with reader.lock:
        return reader.spared_ids() | saving


def _materialize(
    lock: threading.RLock, cache: RowCache, trajectory_id: int, more_queued: bool
) -> None:
    """Writer thread, after a commit: copy the trajectory's rows into the cache, if the
    writer has nothing else queued and the cache is free."""
    # The writer never waits for the buffer, nor spends its time on copies while writes
    # wait behind it: while another thread holds the lock (a sample, a checkpoint being
    # saved) or writes are queued, the rows stay shared and are copied when first read (or
    # never, when evicted first).
    if not more_queued and lock.acquire(blocking=False):
        try:
            cache.materialize(trajectory_id)
        finally:
            lock.release()


class TrajectoryReplayBuffer(SamplingFront, RLinfCompatMixin):
    """A trajectory-level replay buffer with window sampling, a FIFO cache and async writes.

    Parameters
    ----------
    seed
        Seed of the sampling generator; ``None`` draws nondeterministically.
    enable_cache, cache_size
        Keep the last ``cache_size`` trajectories in memory.  Without ``auto_save`` the
        cache *is* the storage: it is always on and holds ``sample_window_size``
        trajectories (all of them when that is 0).
    sample_window_size
        Sample from the most recent trajectories only; 0 or negative means all.
    auto_save, auto_save_path
        Persist every trajectory asynchronously under ``auto_save_path`` (a local path or
        an fsspec URL such as ``s3://bucket/prefix``).  A store already there is appended
        to, never overwritten: new trajectories get ids after every id it holds.
    trajectory_format
        ``"zarr"``, ``"pt"`` or ``"pkl"``; by default the format of the store at
        ``auto_save_path``, else ``"zarr"``.
    storage_options
        Passed to fsspec for every URL (``endpoint_url``, ``key``, ``anon``, ...).
    max_pending_writes
        Bound of the write queue: ``add_trajectories`` waits while it is full (then until
        at most half of it is left, so that adding and writing alternate in runs, not on
        every trajectory), and is refused (nothing changed) while it is full and storage
        is failing.
    layout_options
        Extra keyword arguments for the storage layout (codecs, chunk sizes, ...).
    prefetch
        Batches that :meth:`sample` draws ahead and reads on as many threads while the
        caller trains (0: none).  The batches handed out are exactly those without
        prefetch: see :meth:`sample`.
    local_cache_dir, local_cache_bytes
        For a zarr store on an object store (``s3://...``): keep whole shards in this local
        directory, up to ``local_cache_bytes`` (default 16 GiB).  Trajectories are fetched
        once (ahead, as they enter the sample window, or on first miss) and then read from
        the local copies at local-disk speed; what this buffer writes goes there too, so
        its own misses make no request.  Processes may share the directory.  Ignored for a
        local store (read in place).  See docs/s3.md.
    check_finite
        Refuse trajectories holding NaN or inf in any float field
        (:class:`~rbzarr.errors.InvalidTrajectoryError` naming the fields and counts,
        nothing changed).  Off by default, as in RLinf: non-finite values are stored as
        they are, and ``rbzarr stats`` counts them per key.
    on_damaged
        What sampling does when a stored trajectory's data is damaged or missing:
        ``"raise"`` (default) raises :class:`~rbzarr.errors.CorruptStoreError`;
        ``"skip"`` drops the trajectory from the index as if evicted (the store is left
        as it is), warns once (:class:`~rbzarr.errors.DamagedTrajectoryWarning`, naming
        the id and the path), lists it in ``get_stats()["damaged_trajectories"]`` and
        draws the batch again from the same generator state, so the batches stay
        deterministic.  Unavailable storage still raises, and so does data this process
        cannot decode (:class:`~rbzarr.errors.CodecUnavailableError`: its codec's package
        is missing; it is not damaged).
    durable
        With ``auto_save``: :meth:`flush` returns only when what it committed survives a
        machine crash (locally every file, index record and folder is ``fsync``-ed; on S3 a
        completed PUT is durable).  Off by default: a crash of the machine (not of the
        process) may lose the last commits.
    prioritized
        Proportional prioritized replay (:class:`~rbzarr.PrioritizedReplay`: ``alpha``,
        ``beta``, ``eps``): :meth:`sample` draws rows and :meth:`sample_sequences` starts by
        priority, :meth:`update_priority` sets them, and with ``auto_save`` :meth:`flush`
        stores them (see docs/priorities.md).  ``None`` (default): uniform, as RLinf.
    retention
        With ``auto_save`` to a zarr store: what the store keeps of what this buffer writes
        (:class:`~rbzarr.Retention`: the last ``N`` trajectories and/or ``N`` bytes, and a
        grace period; an int ``N``: the last ``N``).  The writer collects as it appends:
        trajectories beyond it leave the index (and this buffer's) and their data is
        deleted after the grace period, except those a checkpoint pins and those in the
        sample window.  ``None`` (default): the store keeps everything, as RLinf.  See
        docs/checkpoints.md.

    Raises
    ------
    ValueError
        ``prefetch`` is given with ``prioritized`` (batches drawn ahead would miss the
        updates made meanwhile),
        ``trajectory_format`` is not a registered format, ``auto_save`` is set without
        ``auto_save_path``, ``prefetch`` or ``cache_size`` is negative, ``seed`` is outside
        what ``torch.manual_seed`` takes (``-2**63`` to ``2**64 - 1``), ``local_cache_dir``
        is given for a pt/pkl store, ``local_cache_bytes`` is not positive or smaller
        than one of the store's trajectories, or ``on_damaged`` is not ``"raise"`` or
        ``"skip"``, or ``retention`` is invalid, given without ``auto_save`` or for a pt /
        pkl store, or keeps fewer trajectories than ``sample_window_size``.
    TypeError
        ``seed``, ``cache_size`` or ``sample_window_size`` is not an int.
    StoreNotWritableError
        ``auto_save_path`` cannot be written (an ``OSError``): locally under a file,
        read-only or without permission; on S3 no such bucket or access denied.
    StoreExistsError
        ``auto_save_path`` is a file, or holds a store of another ``trajectory_format``.
    CodecUnavailableError
        ``layout_options`` names an image codec, or the store to append to records one,
        and imagecodecs cannot be imported (an ``ImportError``).

    Warns
    -----
    UserWarning
        ``auto_save_path`` is given without ``auto_save=True``: it is ignored.
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        sample_window_size: int = 100,
        auto_save: bool = False,
        auto_save_path: str | os.PathLike[str] = "",
        trajectory_format: str | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        max_pending_writes: int = 8,
        layout_options: Mapping[str, Any] | None = None,
        prefetch: int = 0,
        local_cache_dir: str | os.PathLike[str] | None = None,
        local_cache_bytes: int | None = None,
        check_finite: bool = False,
        on_damaged: str = "raise",
        durable: bool = False,
        prioritized: PrioritizedReplay | None = None,
        retention: Retention | int | None = None,
    ) -> None:
        sample_window_size = check_window_size(sample_window_size)
        kept = Retention.of(retention)
        check_retention(kept, auto_save, sample_window_size)
        if prioritized is not None and prefetch:
            raise ValueError(
                f"prefetch={prefetch} cannot be used with prioritized replay: batches drawn "
                "ahead would miss the priorities updated meanwhile; use prefetch=0"
            )
        check_on_damaged(on_damaged)
        # The index, cache, schema and samplers; a forked DataLoader worker reads ids under it.
        self._lock = hold_across_fork(threading.RLock())
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0 batches, got {prefetch}")
        if trajectory_format is not None:
            layout_class(trajectory_format)  # unknown formats fail here, before anything else
        check_count("cache_size", cache_size, minimum=0)
        if auto_save and not os.fspath(auto_save_path):
            raise ValueError("auto_save=True requires auto_save_path (a local path or URL)")
        if not auto_save and os.fspath(auto_save_path):
            warnings.warn(
                f"auto_save_path={os.fspath(auto_save_path)!r} is ignored without auto_save=True: "
                "nothing is written there; pass auto_save=True to keep the trajectories",
                UserWarning,
                stacklevel=2,
            )
        self.auto_save = auto_save
        self.check_finite = check_finite
        self.storage_options = dict(storage_options or {})
        self.layout_options = dict(layout_options or {})
        self.local_cache = LocalCacheSettings.of(local_cache_dir, local_cache_bytes)
        self.trajectory_format = trajectory_format or DEFAULT_FORMAT
        if not auto_save:
            # The cache is the storage: it must hold the whole sampling window.
            capacity: int | None = sample_window_size if sample_window_size > 0 else None
        else:
            capacity = max(cache_size, 0) if enable_cache else 0
        self._cache = RowCache(capacity)
        self._add_lock = threading.Lock()  # serialises adders, loads, clear and close
        self._closed = False
        location = Location.from_url(auto_save_path, self.storage_options) if auto_save else None
        if location is not None and durable:
            location = location.with_durable()
        # The store as it is now: one read, shared by the committer and the messages.
        store = None if location is None else StoreIndex.open(location)
        if store is not None and trajectory_format is None:
            self.trajectory_format = store.format or DEFAULT_FORMAT
        # The format layout_options are meant for (loading may adopt another one).
        self._options_format = self.trajectory_format
        self.local_cache.check_layout(layout_class(self.trajectory_format))
        self.retention = self._checked_retention(kept)
        self._saving: set[int] = set()  # ids a manifest being saved names (under the lock)
        self._committer: StoreCommitter | None = None
        if location is not None:
            self._committer = StoreCommitter(
                self._layout(location, self.trajectory_format),
                max_pending_writes=max_pending_writes,
                metadata={"seed": seed},
                # Not a bound method: the writer would keep the whole buffer alive.
                on_committed=functools.partial(_materialize, self._lock, self._cache),
                store=store,
            )
        self._index = TrajectoryIndex(trajectory_counter=self._first_free_id())
        self._reader = StoreReader(
            self._index,
            None if self._committer is None else self._committer.layout,
            seed=seed,
            window_size=sample_window_size,
            on_damaged=on_damaged,
            where=self.store_url or "",
            empty=self._empty_message(store is not None and store.exists),
            schema=None if self._committer is None else self._committer.stored_schema,
            held=BufferRows(self._cache, self._committer, self._lock),
            lock=self._lock,
            read_ahead=functools.partial(ReadAhead, prefetch, lock=self._lock)
            if prefetch
            else None,
            prioritized=prioritized,
            saves_priorities=self._committer is not None,
        )
        self._read_ahead = self._reader.ahead
        self._sampler_at_open = self._sampler_state()
        # The store's priority change record (this buffer writes it at each flush).
        self._priority_changes = (
            None if self._committer is None else PriorityChanges(self._committer.layout.location)
        )
        if self._committer is not None:
            self.local_cache.check_shapes(self._schema, [(self._committer.index.max_rows, 1)])
            self._start_retention()

    # -- plumbing -----------------------------------------------------------------------
    def _sampler_state(self) -> dict[str, Any]:
        """Both samplers' state, JSON-ready, as a checkpoint's ``sampler`` holds it."""
        state = {**self._reader.rows.state_dict(), "sequences": self._reader.sequences.state_dict()}
        if self._reader.index_base:
            state["index_base"] = self._reader.index_base
        return state

    def _empty_message(self, store_exists: bool) -> str:
        """Why sampling an empty buffer fails, and what to do (a store may hold a run)."""
        message = "cannot sample from an empty buffer: add trajectories first"
        if self._committer is None or not store_exists:
            return message
        url = self._committer.url
        return (
            f"{message}, or load_checkpoint({url!r}) to sample the trajectories its "
            "auto_save_path already holds (a new buffer samples only what it adds or loads)"
        )

    def _layout(self, location: Location, trajectory_format: str) -> TrajectoryLayout:
        """A layout at ``location``; this buffer's layout options apply to its format only."""
        options = self.layout_options if trajectory_format == self._options_format else {}
        layout = layout_class(trajectory_format)
        return layout(location, **options, **self.local_cache.layout_options(layout))

    def _checked_retention(self, retention: Retention | None) -> Retention | None:
        """``retention``, if this buffer's store can collect (a zarr store's log).

        Raises
        ------
        ValueError
            The store is a pt / pkl store (RLinf's documents, no log).
        """
        if (
            retention is not None
            and not layout_class(self.trajectory_format).capabilities.many_writers
        ):
            raise ValueError(
                f"retention needs a zarr store (its index is a log); this buffer writes a "
                f"{self.trajectory_format!r} store"
            )
        return retention

    def _start_retention(self) -> None:
        """Have the store's writer collect as it appends (with ``retention``)."""
        if self.retention is not None and self._committer is not None:
            self._committer.index.retain(
                self.retention,
                protected=functools.partial(_spared, self._reader, self._saving),
                on_removed=self._reader.drop_collected,
            )

    def _first_free_id(self) -> int:
        return 0 if self._committer is None else self._committer.next_id

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError("the buffer is closed")

    def _window_changed(self) -> None:
        self._reader.window_changed()

    @property
    def _schema(self) -> Schema | None:
        """The schema of the trajectories held (the reader's)."""
        return self._reader.schema

    @_schema.setter
    def _schema(self, schema: Schema | None) -> None:
        self._reader.schema = schema

    def _set_store_metadata(self) -> None:
        if self._committer is not None:
            self._committer.set_metadata(seed=self.seed, schema=schema_to_json(self._schema))

    # -- settings -----------------------------------------------------------------------
    @property
    def seed(self) -> int | None:
        """The seed of the sampling generator."""
        return self._reader.rows.seed

    @property
    def prefetch(self) -> int:
        """Batches :meth:`sample` draws and reads ahead (0: none)."""
        return 0 if self._read_ahead is None else self._read_ahead.depth

    @property
    def on_damaged(self) -> str:
        """What sampling does with a damaged trajectory: ``"raise"`` or ``"skip"``."""
        return self._reader.damaged.policy

    @property
    def enable_cache(self) -> bool:
        """Whether trajectories are kept in memory."""
        return self._cache.enabled

    @property
    def cache_size(self) -> int:
        """How many trajectories the cache keeps (0 for "all" without ``auto_save``)."""
        return self._cache.capacity or 0

    # -- size and counters -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    @property
    def size(self) -> int:
        """Number of trajectories in the index."""
        return len(self._index)

    @property
    def total_samples(self) -> int:
        """Number of samples (``T * B`` summed) in the index."""
        with self._lock:
            return self._index.total_samples

    @property
    def trajectory_counter(self) -> int:
        """The id the next trajectory will get."""
        return self._index.trajectory_counter

    # -- adding and sampling ------------------------------------------------------------
    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> None:
        """Add trajectories in order; all are validated before any state changes.

        The caller may reuse or mutate the tensors as soon as this returns.  With
        ``auto_save``, each trajectory is queued for a background write that is retried
        until it commits; a large one is queued (and may be sampled by another thread) as
        soon as it is copied, before the call returns.  So if a later copy fails (out of
        memory), those queued stay added: the error's note says how many.

        Parameters
        ----------
        trajectories
            :class:`~rbzarr.trajectory.model.Trajectory` objects (or any with the same fields).

        Raises
        ------
        InvalidTrajectoryError
            A trajectory is malformed, holds NaN or inf with ``check_finite=True``, or
            disagrees with the buffer's schema, or
            ``trajectories`` is not a list of them (:class:`~rbzarr.errors.TrajectoryListError`,
            also a ``TypeError``, e.g. for one trajectory not in a list): nothing changed.
        InvalidCodecError
            With ``auto_save``: a codec of ``layout_options`` cannot encode its key (an
            image codec on floats or on a non-image shape) or names a key the trajectories
            do not have (a ``ValueError``): nothing changed, nothing written.
        CodecUnavailableError
            With ``auto_save``: a key's codec needs a package this process cannot import
            (an ``ImportError`` naming it): nothing changed, nothing written.
        WriterFailedError
            Storage is failing and the write queue is full: none of these trajectories was
            added (nothing changed); they are accepted again once queued writes commit.
        BufferClosedError
            The buffer is closed.
        """
        trajectories = _listed(trajectories)
        with self._add_lock:
            self._check_open()
            accepted = self._validate_all(trajectories)
            if not accepted:
                return
            self.local_cache.check_trajectories(accepted)
            if self._committer is None:
                with self._lock:
                    self._adopt_schema(accepted[0])
                    items = [(self._index_entry(t), t) for t in accepted]
                    self._window_changed()
                    for entry, trajectory in items:  # the caller's tensors: the cache copies
                        self._cache.put(
                            entry["trajectory_id"],
                            trajectory.flat,
                            trajectory.residue,
                            trajectory.spec.B,
                        )
                return
            self._committer.wait_for_room(len(accepted))
            # The one copy, made here: trajectories are queued as soon as their copies
            # stage PIPELINED_BYTES, so the writer writes them while the next are copied
            # (and their memory is freed for those); small ones are queued together, for one
            # index record.  The cache shares each copy with the writer.
            staged: list[ValidatedTrajectory] = []
            nbytes = 0  # what ``staged`` stages (a running sum: no pass over it per add)
            queued = 0
            for position, validated in enumerate(accepted):
                try:
                    copied = validated.copied()
                except BaseException as exc:  # out of memory: those queued before stay added
                    if queued:
                        exc.add_note(
                            f"add_trajectories: the first {queued} of these {len(accepted)} "
                            "trajectories were added (queued for writing) before this copy "
                            f"failed; the other {len(accepted) - queued} were not"
                        )
                    raise
                staged.append(copied)
                nbytes += sum(buffer.nbytes for buffer in copied.staging.values())
                if nbytes >= PIPELINED_BYTES or position == len(accepted) - 1:
                    self._queue_staged(staged)
                    queued += len(staged)
                    staged, nbytes = [], 0

    def _queue_staged(self, staged: list[ValidatedTrajectory]) -> None:
        """Put copied trajectories in the window and the cache, and queue their writes."""
        assert self._committer is not None
        with self._lock:
            self._adopt_schema(staged[0])
            items = [(self._index_entry(t), t) for t in staged]
            self._window_changed()
            for entry, trajectory in items:
                self._cache.put_shared(entry["trajectory_id"], trajectory)
            self._committer.submit(items)

    def _adopt_schema(self, trajectory: ValidatedTrajectory) -> None:
        """The first trajectory's schema becomes the buffer's (under ``_lock``)."""
        if self._schema is None:
            self._schema = trajectory.spec.schema
            self._set_store_metadata()

    def add_committed(self, notices: Iterable[references.Notice]) -> None:
        """Add, by reference, trajectories other writers committed to this buffer's store.

        Each notice (:func:`~rbzarr.distributed.commit_notices`) carries only an index
        entry: no rows are read or copied now.  Each takes its place in the cache at once
        and is read whole from the store into it when a draw first needs its rows, so the
        window, the draws and (once read) the cache are those of a buffer that added the
        same trajectories in notice order.

        Parameters
        ----------
        notices
            :class:`~rbzarr.distributed.CommitNotice` objects of this buffer's
            ``auto_save_path``.

        Raises
        ------
        ValueError
            The buffer has no auto-save store to read the trajectories from.
        InvalidTrajectoryError
            A notice names another store or an id already in the buffer: nothing added.
        CheckpointNotFoundError
            A notice's trajectory has no committed data in the store: nothing added.
        BufferClosedError
            The buffer is closed.
        """
        with self._add_lock:
            self._check_open()
            if self._committer is None:
                raise ValueError(
                    "add_committed needs auto_save=True on the writers' store: the rows are "
                    "read from there"
                )
            layout = self._committer.layout
            entries = references.check_notices(notices, layout, self._index, self.storage_options)
            schema = self._schema or references.store_schema(layout)
            with self._lock:
                self._schema = schema
                for entry in entries:
                    self._index.add_reference(entry)
                    self._cache.reserve(int(entry["trajectory_id"]))

    def _index_entry(self, trajectory: ValidatedTrajectory) -> IndexEntry:
        raw = trajectory.trajectory
        return self._index.new_entry(
            trajectory.spec.shape, raw.max_episode_length, raw.model_weights_id
        )

    def _validate_all(self, trajectories: list[Trajectory]) -> list[ValidatedTrajectory]:
        """Every check of every trajectory, before anything changes (under ``_add_lock``)."""
        schema = self._schema
        accepted: list[ValidatedTrajectory] = []
        for position, trajectory in enumerate(trajectories):
            try:
                validated = ValidatedTrajectory.check(trajectory, schema)
                self._cache.check(validated.spec.schema)
                if self.check_finite:
                    check_finite(validated.flat)
                if self._committer is not None:
                    self._committer.check(validated)
            except ValueError as exc:
                raise type(exc)(f"trajectory {position} of this call: {exc}") from exc
            schema = validated.spec.schema if schema is None else schema
            accepted.append(validated)
        return accepted

    def _sampling_reader(self) -> StoreReader:
        """The reader :meth:`sample` and :meth:`sample_sequences` draw from."""
        return self._reader

    # -- priorities ---------------------------------------------------------------------
    @property
    def prioritized(self) -> PrioritizedReplay | None:
        """The prioritized replay settings (``None``: uniform); ``beta`` may be changed."""
        priorities = self._reader.priorities
        return None if priorities is None else priorities.settings

    def _priorities(self) -> WindowPriorities:
        priorities = self._reader.priorities
        if priorities is None:
            raise ValueError(
                "update_priority needs a prioritized buffer: pass "
                "prioritized=PrioritizedReplay(...) to TrajectoryReplayBuffer"
            )
        return priorities

    def update_priority(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of sampled rows (vectorised).

        Parameters
        ----------
        indices
            Global row indices, as ``sample(..., return_info=True)`` returns them in
            ``info["index"]`` (any integer array or tensor).  Those of rows that left the
            window are ignored and counted in ``get_stats()["stale_priority_updates"]``.
            A repeated index takes its last priority.
        priorities
            One finite float ``>= 0`` per index (or one for all).

        Raises
        ------
        ValueError
            The buffer is not ``prioritized``, the lengths differ, a priority is negative
            or not finite, or an index is negative or past its trajectory's rows: nothing
            was updated.
        """
        window = self._priorities()
        index, values = check_priorities(indices, priorities)
        with self._lock:
            self._reader.sync_priorities()
            window.update(self._reader.row_index(index), values)

    def get_priority(self, indices: Any) -> torch.Tensor:
        """The priorities of rows by global index.

        Parameters
        ----------
        indices
            Global row indices (``info["index"]`` of :meth:`sample`).

        Returns
        -------
        torch.Tensor
            float32, one per index; NaN for rows not in the window.

        Raises
        ------
        ValueError
            The buffer is not ``prioritized``, or an index is negative.
        """
        window = self._priorities()
        index, _ = check_priorities(indices, 0.0)
        with self._lock:
            self._reader.sync_priorities()
            return torch.from_numpy(window.get(self._reader.row_index(index)))

    def _save_priorities(self) -> None:
        """Write the priorities changed since the last save to the store (without the lock),
        then the change record listing them; those not written stay to be saved by the next
        flush, those not recorded to be recorded by it."""
        window = self._reader.priorities
        if window is None or self._committer is None:
            return
        with self._lock:
            unsaved = window.unsaved()
        changes = self._priority_changes
        assert changes is not None  # made with the committer
        files = PriorityFiles(self._committer.layout.location)
        left = list(unsaved)
        try:
            for trajectory_id in list(left):
                files.write(trajectory_id, unsaved[trajectory_id])
                left.remove(trajectory_id)
        finally:
            if left:
                with self._lock:
                    window.unsave({i: unsaved[i] for i in left})
            written = [i for i in unsaved if i not in left]
            if written or changes.unrecorded:
                changes.record(written)

    # -- reading (rlinf_compat builds RLinf's names on these) -------------------------
    @property
    def trajectory_ids(self) -> list[int]:
        """Ids in the index, in insertion order (a copy)."""
        with self._lock:
            return list(self._index.id_list)

    @property
    def index_entries(self) -> dict[int, dict[str, Any]]:
        """The index entry of every listed trajectory, by id, in insertion order (copies)."""
        with self._lock:
            return {i: dict(self._index.entries[i]) for i in self._index.id_list}

    @property
    def generator(self) -> torch.Generator:
        """The generator :meth:`sample` draws from."""
        return self._reader.rows.generator

    @property
    def store_url(self) -> str | None:
        """The auto-save store's path or URL; ``None`` without ``auto_save``."""
        return None if self._committer is None else self._committer.url

    def trajectory(self, trajectory_id: int) -> Trajectory:
        """The raw ``[T, B, ...]`` trajectory ``trajectory_id`` (copies), from memory or storage.

        Parameters
        ----------
        trajectory_id
            An id in the index.

        Returns
        -------
        Trajectory
            From the cache, the pending writes, or else read from the store.

        Raises
        ------
        KeyError
            If ``trajectory_id`` is not in the index.
        """
        with self._lock:
            if trajectory_id not in self._index.entries:
                raise KeyError(f"trajectory {trajectory_id} is not in the buffer")
            if trajectory_id in self._cache:
                return self._cache.trajectory(trajectory_id)
            entry = dict(self._index.entries[trajectory_id])
        assert self._committer is not None  # not cached: pending or committed to the store
        pending = self._committer.pending_trajectory(trajectory_id)
        if pending is not None:
            return clone_trajectory(pending.trajectory)
        return self._committer.layout.read(entry)

    def release_cache(self) -> None:
        """Free the cached trajectories; with ``auto_save`` they are read from storage.

        Without ``auto_save`` the cache holds the only copy, so the buffer is emptied as by
        :meth:`clear`.
        """
        if self._committer is None:
            self.clear()
            return
        with self._lock:
            self._cache.clear()

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, save_path: str | os.PathLike[str], copy: bool | None = None) -> None:
        """Save the current window (without ``auto_save``, the cached trajectories).

        Parameters
        ----------
        save_path
            A new folder or URL; the buffer itself is not changed.
        copy
            ``True``: a self-contained copy of the trajectories (RLinf's checkpoint).
            ``False``: a manifest, ``<save_path>/checkpoint.json``, that names the window's
            trajectories in the ``auto_save`` zarr store and pins them there, so nothing it
            names is ever deleted (kilobytes, whatever the trajectories weigh; ``rbzarr
            checkpoint materialize`` copies one later, ``rbzarr checkpoint drop`` unpins).
            ``None`` (default): a manifest for a buffer with a zarr ``auto_save`` store, a
            copy otherwise (pt / pkl stores keep RLinf's copies; without ``auto_save`` the
            cache holds the only copy).  An empty window is always saved as a copy (its two
            small documents): there is nothing to name.

        Notes
        -----
        The saved set is the one at the call.  A copy is written while sampling and adds go
        on; without ``auto_save`` the cached trajectories are copied in memory first (the
        cache is their only copy).  A manifest waits until the window's trajectories are
        committed (as :meth:`flush`), then writes the pin and the manifest.
        :meth:`load_checkpoint` of either draws the same batches.

        Raises
        ------
        ValueError
            ``copy=False`` for a buffer without a zarr ``auto_save`` store.
        CheckpointConflictError
            ``save_path`` is the ``auto_save_path``.
        StoreExistsError
            ``save_path`` holds a store or a checkpoint already.
        WriterFailedError
            ``copy=False``: the window's trajectories could not be committed (nothing saved).
        """
        has_zarr_store = self._committer is not None and self.trajectory_format == "zarr"
        if copy is False and not has_zarr_store:
            raise ValueError(
                "save_checkpoint(copy=False) names trajectories in a zarr auto_save store, "
                f"and this buffer has none (auto_save={self.auto_save}, trajectory_format="
                f"{self.trajectory_format!r}); save a copy (copy=True or the default)"
            )
        target = self._layout(
            Location.from_url(save_path, self.storage_options), self.trajectory_format
        )
        by_reference = has_zarr_store and copy is not True
        checkpoint.check_target(
            target, None if self._committer is None else self._committer.url, by_reference
        )
        # The saved set is the one at save time: its entries (and, without a store, copies of
        # the cached trajectories) are taken under the lock.  The copies into the checkpoint
        # (perhaps to S3) run without it, so sampling and adds go on meanwhile: committed
        # data never changes, and the committer keeps a pending trajectory's own copy.
        with self._lock:
            if self._committer is not None:
                ids = self._index.window(self.sample_window_size)
            else:
                ids = self._cache.ids()
            priorities = self._reader.priorities
            sampler = self._sampler_state()
            if priorities is not None:
                sampler["priorities"] = priorities.state()
            metadata = {
                "seed": self.seed,
                "schema": schema_to_json(self._schema),
                "sampler": sampler,
            }
            held = {} if priorities is None else priorities.held(ids)
            saved = self._index.subset(ids)
            if by_reference:
                self._saving.update(ids)  # a collection keeps them until their pin exists
            cached = (
                {} if self._committer is not None else {i: self._cache.trajectory(i) for i in ids}
            )
        if by_reference and ids and self._committer is not None:
            try:
                self._committer.flush()  # a manifest names committed trajectories only
                manifest.write(target.location, self._committer.layout, saved, metadata, held)
            finally:
                with self._lock:
                    self._saving.difference_update(ids)
            return
        # Before the copy's index (its commit): a checkpoint that lists them has them.
        files = PriorityFiles(target.location)
        for trajectory_id, values in held.items():
            files.write(trajectory_id, values)
        checkpoint.save(target, saved, metadata, functools.partial(self._copy_trajectory, cached))

    def _copy_trajectory(
        self, cached: Mapping[int, Trajectory], target: TrajectoryLayout, entry: Entry
    ) -> None:
        if self._committer is None:
            target.write(entry, cached[int(entry["trajectory_id"])])
        else:
            self._committer.copy_to(target, entry)

    def load_checkpoint(
        self,
        load_path: str | os.PathLike[str],
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
        *,
        strict: bool = False,
        follow_links: bool = False,
    ) -> None:
        """Replace the buffer's state by a checkpoint's, or by this rank's share of it.

        With ``auto_save``, the store keeps everything it held and gains the loaded
        trajectories it lacks; new ids continue after every id in the store.

        Parameters
        ----------
        load_path
            The checkpoint's folder or URL (its stored format is adopted).
        is_distributed, local_rank, world_size
            Load only this rank's share of the id list.
        strict
            Refuse an RLinf checkpoint that lists ids without data, instead of skipping them
            with a warning.
        follow_links
            Read a local checkpoint through symbolic links inside it (only a trusted one whose
            folders were linked on purpose); without it such a link raises
            :class:`~rbzarr.errors.UnsafePathError`.

        Raises
        ------
        CheckpointNotFoundError
            A document or listed data is missing, or ``load_path`` is a file.
        CheckpointConflictError
            A rank's share cannot continue in the shared auto-save store.
        StoreExistsError
            The auto-save store holds other trajectories under the checkpoint's ids.
        """
        location = Location.from_url(load_path, self.storage_options, follow_links=follow_links)
        if location.is_local and os.path.isfile(location.path):
            raise CheckpointNotFoundError(f"load_checkpoint: {location.absence()}")
        share_of = (local_rank, world_size) if is_distributed else None
        committer = self._committer
        own = committer.index if committer is not None and committer.url == location.url else None
        loaded = checkpoint.load(
            location,
            self._layout,
            share_of=share_of,
            warm_capacity=self._cache.capacity,
            strict=strict,
            window=self.sample_window_size,
            writer=own,
        )
        stored: dict[int, Any] = {}
        if self._reader.priorities is not None:
            size = self.sample_window_size
            ids = loaded.share.id_list if size <= 0 else loaded.share.id_list[-size:]
            stored = PriorityFiles(loaded.path).read_all(loaded.share.entries[i] for i in ids)
        with self._add_lock:
            self._check_open()
            if self._committer is not None:
                self._committer.flush()
                self._committer.adopt(loaded)
            with self._lock:
                self._adopt(loaded)
                self._adopt_priorities(loaded, stored)

    def _adopt_priorities(
        self, loaded: checkpoint.LoadedCheckpoint, stored: dict[int, Any]
    ) -> None:
        """Take the loaded priorities; an import into another store writes them there too."""
        priorities = self._reader.priorities
        if priorities is None:
            return
        priorities.clear()
        state = loaded.sampler.get("priorities") or {}
        priorities.load_state(state)
        priorities.offer(stored)
        self._reader.sync_priorities()
        if self._committer is not None and loaded.path.url != self._committer.url:
            priorities.unsave(stored)

    def _adopt(self, loaded: checkpoint.LoadedCheckpoint) -> None:
        self.local_cache.check_shapes(
            loaded.schema, [tuple(e["shape"][:2]) for e in loaded.share.entries.values()]
        )
        self._index.load_state_dict(loaded.share.state_dict())
        if self._committer is not None and loaded.source.location.url != self._committer.url:
            # Imported into this store: only what was copied (the window) is counted.
            self._index.clear_earlier()
        if self._committer is not None:
            # Never an id of another writer's slot of a shared store.
            self._index.trajectory_counter = self._committer.first_free_id(
                self._index.trajectory_counter
            )
        self._schema = loaded.schema
        self._cache.load_state_dict(
            {
                "capacity": self._cache.capacity,
                "trajectories": [(i, t.flat, t.residue, t.spec.B) for i, t in loaded.warm],
            }
        )
        self._reader.rows.load_state_dict({"seed": self.seed, **loaded.sampler})
        self._reader.sequences.load_state_dict(loaded.sampler.get("sequences"), self.seed)
        base = loaded.sampler.get("index_base")
        valid = isinstance(base, int) and not isinstance(base, bool) and base >= 0
        self._reader.index_base = base if isinstance(base, int) and valid else 0
        self._sampler_at_open = self._sampler_state()
        self._window_changed()
        if self._committer is None:
            self.trajectory_format = loaded.trajectory_format
        self._set_store_metadata()

    # -- lifecycle ---------------------------------------------------------------------
    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed.

        Parameters
        ----------
        timeout
            Seconds to wait at most.

        Raises
        ------
        WriterFailedError
            Writes are still uncommitted after ``timeout`` (the message says how many and
            the last storage error); they stay queued and retried.
        StorageUnavailableError
            With ``prioritized``: writing the priorities failed; those not written are
            written by the next ``flush()``.

        Notes
        -----
        With ``prioritized``, the priorities of the window's trajectories changed since the
        last flush are then written to the store (one file per trajectory): a resume or a
        crash after ``flush()`` returns keeps them.
        """
        if self._committer is not None:
            self._committer.flush(timeout)
            self._save_priorities()

    def close(self, wait: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Refuse further adds, wait for the queued writes, and stop the writer.

        Parameters
        ----------
        wait
            Wait for the queued writes.  ``False`` does not wait: the writes go on in the
            background, but one that fails is not retried; it and those behind it stay
            uncommitted (not in the store) unless ``close()`` is called again, and are lost
            when the process ends.  Writes uncommitted at the call are warned about
            (:class:`~rbzarr.UncommittedWritesWarning`, with their count and the store).
        timeout
            Seconds to wait at most.

        Raises
        ------
        WriterFailedError
            Writes are still uncommitted after ``timeout``: they stay queued and retried,
            and every later ``close()`` or ``flush()`` waits again and reports the same.
        """
        with self._add_lock:
            first = not self._closed
            self._closed = True
        if self._read_ahead is not None:
            self._read_ahead.close()
        if self._committer is not None:
            # The samplers' state as of the batches handed out, for load_checkpoint of this
            # store to continue the draws (recorded only if they moved since opening).
            with self._lock:
                state = self._sampler_state()
            moved = first and state != self._sampler_at_open
            self._committer.close(timeout, wait, {"sampler": state} if moved else None)
            if wait:
                self._save_priorities()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def clear(self) -> None:
        """Empty the index and the cache, and reset the counters.

        The auto-save store is left as it is: every trajectory written or queued stays
        there, and the id counter continues after the store's ids, so no later add
        overwrites one.  Without ``auto_save`` the counter restarts at 0 (as RLinf's), and
        the global indices of :meth:`sample` go on past those handed out before: their
        high part is the id plus the ids given out before the clear (so an index taken
        before never names a row added after; updates with it are stale).
        """
        with self._add_lock, self._lock:
            if self._committer is None:
                self._reader.index_base += self._index.trajectory_counter
            self._index = self._reader.index = TrajectoryIndex(
                trajectory_counter=self._first_free_id()
            )
            self._cache.clear()
            if self._reader.priorities is not None:
                self._reader.priorities.clear()
            self._window_changed()
            if self._committer is None:
                self._schema = None

    def get_stats(self) -> dict[str, Any]:
        """Counters for logging.

        Returns
        -------
        dict of str to Any
            ``num_trajectories``, ``total_samples``, ``cache_size`` (trajectories cached),
            ``cache_capacity``, ``cache_bytes``, ``sample_window_size``,
            ``trajectory_counter``, ``pending_writes``, ``write_error`` (the message of
            the error the current write keeps failing with, else ``None``) and
            ``damaged_trajectories`` (the ids ``on_damaged="skip"`` dropped, sorted); with
            ``prioritized`` also ``stale_priority_updates`` (updates ignored: their rows had
            left the window), ``max_priority``, ``priority_bytes`` (memory) and
            ``priority_kernels`` (``"compiled"``: numba, else ``"numpy"``).
        """
        with self._lock:
            error = None if self._committer is None else self._committer.last_error
            return {
                "num_trajectories": len(self._index),
                "total_samples": self._index.total_samples,
                "cache_size": len(self._cache),
                "cache_capacity": self.cache_size,
                "cache_bytes": self._cache.nbytes,
                "sample_window_size": self.sample_window_size,
                "trajectory_counter": self._index.trajectory_counter,
                "pending_writes": 0 if self._committer is None else self._committer.pending,
                "write_error": None if error is None else str(error),
                "damaged_trajectories": sorted(self._reader.damaged.dropped),
                **self._priority_stats(),
            }

    def _priority_stats(self) -> dict[str, Any]:
        priorities = self._reader.priorities
        if priorities is None:
            return {}
        return {
            "stale_priority_updates": priorities.stale_updates,
            "max_priority": priorities.max_priority,
            "priority_bytes": priorities.nbytes,
            "priority_kernels": "compiled" if priorities.compiled else "numpy",
        }
