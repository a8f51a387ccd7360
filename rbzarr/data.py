"""Feed training from a replay buffer: a prefetching, rank- and worker-aware data source.

:class:`ReplayDataset` is a ``torch.utils.data.IterableDataset`` whose items are whole
sampled batches (dicts from ``buffer.sample(n)``), so wrap it in a ``DataLoader`` with
``batch_size=None`` or iterate it directly. Each iterator is a :class:`ReplayLoader` that
samples on a background thread, a bounded number of batches ahead of the consumer.

The buffer may be written concurrently (rollouts keep arriving); the only thing asked of
it is a ``sample(num_chunks) -> dict`` method.
"""

from __future__ import annotations

import inspect
import queue
import threading
import warnings
import weakref
from collections.abc import Callable
from itertools import count
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from rbzarr import tree
from rbzarr.index import shard_bounds

__all__ = ["ReplayDataset", "ReplayLoader", "SampleSource", "concat_batches", "derive_seed"]

Batch = dict[str, Any]


class SampleSource(Protocol):
    """Anything with ``sample(num_chunks) -> dict`` (a replay buffer, a demo buffer)."""

    def sample(self, num_chunks: int) -> Batch:
        """A batch of ``num_chunks`` rows, as a (nested) dict of ``[num_chunks, ...]``."""
        ...  # pragma: no cover - a protocol


