"""The one read core: :class:`StoreReader` samples rows and sequences from an index over a layout.

A draw runs in two halves.  Under the owner's lock the reader takes the window from the
index, lets a :class:`~rbzarr.sampling.sampler.Sampler` pick window positions and flat rows
(pure torch), and plans where each row comes from: the owner's memory (:class:`HeldRows`:
a cache's hits, writes still pending) or the store.  The store's rows are then read without
the lock.  What a sampler must learn from storage first (a trajectory's ``dones``, for
sequences) is read without the lock too, and learnt under it before the draw.  Damaged
trajectories are handled by :class:`~rbzarr.sampling.damaged.DamagedTrajectories`: with
``on_damaged="skip"`` they leave the index and the batch is drawn again.

:class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer` is this reader plus a cache, a
committer and the read-ahead; :class:`~rbzarr.analysis.view.BufferView` is this reader plus
``refresh``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from rbzarr.errors import EmptyBufferError
from rbzarr.sampling.arguments import check_count
from rbzarr.sampling.damaged import DamagedTrajectories
from rbzarr.sampling.priorities import ROW_BITS, PrioritizedReplay, WindowPriorities
from rbzarr.sampling.prioritized import PrioritizedSampler
from rbzarr.sampling.rows import MissPlan, all_cached, plan_misses
from rbzarr.sampling.sampler import Draw, Sampler, Window
from rbzarr.sampling.sequences import SequenceSampler, check_sequence_request
from rbzarr.sampling.window import WindowSampler
from rbzarr.storage.index.priorities import PriorityFiles
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.steps import DONES, time_steps

__all__ = ["Ahead", "HeldRows", "StoreReader", "WindowIndex"]

Batch = dict[str, Any]
Info = dict[str, torch.Tensor]
Result = TypeVar("Result")
# Draws a batch of ``n`` rows with a generator (under the lock); returns its read.
DrawRows = Callable[[int, torch.Generator], Callable[[], Batch]]


class WindowIndex(Protocol):
    """What the reader asks of its index (a
    :class:`~rbzarr.storage.index.trajectory_index.TrajectoryIndex`)."""

    @property
    def entries(self) -> Mapping[int, Entry]: ...

    def window(self, size: int) -> list[int]: ...

    def sample_counts(self, ids: Iterable[int]) -> torch.Tensor: ...

    def remove(self, ids: Iterable[int]) -> None: ...


class HeldRows(Protocol):
    """Rows an owner holds in memory beside the store (called under the owner's lock)."""

    def drawing(self, window: Window) -> None:
        """A draw from ``window`` is about to be made."""

    def caching(self) -> bool:
        """Whether any trajectory is cached (when not, no cell is looked up)."""

    def cells(self, window: Window, positions: torch.Tensor) -> torch.Tensor:
        """The cache cell of the trajectory at each window position (``-1`` where not
        cached)."""

    def gather(self, cells: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The flat rows ``rows`` of the cached trajectories in ``cells``."""

    def pending(self, ids: Sequence[int]) -> Mapping[int, Mapping[str, torch.Tensor]]:
        """The flat rows of those of ``ids`` whose write is still pending."""

    def dones(self, trajectory_id: int) -> torch.Tensor | None:
        """The step ``dones`` of a held trajectory; ``None`` when only the store has it."""

    def reserved(self, window: Window, positions: torch.Tensor) -> list[Entry]:
        """The trajectories drawn (at ``positions``) that memory should read whole after."""

    def fill(self, entries: Sequence[Entry], schema: Schema | None) -> None:
        """Read :meth:`reserved`'s trajectories into memory (called without the lock)."""


class Ahead(Protocol):
    """Batches drawn ahead from the reader's own generator (the buffer's read-ahead)."""

    depth: int  # batches drawn ahead

    def close(self) -> None:
        """Stop drawing ahead; later batches are drawn when asked."""

    def sample(self, n: int) -> Batch:
        """The next batch of ``n`` rows, as the reader would draw it."""

    def discard(self) -> None:
        """Drop the batches drawn ahead (the window changed)."""


class StoreReader:
    """Samples rows (:meth:`sample`) and sequences (:meth:`sequences_with_info`) of a window.

    Parameters
    ----------
    index
        The trajectories listed, in insertion order; the owner may replace it.
    layout
        The store rows are read from; ``None`` when every row is held in memory.
    seed
        Seed of both samplers' streams.
    window_size
        Draw from the last ``window_size`` trajectories; 0 or negative: all.
    on_damaged
        ``"raise"`` or ``"skip"`` (see :mod:`rbzarr.sampling.damaged`).
    where
        The store's URL, for messages.
    empty
        The message of the :class:`~rbzarr.errors.EmptyBufferError` an empty window raises.
    schema
        The schema of the trajectories, when known (the owner sets it at the first).
    held, lock
        The owner's memory and the lock that guards it, the index and the samplers.
    read_ahead
        Builds the batches drawn ahead (the buffer's ``prefetch``) from the rows sampler's
        generator and :meth:`draw_rows`; ``None``: every batch is drawn when asked.
    prioritized
        Draw rows and sequence starts by priority (:attr:`priorities`); ``None``: uniformly.
    """

    def __init__(
        self,
        index: WindowIndex,
        layout: TrajectoryLayout | None,
        *,
        seed: int | None,
        window_size: int = 0,
        on_damaged: str = "raise",
        where: str = "",
        empty: str = "cannot sample from an empty buffer: add trajectories first",
        schema: Schema | None = None,
        held: HeldRows | None = None,
        lock: AbstractContextManager[Any] | None = None,
        read_ahead: Callable[[torch.Generator, DrawRows], Ahead] | None = None,
        prioritized: PrioritizedReplay | None = None,
        saves_priorities: bool = False,
    ) -> None:
        self.damaged = DamagedTrajectories(on_damaged)
        self.index = index
        self.layout = layout
        self.window_size = window_size
        self.where = where
        self.empty = empty
        self.held = held
        self.lock = threading.RLock() if lock is None else lock
        self.priorities = (
            None if prioritized is None else WindowPriorities(prioritized, saves=saves_priorities)
        )
        self.rows = (
            WindowSampler(seed)
            if self.priorities is None
            else PrioritizedSampler(seed, self.priorities)
        )
        self.sequences = SequenceSampler(seed, self.priorities)
        self.schema = schema
        # Added to the ids of the global indices handed out: a buffer without a store
        # restarts its ids at 0 on clear() (as RLinf), so its indices start past the old ones.
        self.index_base = 0
        self._window: Window | None = None
        self.ahead = None if read_ahead is None else read_ahead(self.rows.generator, self.draw_rows)

    def window(self) -> list[int]:
        """The ids drawn from, oldest first (call under the lock).

        Raises
        ------
        EmptyBufferError
            The window is empty.
        """
        window = self.index.window(self.window_size)
        if not window:
            raise EmptyBufferError(self.empty)
        return window

    def window_changed(self) -> None:
        """Batches drawn ahead from the window before it changed are never handed out; the
        priorities follow the window (new rows enter at the largest priority now)."""
        self._window = None
        if self.ahead is not None:
            self.ahead.discard()
        self.sync_priorities()

    def _current(self) -> Window:
        """The window, kept while the index and its ids stay the same (call under the lock).

        Raises
        ------
        EmptyBufferError
            The window is empty.
        """
        ids = self.window()
        kept = self._window
        if kept is None or kept.index is not self.index or kept.ids != ids:
            kept = self._window = Window(ids, self.index)
            if self.layout is not None:
                self.layout.sample_window(len(ids))
        return kept

    def sync_priorities(self) -> None:
        """Let the priorities follow the window (call under the lock)."""
        if self.priorities is None:
            return
        try:
            window = self._current()
        except (ValueError, EmptyBufferError):  # empty, or past what the index holds
            self.priorities.sync([], [])
            return
        self.priorities.sync(window.ids, window.counts)

    def row_index(self, index: np.ndarray) -> np.ndarray:
        """Global indices handed out, as the priorities count them (those of ids from before
        the last :attr:`index_base` move become negative: no row)."""
        return index - (self.index_base << ROW_BITS) if self.index_base else index

    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` rows drawn from the window (uniformly, or by priority), as a nested
        ``[n, ...]`` dict.

        Raises
        ------
        ValueError
            ``n`` is not positive (named ``num_chunks``, RLinf's name, in the message).
        TypeError
            ``n`` is not an int.
        EmptyBufferError
            The window is empty.
        """
        n = check_count("num_chunks", n)
        if generator is None and self.ahead is not None:
            return self._sampling(self.rows, functools.partial(self.ahead.sample, n), None)
        drawing = functools.partial(self._draw_and_read, self.rows, n, generator, False)
        return self._sampling(self.rows, drawing, generator)[0]

    def sample_with_info(
        self, n: int, generator: torch.Generator | None = None
    ) -> tuple[Batch, Info]:
        """:meth:`sample`, and per row its global index and importance weight
        (``{"index": int64 [n], "weight": float32 [n]}``); never drawn ahead."""
        n = check_count("num_chunks", n)
        return self._sampling(
            self.rows, functools.partial(self._draw_and_read, self.rows, n, generator), generator
        )

    def draw_rows(self, n: int, generator: torch.Generator | None) -> Callable[[], Batch]:
        """Draw a batch of rows under the lock; the call returned reads it (without the lock)."""
        read = self._draw(self.rows, n, generator, with_info=False)
        return lambda: read()[0]

    def sequences_with_info(
        self,
        n: int,
        length: int,
        generator: torch.Generator | None = None,
        strict_length: bool = False,
    ) -> tuple[Batch, Info]:
        """``n`` sequences of ``length`` steps (``[n, length, ...]`` each, with ``"mask"``), and
        per sequence its start row's global index and importance weight."""
        check_sequence_request(n, length, self.schema or None)
        sampler = self.sequences.of_length(length, strict_length)
        return self._sampling(
            sampler, functools.partial(self._draw_and_read, sampler, n, generator), generator
        )

    def _draw_and_read(
        self, sampler: Sampler, n: int, generator: torch.Generator | None, with_info: bool = True
    ) -> tuple[Batch, Info]:
        """Draw and read one batch (a new draw each call: damage redraws it); without
        ``with_info`` its info is empty."""
        return self._draw(sampler, n, generator, with_info)()

    def _sampling(
        self, sampler: Sampler, sample: Callable[[], Result], generator: torch.Generator | None
    ) -> Result:
        stream = sampler.generator if generator is None else generator
        return self.damaged.sampling(sample, stream, self.drop_damaged)

    def drop_damaged(self, found: dict[int, str]) -> None:
        """``on_damaged="skip"``: the damaged trajectories leave the index, as if evicted."""
        with self.lock:
            self.index.remove(found)
            self.window_changed()
        self.damaged.record(found, self.where)
        self.fetch_returning()

    def drop_collected(self, ids: list[int]) -> None:
        """Retention removed ``ids`` from the store: they leave the index (a bounded window
        keeps its ids: the collection spares them)."""
        with self.lock:
            self.index.remove(ids)
            if self.window_size <= 0:
                self.window_changed()

    def spared_ids(self) -> frozenset[int]:
        """The ids a collection must not remove: the window, when it is bounded."""
        with self.lock:
            if self.window_size <= 0:
                return frozenset()
            try:
                return frozenset(self.index.window(self.window_size))
            except ValueError:  # the window reaches past the index: only retention spares
                return frozenset()

    def fetch_returning(self) -> None:
        """Offer the stored priorities of the trajectories back in the window (read without
        the lock; one file each), so that they do not enter at the largest priority."""
        if self.priorities is None or self.layout is None:
            return
        with self.lock:
            try:
                returning = self.priorities.returning(self.window())
            except (ValueError, EmptyBufferError):  # empty, or past what the index holds
                return
            entries = [self.index.entries[i] for i in returning]
        if not entries:
            return
        stored = PriorityFiles(self.layout.location).read_all(entries)
        none = np.zeros(0, dtype=np.float32)  # no file: the largest priority
        with self.lock:
            self.priorities.offer({i: stored.get(i, none) for i in returning})
            self.sync_priorities()

    def _draw(
        self,
        sampler: Sampler,
        n: int,
        generator: torch.Generator | None,
        with_info: bool = True,
    ) -> Callable[[], tuple[Batch, Info]]:
        """Learn what ``sampler`` needs, draw and plan under the lock; return the read (and,
        ``with_info``, the rows' indices and weights; else an empty info)."""
        learnt: list[tuple[Entry, torch.Tensor]] = []
        while True:
            with self.lock:
                for entry, dones in learnt:
                    sampler.learn(entry, dones)
                window = self._current()
                stored = self._learn_held(sampler, window)
                if not stored:
                    if self.held is not None:
                        self.held.drawing(window)
                    drawn = sampler.draw(n, window, generator)
                    ids = (
                        window.id_tensor + self.index_base if self.index_base else window.id_tensor
                    )
                    plan = self._plan(window, drawn.positions, drawn.rows)
                    fill = [] if self.held is None else self.held.reserved(window, drawn.positions)
                    break
            # Read from the store without the lock; learnt under it on the next round.
            learnt = [(entry, self._stored_dones(entry)) for entry in stored]
        return lambda: (self._read(drawn, plan, fill), drawn.info(ids) if with_info else {})

    def _read(self, drawn: Draw, plan: MissPlan, fill: list[Entry]) -> Batch:
        """Read a planned batch (without the lock), then what memory should hold of it."""
        batch = drawn.batch(self.damaged.read(plan, self.layout))
        if fill:
            assert self.held is not None
            self.held.fill(fill, plan.schema)
        return batch

    def _learn_held(self, sampler: Sampler, window: Window) -> list[Entry]:
        """Learn what the sampler needs of the held trajectories; the stored ones left."""
        stored = []
        for entry in sampler.unknown(window):
            dones = None if self.held is None else self.held.dones(int(entry["trajectory_id"]))
            if dones is None:
                stored.append(entry)
            else:
                sampler.learn(entry, dones)
        return stored

    def _stored_dones(self, entry: Entry) -> torch.Tensor:
        """The step ``dones`` of a stored trajectory."""
        assert self.layout is not None  # not held: committed to the store
        raw = self.damaged.read_one(self.layout, entry, [DONES]).dones
        assert raw is not None
        return time_steps(raw, int(entry["shape"][0]))

    def _plan(self, window: Window, positions: torch.Tensor, rows: torch.Tensor) -> MissPlan:
        """Under the lock: the drawn rows held in memory, and where the others are read."""
        assert self.schema is not None
        hit = torch.zeros(len(positions), dtype=torch.bool)
        cached: dict[str, torch.Tensor] = {}
        if self.held is not None and self.held.caching():
            cells = self.held.cells(window, positions)
            hit = cells >= 0
            if bool(hit.all()):  # the usual cached step: no id is looked at
                return all_cached(self.held.gather(cells, rows), self.schema)
            if bool(hit.any()):
                cached = self.held.gather(cells[hit], rows[hit])
        ids = window.id_tensor[positions]
        pending: Mapping[int, Mapping[str, torch.Tensor]] = {}
        if self.held is not None:
            pending = self.held.pending(window.ids if len(window.ids) <= len(ids) else ids.tolist())
        return plan_misses(
            ids,
            rows,
            hit,
            cached,
            self.schema,
            self.index.entries,
            pending,
            window.entries,
            positions,
        )
