"""RLinf's replay datasets, on rbzarr's loader: same names, arguments and batches.

Unlike RLinf, waiting for the minimum sizes backs off instead of spinning, and iterating one
in a DataLoader worker process is an error (it would sample a frozen copy of the buffer).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import IterableDataset, get_worker_info

from rbzarr.data.datasets import ReplayLoader
from rbzarr.errors import WorkerProcessError
from rbzarr.trajectory import tree

__all__ = [
    "PreloadReplayBufferDataset",
    "ReplayBufferDataset",
    "concat_shared_keys",
    "replay_buffer_collate_fn",
]

Batch = dict[str, Any]

# Backoff while waiting for the buffers to fill: quick to notice, idle while it waits.
_FIRST_WAIT_S = 0.001
_LONGEST_WAIT_S = 0.1


class _Buffer(Protocol):
    def is_ready(self, min_size: int) -> bool: ...

    def sample(self, num_chunks: int) -> Batch: ...


class _Stopped(Exception):
    """The dataset was closed while waiting for its buffers."""


def concat_shared_keys(first: Batch, second: Batch) -> Batch:
    """Concatenate two batches along rows, keeping only the keys both have (RLinf's rule).

    Keys are compared by path, in ``first``'s order; a key that only one side has is
    dropped.  (:func:`rbzarr.data.datasets.concat_batches` refuses differing keys instead.)

    Parameters
    ----------
    first, second
        Sampled batches: (nested) dicts of ``[n, ...]`` tensors.

    Returns
    -------
    dict
        The shared tensor keys, each ``[n_first + n_second, ...]``, nested as in ``first``.
    """
    left, right = tree.flatten(first), tree.flatten(second)
    return tree.unflatten(
        {
            path: torch.cat([value, right[path]], dim=0)
            for path, value in left.items()
            if path in right and isinstance(value, torch.Tensor)
        }
    )


def replay_buffer_collate_fn(batch: list[Batch]) -> Batch:
    """``DataLoader`` collate function: the dataset's batch itself (``batch[0]``).

    Parameters
    ----------
    batch
        The list ``DataLoader(batch_size=1)`` collects: one already sampled batch.

    Returns
    -------
    dict
        ``batch[0]``, unchanged (no leading dimension is added).
    """
    return batch[0]


def _check_sizes(batch_size: int, with_demo: bool) -> None:
    smallest = 2 if with_demo else 1
    if batch_size < smallest:
        raise ValueError(
            f"batch_size must be >= {smallest}"
            + (" with a demo buffer (batch_size // 2 rows come from each)" if with_demo else "")
            + f", got {batch_size}"
        )


def _sampler(
    replay: _Buffer,
    demo: _Buffer | None,
    batch_size: int,
    min_replay: int,
    min_demo: int,
    stop: threading.Event,
) -> Callable[[], Batch]:
    """One batch per call, once both buffers are ready; raises :class:`_Stopped` on ``stop``."""

    def ready() -> bool:
        return replay.is_ready(min_replay) and (demo is None or demo.is_ready(min_demo))

    def next_batch() -> Batch:
        if stop.is_set():
            raise _Stopped
        delay = _FIRST_WAIT_S
        while not ready():
            if stop.wait(delay):
                raise _Stopped
            delay = min(2 * delay, _LONGEST_WAIT_S)
        if demo is None:
            return replay.sample(batch_size)
        half = batch_size // 2
        return concat_shared_keys(replay.sample(half), demo.sample(half))

    return next_batch


def _refuse_worker_process(name: str) -> None:
    if get_worker_info() is not None:
        raise WorkerProcessError(
            f"{name} samples the buffer in the process that owns it: use it with "
            "DataLoader(num_workers=0), as RLinf does; a worker process would sample a "
            "frozen copy. For worker processes use rbzarr.ReplayDataset"
        )


class ReplayBufferDataset(IterableDataset[Batch]):
    """RLinf's endless dataset of sampled batches from a replay (and a demo) buffer.

    Parameters
    ----------
    replay_buffer
        The buffer of online rollouts.
    demo_buffer
        A buffer of demonstrations, or ``None``.
    batch_size
        Rows per batch; with a demo buffer ``batch_size // 2`` come from each (7 gives 6).
    min_replay_buffer_size, min_demo_buffer_size
        Trajectories each buffer must hold (``is_ready``) before sampling starts.
    **kwargs
        Accepted and ignored, as RLinf does (its workers pass ``prefetch_size``).

    Raises
    ------
    ValueError
        If ``batch_size`` is below 1, or below 2 with a demo buffer.
    """

    def __init__(
        self,
        replay_buffer: Any,
        demo_buffer: Any | None,
        batch_size: int,
        min_replay_buffer_size: int,
        min_demo_buffer_size: int,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        _check_sizes(batch_size, demo_buffer is not None)
        self.replay_buffer = replay_buffer
        self.demo_buffer = demo_buffer
        self.batch_size = batch_size
        self.min_replay_buffer_size = min_replay_buffer_size
        self.min_demo_buffer_size = min_demo_buffer_size
        self._stop = threading.Event()

    def _next_batch(self) -> Callable[[], Batch]:
        return _sampler(
            self.replay_buffer,
            self.demo_buffer,
            self.batch_size,
            self.min_replay_buffer_size,
            self.min_demo_buffer_size,
            self._stop,
        )

    def __iter__(self) -> Iterator[Batch]:
        """Batches forever (until :meth:`close`), each sampled when it is asked for."""
        _refuse_worker_process(type(self).__name__)
        next_batch = self._next_batch()
        while True:
            try:
                yield next_batch()
            except _Stopped:
                return

    def close(self) -> None:
        """End iteration: an iterator waiting for its buffers stops; idempotent."""
        self._stop.set()


class PreloadReplayBufferDataset(ReplayBufferDataset):
    """:class:`ReplayBufferDataset` whose batches are sampled ahead on a background thread.

    The thread (an :class:`rbzarr.ReplayLoader`) starts on the first ``iter()`` and keeps up
    to ``prefetch_size`` batches ready; every iterator of this dataset draws from it.  An
    error raised while sampling is raised by the iterator.

    Parameters
    ----------
    replay_buffer, demo_buffer, batch_size, min_replay_buffer_size, min_demo_buffer_size
        As for :class:`ReplayBufferDataset`.
    prefetch_size
        Batches sampled ahead, at most.

    Raises
    ------
    ValueError
        If ``prefetch_size`` is not positive, or for the sizes as :class:`ReplayBufferDataset`.
    """

    def __init__(
        self,
        replay_buffer: Any,
        demo_buffer: Any | None,
        batch_size: int,
        min_replay_buffer_size: int,
        min_demo_buffer_size: int,
        prefetch_size: int = 5,
    ) -> None:
        if prefetch_size <= 0:
            raise ValueError(f"prefetch_size must be > 0, got {prefetch_size}")
        super().__init__(
            replay_buffer, demo_buffer, batch_size, min_replay_buffer_size, min_demo_buffer_size
        )
        self.prefetch_size = prefetch_size
        self._loader: ReplayLoader | None = None
        self._loader_lock = threading.Lock()
        # Dropping the dataset ends a thread still waiting for the buffers to fill.
        weakref.finalize(self, self._stop.set)

    def _shared_loader(self) -> ReplayLoader:
        with self._loader_lock:
            if self._loader is None:
                # The thread's work must not refer to the dataset, so dropping it stops it.
                self._loader = ReplayLoader(self._next_batch(), None, self.prefetch_size, None)
            return self._loader

    def __iter__(self) -> Iterator[Batch]:
        """Prefetched batches until :meth:`close`."""
        _refuse_worker_process(type(self).__name__)
        loader = self._shared_loader()
        while True:
            try:
                yield next(loader)
            except (_Stopped, StopIteration):
                return

    def close(self) -> None:
        """Stop the background thread and drop the batches it made; idempotent."""
        self._stop.set()
        with self._loader_lock:
            if self._loader is not None:
                self._loader.close()