def derive_seed(seed: int, rank: int, worker: int) -> int:
    """The sampling seed of ``worker`` on ``rank``: distinct, well mixed, reproducible.

    A 63-bit value drawn from ``numpy.random.SeedSequence([seed, rank, worker])``, so
    neighbouring ranks and workers get unrelated streams.
    """
    state = np.random.SeedSequence([seed, rank, worker]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def concat_batches(first: Batch, second: Batch) -> Batch:
    """Concatenate two sampled batches key by key (rows of ``first``, then ``second``)."""
    left, right = tree.flatten(first), tree.flatten(second)
    if list(left) != list(right):
        raise ValueError(
            f"cannot mix batches with different keys: {sorted(left)} and {sorted(right)}"
        )
    return tree.unflatten({path: torch.cat([left[path], right[path]]) for path in left})


def _takes_generator(source: SampleSource) -> bool:
    try:
        params = inspect.signature(source.sample).parameters
    except (TypeError, ValueError):
        return False
    return "generator" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _pin(batch: Batch) -> Batch:
    return tree.unflatten({path: value.pin_memory() for path, value in tree.flatten(batch).items()})


class _Failure:
    """Carries an exception from the prefetch thread to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def _prefetch(
    produce: Callable[[], Batch],
    batches: int | None,
    out: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    """The prefetch thread: fill ``out`` until ``batches`` are made, ``stop`` or an error."""
    try:
        for _ in range(batches) if batches is not None else count():
            if stop.is_set():
                return
            out.put(produce())
    except BaseException as error:  # every failure must reach the consumer, not the thread
        out.put(_Failure(error))
        return
    out.put(_END)


def _shutdown(stop: threading.Event, out: queue.Queue[Any], thread: threading.Thread) -> None:
    """Stop the prefetch thread: drain ``out`` until the thread, unblocked, exits."""
    stop.set()
    while thread.is_alive():
        while True:
            try:
                out.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=0.05)


class ReplayLoader:
    """An iterator of sampled batches, made ``prefetch`` batches ahead on a thread.

    Built by :meth:`ReplayDataset.__iter__`. An exception raised while sampling is
    re-raised by ``__next__`` (after the batches made before it) and ends the iteration.
    :meth:`close` (or leaving a ``with`` block) stops the thread; so does dropping the
    loader.
    """

    def __init__(
        self, produce: Callable[[], Batch], batches: int | None, prefetch: int, seed: int | None
    ) -> None:
        self.seed = seed
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_prefetch,
            args=(produce, batches, self._queue, self._stop),
            name="rbzarr-prefetch",
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._stop, self._queue, self._thread)
        # At interpreter exit the daemon thread simply dies; joining it could hang on a
        # sample() that never returns.
        self._finalizer.atexit = False

    def __iter__(self) -> ReplayLoader:
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    @property
    def is_running(self) -> bool:
        """Whether the prefetch thread is still alive."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the prefetch thread and discard the batches it made; idempotent."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> ReplayLoader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ReplayDataset(IterableDataset[Batch]):
    """Sampled batches of ``batch_size`` rows from ``buffer`` (and optionally a demo buffer).

    Parameters
    ----------
    buffer
        Any object with ``sample(num_chunks) -> dict``. When its ``sample`` also accepts a
        ``generator`` keyword, it receives this iterator's seeded ``torch.Generator``.
    batch_size
        Rows per batch. A buffer that clamps to the rows it holds may return fewer.
    num_batches
        Batches per pass on this rank, shared out among ``DataLoader`` workers (the first
        ``num_batches % num_workers`` workers make one more); ``None`` never stops.
    prefetch
        Batches sampled ahead of the consumer, at most.
    pin_memory
        Pin each batch's tensors on the prefetch thread (needs an accelerator; without one
        a warning is issued and batches are not pinned).
    seed
        Base seed. Each iterator uses :func:`derive_seed` ``(seed, rank, worker)`` where
        ``rank`` is the ``torch.distributed`` rank (0 if not initialised) and ``worker`` the
        ``DataLoader`` worker id (0 in the main process). ``None``: nondeterministic.
        It only affects sampling through a ``generator``-accepting ``sample``.
    demo_buffer, demo_fraction
        Mix demonstrations in: each batch takes ``round(batch_size * demo_fraction)`` rows
        from ``demo_buffer`` and the rest from ``buffer``, concatenated key by key (replay
        rows first). The two sizes always sum to ``batch_size``.
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
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"num_batches must be >= 0 or None, got {num_batches}")
        if prefetch <= 0:
            raise ValueError(f"prefetch must be > 0, got {prefetch}")
        if not 0.0 <= demo_fraction <= 1.0:
            raise ValueError(f"demo_fraction must be in [0, 1], got {demo_fraction}")
        if demo_fraction > 0 and demo_buffer is None:
            raise ValueError(f"demo_fraction={demo_fraction} needs a demo_buffer")
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
        self.demo_rows = round(batch_size * demo_fraction)
        self.replay_rows = batch_size - self.demo_rows
        self._loaders: weakref.WeakSet[ReplayLoader] = weakref.WeakSet()

    def __iter__(self) -> ReplayLoader:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        batches = self.num_batches
        if batches is not None:
            start, end = shard_bounds(batches, worker, workers)
            batches = end - start
        generator = torch.Generator()
        if self.seed is None:
            seed = generator.seed()
        else:
            seed = derive_seed(self.seed, rank, worker)
            generator.manual_seed(seed)
        loader = ReplayLoader(self._producer(generator), batches, self.prefetch, seed)
        self._loaders.add(loader)
        return loader

    def __getstate__(self) -> dict[str, Any]:
        # A DataLoader worker gets a copy without this process's iterators.
        state = self.__dict__.copy()
        del state["_loaders"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._loaders = weakref.WeakSet()

    def _producer(self, generator: torch.Generator) -> Callable[[], Batch]:
        replay = self._sampler(self.buffer, generator)
        demo = None if self.demo_buffer is None else self._sampler(self.demo_buffer, generator)

        def produce() -> Batch:
            parts = []
            if self.replay_rows:
                parts.append(replay(self.replay_rows))
            if demo is not None and self.demo_rows:
                parts.append(demo(self.demo_rows))
            batch = parts[0] if len(parts) == 1 else concat_batches(*parts)
            return _pin(batch) if self.pin_memory else batch

        return produce

    @staticmethod
    def _sampler(source: SampleSource, generator: torch.Generator) -> Callable[[int], Batch]:
        if _takes_generator(source):
            return lambda n: source.sample(n, generator=generator)  # type: ignore[call-arg]
        return source.sample

    def close(self) -> None:
        """Close every iterator this dataset made in this process."""
        for loader in list(self._loaders):
            loader.close()

    def __enter__(self) -> ReplayDataset:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
