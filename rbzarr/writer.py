"""BackgroundWriter: one thread that runs write tasks in submission order.

The queue is bounded: ``submit`` blocks while ``max_pending`` tasks wait (backpressure
instead of unbounded memory).  A task that keeps failing after its retries stops the
writer: the task stays at the head of the queue and the error is raised to the caller by the
next ``submit``/``check``/``flush``/``close``.  Once it has been raised, ``flush()`` retries
the task; until then every ``submit`` raises it again.  Nothing queued is dropped.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from rbzarr.errors import BufferClosedError, WriterFailedError

__all__ = ["BackgroundWriter"]

Task = Callable[[], None]


class BackgroundWriter:
    """Runs tasks on a single background thread, in order, with bounded retries."""

    def __init__(
        self,
        max_pending: int = 8,
        retries: int = 2,
        retry_delay: float = 0.2,
        name: str = "rbzarr-writer",
    ) -> None:
        if max_pending <= 0:
            raise ValueError(f"max_pending must be positive, got {max_pending}")
        self.max_pending = max_pending
        self.retries = retries
        self.retry_delay = retry_delay
        self._name = name
        self._tasks: collections.deque[Task] = collections.deque()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._reported = False
        self._running = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Tasks queued or running."""
        with self._cond:
            return len(self._tasks)

    @property
    def failed(self) -> bool:
        """Whether a task failed and waits for :meth:`flush` to retry it."""
        with self._cond:
            return self._error is not None

    def submit(self, task: Task) -> None:
        """Queue ``task``; blocks while the queue is full.  Raises a pending failure."""
        with self._cond:
            self._raise_if_unusable()
            while len(self._tasks) >= self.max_pending and self._error is None:
                self._cond.wait()
            self._raise_if_unusable()
            self._tasks.append(task)
            self._start()
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the pending failure, if any, without retrying."""
        with self._cond:
            self._raise_failure()

    def flush(self) -> None:
        """Wait until every queued task has run.

        A failure not yet raised to a caller is raised now; one already raised is retried.
        """
        with self._cond:
            if self._error is not None and self._reported:
                self._error = None
                self._cond.notify_all()
            while self._tasks and self._error is None:
                self._cond.wait()
            self._raise_failure()

    def close(self) -> None:
        """Flush, then stop the thread.  Idempotent; a failure is still raised once."""
        with self._cond:
            if self._closed:
                return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join()

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise BufferClosedError("the buffer is closed; it accepts no more trajectories")
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._error is not None:
            self._reported = True
            raise WriterFailedError(
                f"a background write failed ({self._error}); {len(self._tasks)} write(s) are "
                "kept queued: call flush() to retry them"
            ) from self._error

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._tasks or self._error is not None):
                    self._cond.wait()
                if self._closed:
                    return
                task = self._tasks[0]
            error = self._run(task)
            with self._cond:
                if error is None:
                    self._tasks.popleft()
                else:
                    self._error = error
                    self._reported = False
                self._cond.notify_all()

    def _run(self, task: Task) -> BaseException | None:
        for attempt in range(self.retries + 1):
            try:
                task()
                return None
            except Exception as exc:  # any failure is kept and re-raised to the caller
                if attempt == self.retries:
                    return exc
                time.sleep(self.retry_delay * 2**attempt)
        return None  # pragma: no cover
