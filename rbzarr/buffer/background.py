"""BackgroundWriter: one thread that runs write tasks in order, retrying each until it succeeds.

A failing task stays at the head of the queue and is retried with exponential backoff: an
outage delays writes, it never drops them.  A failure that retrying cannot cure (what
``permanent`` finds in it: a permission error, a missing bucket) stops the thread at once:
the tasks stay queued, every ``flush``, ``close`` and new submission fails at once with the
cause, and ``flush``/``close`` retry them once (the cause may have been fixed).  The queue
is bounded (backpressure while healthy, refusal while failing).  The thread is a daemon, so
at interpreter exit every writer still holding tasks is given :data:`DEFAULT_TIMEOUT` to
finish them (none when they failed for good): a script that ends without ``close()`` keeps
its data.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from rbzarr.caller import warn_caller
from rbzarr.errors import BufferClosedError, UncommittedWritesWarning, WriterFailedError

__all__ = ["DEFAULT_TIMEOUT", "BackgroundWriter"]

Task = Callable[[], None]

# Seconds flush() and close() wait for queued writes by default.
DEFAULT_TIMEOUT = 60.0

# Writers whose thread may still hold tasks (a running thread keeps its writer alive).
_LIVE_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


def _finish_at_exit() -> None:
    for writer in list(_LIVE_WRITERS):
        writer.finish_at_exit()


@functools.cache
def _register_exit_hook() -> None:
    """Run :func:`_finish_at_exit` at interpreter exit, early enough to still write."""
    # concurrent.futures refuses new work once its own threading exit hook has run, and the
    # storage backends write through executors (zarr's local store via asyncio.to_thread).
    # threading's hooks run before atexit's, last-registered first, so this one runs before
    # that one.  It is private, but with atexit.register a script that adds 12 trajectories
    # and ends without close() commits none ("cannot schedule new futures after interpreter
    # shutdown"; measured with test_outage.py::
    # test_a_script_that_exits_without_close_keeps_its_trajectories, Python 3.11).
    register = getattr(threading, "_register_atexit", atexit.register)
    # Refused once the interpreter is shutting down: then it is too late to wait anyway.
    with contextlib.suppress(RuntimeError):
        register(_finish_at_exit)


class BackgroundWriter:
    """Runs tasks on one daemon thread, in order, retrying each failure with backoff."""

    def __init__(
        self,
        max_pending: int = 8,
        retry_delay: float = 0.05,
        max_retry_delay: float = 2.0,
        name: str = "rbzarr-writer",
        target: str = "storage",
        permanent: Callable[[BaseException], BaseException | None] | None = None,
    ) -> None:
        if max_pending <= 0:
            raise ValueError(f"max_pending must be positive, got {max_pending}")
        self.max_pending = max_pending
        # A full queue takes new tasks again once at most this many are left.
        self._low_water = max_pending // 2
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self._name = name
        self._target = target
        self._tasks: collections.deque[Task] = collections.deque()
        self._cond = threading.Condition()
        # Callers blocked in wait_for_room (a task done wakes them at low water; a flush
        # only once the queue is empty).
        self._room_waiters = 0
        self._error: BaseException | None = None
        self._permanent = permanent
        self._failed_for_good = False
        self._attempts = 0
        self._closed = False
        self._stopping = False
        self._running = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Tasks queued or running."""
        with self._cond:
            return len(self._tasks)

    @property
    def last_error(self) -> BaseException | None:
        """The error of the latest failed attempt while it is being retried, else ``None``."""
        with self._cond:
            return self._error

    def wait_for_room(self, count: int) -> None:
        """Block until ``count`` more tasks fit (once the queue was full: and at most half of
        it is left); refuse when a failing task fails again."""
        with self._cond:
            failures_seen: int | None = None
            limit = self.max_pending
            while True:
                self._raise_if_closed()
                if self._failed_for_good:
                    raise self._no_room(count)
                if not self._tasks or len(self._tasks) + count <= limit:
                    return
                # Full: wait until at most half is left too, so that the caller and the
                # writer each run several in a row instead of taking turns on every write.
                limit = min(self.max_pending, self._low_water + count)
                if self._error is not None:
                    # Failing: give the next retry its chance, then refuse.
                    if failures_seen is None:
                        failures_seen = self._attempts
                    elif self._attempts > failures_seen:
                        raise self._no_room(count)
                self._room_waiters += 1
                try:
                    self._cond.wait()
                finally:
                    self._room_waiters -= 1

    def _no_room(self, count: int) -> WriterFailedError:
        if self._failed_for_good:
            error = WriterFailedError(
                f"writes to {self._target} failed for good ({self._error}); retrying cannot "
                f"help, so {len(self._tasks)} queued write(s) wait and these {count} "
                "trajectories were not added (nothing changed): fix the cause and call "
                "flush() to retry, or build the buffer with another auto_save_path"
            )
            error.__cause__ = self._error
            return error
        error = WriterFailedError(
            f"writes to {self._target} are failing ({self._error}); {len(self._tasks)} "
            f"write(s) are queued and max_pending_writes={self.max_pending} leaves no room: "
            f"these {count} trajectories were not added (nothing changed); they are accepted "
            "again once the queued writes commit"
        )
        error.__cause__ = self._error
        return error

    def submit(self, tasks: Sequence[Task]) -> None:
        """Queue ``tasks`` without blocking (after :meth:`wait_for_room`); start the thread."""
        with self._cond:
            self._raise_if_closed()
            self._tasks.extend(tasks)
            self._start()
            self._cond.notify_all()

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued task has run; raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._tasks and not self._running and not self._stopping:
                # The thread stopped at a failure that cannot heal, or after close(wait=False):
                # one more try, the cause may be fixed.
                self._failed_for_good = False
                self._start()
            while self._tasks:
                left = deadline - time.monotonic()
                if left <= 0 or not self._running:
                    raise self._uncommitted(timeout)
                self._cond.wait(left)

    def close(self, timeout: float = DEFAULT_TIMEOUT, wait: bool = True) -> None:
        """Refuse new tasks; with ``wait``, run the queued ones, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if not wait:
                # The thread goes on with the queued tasks but stops at the first failure.
                self._stopping = True
                if self._tasks:
                    warn_caller(self._not_waited(), UncommittedWritesWarning)
                return
            # flush() below retries, once, what a stopped thread left.
            self._stopping = False
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def finish_at_exit(self) -> None:
        """Interpreter exit: wait for the queued tasks (bounded), report what is lost."""
        with self._cond:
            if not self._tasks:
                return
            running = self._running and not self._failed_for_good
        if running:
            with contextlib.suppress(WriterFailedError):  # what is left is reported below
                self.flush()
        with self._cond:
            if self._tasks:
                print(
                    f"rbzarr: at exit: {len(self._tasks)} write(s) to {self._target} were not "
                    f"committed{self._cause()}; the process is ending, so they are lost: the "
                    "store keeps only the trajectories committed before",
                    file=sys.stderr,
                )

    def _cause(self) -> str:
        return f" (last error: {self._error})" if self._error is not None else ""

    def _uncommitted(self, timeout: float) -> WriterFailedError:
        if self._failed_for_good:
            message = (
                f"{len(self._tasks)} write(s) to {self._target} not committed: they failed "
                f"for good{self._cause()}, so they are not retried: fix the cause and call "
                "flush() or close() to try once more; until then they are kept in memory "
                "(and sampled), and they are lost when the process ends"
            )
        elif self._running:
            message = (
                f"{len(self._tasks)} write(s) to {self._target} not committed after waiting "
                f"{timeout:g} s{self._cause()}; "
                "they stay queued and are retried: call flush() or close() again to wait again"
            )
        else:
            message = (
                f"{len(self._tasks)} write(s) to {self._target} not committed{self._cause()}: "
                "after close(wait=False) the writer stopped at this failure; call close() to "
                "retry them and wait, else they are lost when the process ends"
            )
        error = WriterFailedError(message)
        error.__cause__ = self._error
        return error

    def _not_waited(self) -> str:
        return (
            f"close(wait=False): {len(self._tasks)} write(s) to {self._target} are not "
            f"committed yet{self._cause()}; they go on in the background and stop at the first "
            "failure: what is uncommitted then is not retried and is lost when the process "
            "ends; call close() to wait for them"
        )

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise BufferClosedError("the buffer is closed; it accepts no more trajectories")

    def _start(self) -> None:
        """Start the thread unless it runs (call holding ``_cond``)."""
        if not self._running:
            self._running = True
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
            _LIVE_WRITERS.add(self)
            _register_exit_hook()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._tasks and not self._stopping:
                    self._cond.wait()
                if not self._tasks:
                    self._running = False
                    return
                task = self._tasks[0]
            failure: Exception | None = None
            try:
                task()
            except Exception as exc:  # kept, reported by flush/close, and retried
                failure = exc
            # The thread waits for the next task: it must not keep this one's objects alive.
            del task
            if failure is not None:
                if not self._record_failure(failure):
                    return
                continue
            with self._cond:
                self._tasks.popleft()
                recovered = self._error is not None
                self._error = None
                self._attempts = 0
                # Waiters for room wait for at most half to be left, a flush for none: until
                # then a wake-up would only send them back to wait.
                left = len(self._tasks)
                if recovered or not left or (self._room_waiters and left <= self._low_water):
                    self._cond.notify_all()

    def _record_failure(self, exc: Exception) -> bool:
        """Keep the error and back off; ``False`` when the writer was told to stop."""
        permanent = None if self._permanent is None else self._permanent(exc)
        with self._cond:
            self._error = exc
            self._attempts += 1
            self._cond.notify_all()
            if self._stopping or permanent is not None:
                self._failed_for_good = permanent is not None
                self._running = False
                return False
            delay = min(self.retry_delay * 2 ** (self._attempts - 1), self.max_retry_delay)
            self._cond.wait(delay)
            return True
