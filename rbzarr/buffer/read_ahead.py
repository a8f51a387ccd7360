"""Read-ahead for ``TrajectoryReplayBuffer.sample()``: the next batches read while one trains.

With ``prefetch=N`` a ``sample(n)`` call hands out the oldest of the batches already drawn;
a drawing thread then draws the ``N`` after it, whose store reads run on ``N`` threads while
the caller trains.  The draws come from a *look-ahead* copy of the buffer's generator;
the buffer's own generator is set, at each hand-out, to its state right after the batch
handed out.  So ``buffer.generator`` and a checkpoint's sampler state are always "as of the
batches handed out", and restoring one continues exactly.

A batch is handed out only if nothing changed since it was drawn: adding trajectories,
loading a checkpoint or clearing the buffer (:meth:`ReadAhead.discard`), another ``n``, and
a generator moved by someone else (reseeded, or used by a ``sample`` call that bypassed the
read-ahead) discard every batch drawn ahead, and the look-ahead restarts from the buffer's
generator.  The batches handed out are therefore exactly those of the same calls without
prefetch, whatever happens between them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["ReadAhead"]

Batch = dict[str, Any]
# Draws a batch of ``n`` rows with a generator (under the buffer's lock); returns its read.
Draw = Callable[[int, torch.Generator], Callable[[], Batch]]


class ReadAhead:
    """The batches a buffer's next ``sample(n)`` calls hand out, drawn ahead and being read."""

    def __init__(
        self, depth: int, stream: torch.Generator, draw: Draw, lock: threading.RLock
    ) -> None:
        self.depth = depth
        self._stream = stream  # the buffer's generator: as of the batches handed out
        self._ahead = torch.Generator()
        self._draw = draw
        self._lock = lock  # the buffer's: draws and discards are ordered with its changes
        self._pending: deque[tuple[Future[Batch], torch.Tensor]] = deque()
        self._n = 0
        self._expected = stream.get_state()
        self._pool: ThreadPoolExecutor | None = None
        self._drawer: ThreadPoolExecutor | None = None
        self._closed = False

    def sample(self, n: int) -> Batch:
        """The next batch of ``n`` rows of the buffer's stream, as ``sample`` draws it."""
        with self._lock:
            # Closed, no threads: the draw and read of a buffer without prefetch.
            read = self._draw(n, self._stream) if self._closed else self._hand_out(n).result
        try:
            return read()
        except BaseException:
            # Later reads may fail alike, or succeed if retried: read them again when asked.
            with self._lock:
                self.discard()
            raise

    def _hand_out(self, n: int) -> Future[Batch]:
        """The read of the next batch; the drawing thread then draws the ones after it."""
        if n != self._n or not torch.equal(self._stream.get_state(), self._expected):
            self.discard()
            self._n = n
        if not self._pending:
            self._draw_one()
        future, state = self._pending.popleft()
        self._stream.set_state(state)
        self._expected = state
        self._threads()[1].submit(self._fill)
        return future

    def discard(self) -> None:
        """Drop the batches drawn ahead: the next one is drawn from the buffer's generator."""
        with self._lock:
            for future, _ in self._pending:
                future.cancel()
            self._pending.clear()
            self._expected = self._stream.get_state()
            self._ahead.set_state(self._expected)

    def close(self) -> None:
        """Drop the batches drawn ahead and stop the threads; later calls read in the caller."""
        with self._lock:
            self._closed = True
            self.discard()
            pools = [self._drawer, self._pool]
            self._pool = self._drawer = None
        for pool in pools:
            if pool is not None:  # reads a caller waits for, and those in flight, end first
                pool.shutdown(wait=True)

    def _draw_one(self) -> None:
        """Draw the batch after the last one drawn and start its read (under the lock)."""
        read = self._draw(self._n, self._ahead)
        self._pending.append((self._threads()[0].submit(read), self._ahead.get_state()))

    def _fill(self) -> None:
        """The drawing thread: draw until ``depth`` batches wait (as of now: after a discard,
        from the generator it reset).
        """
        with self._lock:
            try:
                while not self._closed and len(self._pending) < self.depth:
                    self._draw_one()
            except Exception:  # the caller's own draw raises it when it needs the batch
                return

    def _threads(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        """The reading threads and the drawing thread, started on first use."""
        if self._pool is None or self._drawer is None:
            self._pool = ThreadPoolExecutor(self.depth, thread_name_prefix="rbzarr-read-ahead")
            self._drawer = ThreadPoolExecutor(1, thread_name_prefix="rbzarr-draw-ahead")
        return self._pool, self._drawer
