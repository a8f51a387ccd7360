"""The prefetch thread: sampled batches made a bounded number ahead of the consumer.

The thread draws a batch only when the consumer has room for it: with ``prefetch=P`` at most
``P`` batches are drawn and not yet handed out, and they are handed out in the order drawn.
A batch is sampled from the window as it was when the thread drew it: trajectories added
later are seen by the batches drawn after the add (at most ``P`` batches later than a
consumer sampling in its own thread would see them).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from itertools import count
from typing import Any, Self

__all__ = ["ReplayLoader"]

Batch = dict[str, Any]


class _Failure:
    """Carries an exception from the prefetch thread to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def _prefetch(
    produce: Callable[[], Batch],
    batches: int | None,
    out: queue.Queue[Any],
    room: threading.Semaphore,
    stop: threading.Event,
) -> None:
    """The prefetch thread: fill ``out`` until ``batches`` are made, ``stop`` or an error."""
    try:
        for _ in range(batches) if batches is not None else count():
            room.acquire()  # a place the consumer freed (or close() woke it)
            if stop.is_set():
                return
            out.put(produce())
        room.acquire()  # the end takes a place too: never more than prefetch items wait
    except BaseException as error:  # every failure must reach the consumer, not the thread
        out.put(_Failure(error))  # in the place of the batch that failed
        return
    out.put(_END)


def _shutdown(
    stop: threading.Event,
    out: queue.Queue[Any],
    room: threading.Semaphore,
    thread: threading.Thread,
) -> None:
    """Stop the prefetch thread: wake it, and drain ``out`` until it exits."""
    stop.set()
    room.release()
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

    Parameters
    ----------
    produce
        Makes one batch per call, on the prefetch thread (it starts at construction).
    batches
        How many batches to make before the iteration ends; ``None`` never ends.
    prefetch
        Batches made ahead of the consumer, at most (the bound of the hand-over queue).
    seed
        The seed of the stream ``produce`` samples from, kept as :attr:`seed` for the
        caller; ``None`` when unknown.
    stop
        The event :meth:`close` sets, for a ``produce`` that waits to watch; by default a
        new one.
    """

    def __init__(
        self,
        produce: Callable[[], Batch],
        batches: int | None,
        prefetch: int,
        seed: int | None,
        stop: threading.Event | None = None,
    ) -> None:
        self.seed = seed
        self._queue: queue.Queue[Any] = queue.Queue()
        self._room = threading.Semaphore(prefetch)
        self._stop = threading.Event() if stop is None else stop
        self._done = False
        self._thread = threading.Thread(
            target=_prefetch,
            args=(produce, batches, self._queue, self._room, self._stop),
            name="rbzarr-prefetch",
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(
            self, _shutdown, self._stop, self._queue, self._room, self._thread
        )
        # At interpreter exit the daemon thread simply dies; joining it could hang on a
        # sample() that never returns.
        self._finalizer.atexit = False

    def __iter__(self) -> ReplayLoader:
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        self._room.release()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    @property
    def batches_ready(self) -> int:
        """Batches made and not yet handed out, at most ``prefetch`` (the end counts as one)."""
        return self._queue.qsize()

    @property
    def is_running(self) -> bool:
        """Whether the prefetch thread is still alive."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the prefetch thread and discard the batches it made; idempotent."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
