"""Feed training from a replay buffer: one sample stream per rank and DataLoader worker.

A worker process samples a read-only view of the buffer's ``auto_save`` store, opened inside
the worker, never the training process's buffer.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Self

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from rbzarr.data.mixing import BatchCounts, DemoSchedule, MixedBatches, draw_of
from rbzarr.data.prefetch import ReplayLoader
from rbzarr.data.rate_limit import SampleRateLimiter
from rbzarr.data.sources import SampleSource, store_spec, worker_source
from rbzarr.storage.index.trajectory_index import share_bounds
from rbzarr.trajectory import tree

__all__ = [
    "ReplayDataset",
    "ReplayLoader",
    "SampleSource",
    "concat_batches",
    "derive_seed",
]

Batch = dict[str, Any]


def derive_seed(seed: int, rank: int, worker: int, epoch: int = 0) -> int:
    """The sampling seed of ``worker`` on ``rank`` in ``epoch``: distinct, well mixed."""
    entropy = [seed, rank, worker, epoch]
    state = np.random.SeedSequence(entropy).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def concat_batches(first: Batch, second: Batch) -> Batch:
    """Concatenate two sampled batches key by key (rows of ``first``, then ``second``).

    Raises
    ------
    ValueError
        The two batches have different (flattened) keys.
    """
    left, right = tree.flatten(first), tree.flatten(second)
    if list(left) != list(right):
        raise ValueError(
            f"cannot mix batches with different keys: {sorted(left)} and {sorted(right)}"
        )
    return tree.unflatten({path: torch.cat([left[path], right[path]]) for path in left})


def _pin(batch: Batch) -> Batch:
    return tree.unflatten({path: value.pin_memory() for path, value in tree.flatten(batch).items()})


class ReplayDataset(IterableDataset[Batch]):
    """Sampled batches of ``batch_size`` rows from ``buffer`` (and optionally a demo buffer).

    Parameters
    ----------
    buffer
        A :class:`~rbzarr.TrajectoryReplayBuffer`, a :class:`~rbzarr.analysis.view.BufferView`,
        or any object with ``sample(num_chunks) -> dict``.  When its ``sample`` accepts a
        ``generator`` keyword, it receives this iterator's seeded ``torch.Generator``.
        DataLoader workers sample a view of a buffer's ``auto_save`` store (module docs).
    batch_size
        Rows per batch.  A buffer clamps a draw to the rows of its sampling window, as
        RLinf's does: while the window holds fewer rows, batches have that many (the
        dataset warns once, ``UserWarning``).
    num_batches
        Batches per pass on this rank, shared out among ``DataLoader`` workers (the first
        ``num_batches % num_workers`` workers make one more); ``None`` never stops.
    prefetch
        Batches sampled ahead of the consumer, at most, per iterator.
    pin_memory
        Pin each batch's tensors on the prefetch thread (needs an accelerator; without one
        a warning is issued and batches are not pinned).  Workers never pin: the
        DataLoader of :meth:`data_loader` pins in the training process instead.
    seed
        Base seed. Each iterator uses :func:`derive_seed` ``(seed, rank, worker, epoch)``
        where ``rank`` is the ``torch.distributed`` rank (0 if not initialised), ``worker``
        the ``DataLoader`` worker id (0 in the main process) and ``epoch`` the value of
        :meth:`set_epoch` (0 until called).  ``None``: nondeterministic, still one stream
        per iterator.  It only affects sampling through a ``generator``-accepting
        ``sample``.
    demo_buffer, demo_fraction
        Mix demonstrations in: each batch takes exactly ``round(batch_size * demo_fraction)``
        rows from ``demo_buffer`` and the rest from ``buffer``, concatenated key by key
        (replay rows first). The two sizes always sum to ``batch_size``.
    demo_fraction_end, anneal_batches
        Anneal the demo count linearly to ``round(batch_size * demo_fraction_end)`` over
        the first ``anneal_batches`` batches of training (counted across workers and, with
        ``num_batches``, epochs), then keep it (:mod:`rbzarr.data.mixing`).
    sequence_length
        Batches of ``batch_size`` sequences of this many steps, from ``sample_sequences``
        (``[batch_size, sequence_length, ...]`` plus ``"mask"``); demo mixing counts
        sequences.  ``None``: rows from ``sample``.
    samples_per_insert, insert_timeout
        Wait before each batch until the replay rows sampled (steps, for sequences) are at
        most ``samples_per_insert`` times the rows in ``buffer`` (its ``total_samples``),
        so that ``sampled <= samples_per_insert * inserted + batch rows``; DataLoader workers
        share the ratio.  Raise :class:`~rbzarr.errors.InsertTimeoutError` after
        ``insert_timeout`` seconds without an insert (:mod:`rbzarr.data.rate_limit`).
    max_staleness
        Seconds: a worker's view re-reads the store's index before a draw when its last
        read is older than this (0: before every draw).

    Notes
    -----
    With a ``prioritized`` buffer each batch also holds ``"sample_info"``:
    ``{"index": int64 [n], "weight": float32 [n]}`` (per row, or per sequence start).  Pass
    them to the buffer's ``update_priority`` in the training process: the buffer is the
    one owner of the priorities.  A DataLoader worker draws by the priorities of the
    buffer's last ``flush()``, re-read with the index (``max_staleness``), so a worker's
    draws miss the updates made since; without workers a draw sees every update made before
    it (``prefetch`` batches are drawn ahead of the one handed out).

    Raises
    ------
    ValueError
        Bad sizes or fractions.
    """

    def __init__(
        self,
        buffer: SampleSource,
        batch_size: int,
        num_batches: int | None = None,
        prefetch: int = 2,
        pin_memory: bool = False,
        seed: int | None = None,
        demo_buffer: SampleSource | None = None,
        demo_fraction: float = 0.0,
        max_staleness: float = 1.0,
        *,
        demo_fraction_end: float | None = None,
        anneal_batches: int = 0,
        sequence_length: int | None = None,
        samples_per_insert: float | None = None,
        insert_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        _check_arguments(batch_size, num_batches, prefetch, demo_fraction, max_staleness)
        self.demo_schedule = DemoSchedule(
            batch_size, demo_fraction, demo_fraction_end, anneal_batches
        )
        if self.demo_schedule.uses_demos and demo_buffer is None:
            raise ValueError(f"demo_fraction={demo_fraction} needs a demo_buffer")
        if sequence_length is not None and sequence_length <= 0:
            raise ValueError(f"sequence_length must be > 0, got {sequence_length}")
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but no CUDA device is available; batches are not pinned",
                stacklevel=2,
            )
            pin_memory = False
        self.buffer = buffer
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.seed = seed
        self.demo_buffer = demo_buffer
        self.demo_rows = self.demo_schedule.demo_rows(0)
        self.replay_rows = batch_size - self.demo_rows
        self.sequence_length = sequence_length
        self.samples_per_insert = samples_per_insert
        self.insert_timeout = insert_timeout
        self._counts: list[BatchCounts] = []  # of every iterator made in this process
        self.max_staleness = max_staleness
        self.epoch = 0
        self._loaders: weakref.WeakSet[ReplayLoader] = weakref.WeakSet()
        self._warned_small_batch = False

    def set_epoch(self, epoch: int) -> None:
        """Start the streams of ``epoch``: later iterators draw rows unrelated to earlier ones.

        Call it before each pass, as with ``DistributedSampler``.

        Parameters
        ----------
        epoch
            The pass number; it enters every iterator's :func:`derive_seed`.
        """
        self.epoch = int(epoch)

    def __iter__(self) -> ReplayLoader:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        batches = self.num_batches
        if batches is not None:
            start, end = share_bounds(batches, worker, workers)
            batches = end - start
        generator = torch.Generator()
        if self.seed is None:
            seed = generator.seed()
        else:
            seed = derive_seed(self.seed, rank, worker, self.epoch)
            generator.manual_seed(seed)
        stop = threading.Event()
        first = worker + (self.epoch * self.num_batches if self.num_batches else 0)
        produce = self._producer(generator, info is not None, (first, workers), stop)
        loader = ReplayLoader(produce, batches, self.prefetch, seed, stop=stop)
        self._loaders.add(loader)
        return loader

    def __getstate__(self) -> dict[str, Any]:
        # A worker gets the stores to open, not this process's buffers or iterators.
        state = self.__dict__.copy()
        del state["_loaders"]
        state["_counts"] = []
        for name in ("buffer", "demo_buffer"):
            spec = store_spec(state[name])
            if spec is not None:
                state[name] = spec
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._loaders = weakref.WeakSet()

    def _producer(
        self,
        generator: torch.Generator,
        in_worker: bool,
        placement: tuple[int, int],
        stop: threading.Event,
    ) -> Callable[[], Batch]:
        replay_source, demo_source = self.buffer, self.demo_buffer
        if in_worker:
            replay_source = worker_source(replay_source, self.max_staleness)
            if demo_source is not None:
                demo_source = worker_source(demo_source, self.max_staleness)
        length = self.sequence_length
        replay = draw_of(replay_source, generator, length)
        demo = None if demo_source is None else draw_of(demo_source, generator, length)
        limiter = None
        if self.samples_per_insert is not None:
            ratio = self.samples_per_insert / placement[1]  # workers share the ratio
            limiter = SampleRateLimiter(replay_source, ratio, self.insert_timeout, stop)
        mixed = MixedBatches(
            replay,
            demo,
            self.demo_schedule,
            first_index=placement[0],
            stride=placement[1],
            rows_per_item=length or 1,
            limiter=limiter,
        )
        self._counts.append(mixed.counts)
        pin = self.pin_memory and not in_worker

        def produce() -> Batch:
            parts = mixed.parts()
            batch = parts[0] if len(parts) == 1 else concat_batches(*parts)
            self._check_batch_size(batch)
            return _pin(batch) if pin else batch

        return produce

    def _check_batch_size(self, batch: Batch) -> None:
        """Warn once when the buffer clamped a batch to the fewer rows its window holds."""
        rows = next((len(value) for _, value in tree.leaves(batch)), self.batch_size)
        if rows >= self.batch_size or self._warned_small_batch:
            return
        self._warned_small_batch = True
        warnings.warn(
            f"ReplayDataset: a batch has {rows} rows, not batch_size={self.batch_size}: the "
            f"buffer's sampling window holds fewer (it clamps, as RLinf's does); add "
            "trajectories or lower batch_size for full batches",
            UserWarning,
            stacklevel=2,
        )

    def get_stats(self) -> dict[str, Any]:
        """Counters of this process's iterators (DataLoader workers keep their own).

        Returns
        -------
        dict of str to Any
            ``batches``, ``replay_items`` and ``demo_items`` (rows, or sequences),
            ``last_demo_items`` (of the latest iterator's latest batch), and with
            ``samples_per_insert``:
            ``sampled_rows``, ``inserted_rows`` (the buffer's rows at the last check),
            ``samples_per_insert`` (their measured ratio) and ``rate_limited_s`` (time
            spent waiting).
        """
        made = list(self._counts)
        stats: dict[str, Any] = {
            "batches": sum(c.batches for c in made),
            "replay_items": sum(c.replay_items for c in made),
            "demo_items": sum(c.demo_items for c in made),
            "last_demo_items": made[-1].last_demo_items if made else 0,
        }
        if self.samples_per_insert is not None:
            sampled = sum(c.sampled_rows for c in made)
            inserted = max((c.inserted_rows for c in made), default=0)
            stats["sampled_rows"] = sampled
            stats["inserted_rows"] = inserted
            stats["samples_per_insert"] = sampled / inserted if inserted else 0.0
            stats["rate_limited_s"] = sum(c.rate_limited_s for c in made)
        return stats

    def data_loader(
        self,
        num_workers: int = 0,
        *,
        pin_memory: bool | None = None,
        multiprocessing_context: str | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> DataLoader[Batch]:
        """A ``DataLoader`` over this dataset that yields its batches as they are.

        It passes ``batch_size=None`` (each item already is a batch), spreads sampling over
        ``num_workers`` processes (each with its own stream and a view of the store), and
        pins batches in this process.

        Parameters
        ----------
        num_workers
            Worker processes; 0 samples on this dataset's prefetch thread.
        pin_memory
            Pin batches (for fast copies to a GPU); default: this dataset's ``pin_memory``.
        multiprocessing_context
            ``"fork"``, ``"spawn"`` or ``"forkserver"``; default: the platform's.
        prefetch_factor, persistent_workers
            Passed to ``DataLoader`` (``prefetch_factor`` only with workers).

        Returns
        -------
        DataLoader
            A loader with ``batch_size=None`` whose items are this dataset's batches.

        Raises
        ------
        ValueError
            If ``num_workers`` is negative, or with ``num_workers > 0``, a source that
            workers cannot sample (a buffer without ``auto_save``, a ``sample`` without a
            ``generator`` keyword).
        """
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if num_workers > 0:
            for source in (self.buffer, self.demo_buffer):
                if source is not None and store_spec(source) is None:
                    worker_source(source, self.max_staleness)  # raises if workers cannot
        pin = self.pin_memory if pin_memory is None else pin_memory
        return DataLoader(
            self,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=pin and torch.cuda.is_available(),
            multiprocessing_context=multiprocessing_context if num_workers else None,
            prefetch_factor=prefetch_factor if num_workers else None,
            persistent_workers=persistent_workers and num_workers > 0,
        )

    def close(self) -> None:
        """Close every iterator this dataset made in this process."""
        for loader in list(self._loaders):
            loader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_arguments(
    batch_size: int,
    num_batches: int | None,
    prefetch: int,
    demo_fraction: float,
    max_staleness: float,
) -> None:
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    if num_batches is not None and num_batches < 0:
        raise ValueError(f"num_batches must be >= 0 or None, got {num_batches}")
    if prefetch <= 0:
        raise ValueError(f"prefetch must be > 0, got {prefetch}")
    if not 0.0 <= demo_fraction <= 1.0:
        raise ValueError(f"demo_fraction must be in [0, 1], got {demo_fraction}")
    if not max_staleness >= 0:
        raise ValueError(f"max_staleness must be >= 0 seconds, got {max_staleness}")
