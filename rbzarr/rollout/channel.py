"""A bounded channel carrying trajectories from producers to consumers (threads or processes)."""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from typing import Any, Literal

import torch.multiprocessing as torch_mp

from rbzarr.errors import ChannelClosedError, ChannelTimeoutError

__all__ = ["Channel"]

# How often a process-backend ``put`` blocked on a full channel looks for ``close()``.
_CLOSE_POLL_S = 0.05


class _Nothing:
    """Returned by ``_Backend.get_nowait`` when no item is ready."""


_NOTHING = _Nothing()


class _ClosedMarker:
    """Queued by ``close()`` behind the last item, so blocked consumers wake up."""


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")


class _Backend(ABC):
    """The transport under a :class:`Channel`."""

    @abstractmethod
    def put(self, item: Any, timeout: float | None) -> None:
        """Enqueue ``item``, waiting up to ``timeout`` seconds for room."""

    @abstractmethod
    def get(self, timeout: float | None) -> Any:
        """Dequeue an item, waiting up to ``timeout`` seconds for one."""

    @abstractmethod
    def get_nowait(self) -> Any:
        """An item if one is ready, else ``_NOTHING``."""

    @abstractmethod
    def close(self) -> None:
        """Refuse further puts and wake blocked consumers once drained."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""


class _ThreadBackend(_Backend):
    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._items: deque[Any] = deque()
        self._changed = threading.Condition()
        self._closed = False

    def __getstate__(self) -> None:
        raise TypeError("a Channel with backend='thread' cannot cross processes; use 'process'")

    def _has_room(self) -> bool:
        return self._maxsize <= 0 or len(self._items) < self._maxsize

    def put(self, item: Any, timeout: float | None) -> None:
        # docstring inherited
        with self._changed:
            if not self._changed.wait_for(lambda: self._closed or self._has_room(), timeout):
                raise ChannelTimeoutError(f"put: channel stayed full for {timeout} s")
            if self._closed:
                raise ChannelClosedError("put: the channel is closed")
            self._items.append(item)
            self._changed.notify_all()

    def get(self, timeout: float | None) -> Any:
        # docstring inherited
        with self._changed:
            if not self._changed.wait_for(lambda: self._closed or self._items, timeout):
                raise ChannelTimeoutError(f"get: channel stayed empty for {timeout} s")
            if not self._items:
                raise ChannelClosedError("get: the channel is closed and drained")
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def get_nowait(self) -> Any:
        # docstring inherited
        with self._changed:
            if not self._items:
                return _NOTHING
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def close(self) -> None:
        # docstring inherited
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        # docstring inherited
        return self._closed


class _ProcessBackend(_Backend):
    """An unbounded multiprocessing queue, bounded by a semaphore of free places.

    The close marker takes no place, so ``close()`` never blocks on a full channel.  A process
    that has received the marker remembers it (``_drained``): its later gets fail at once,
    without waiting for the marker it passed on to come round again.
    """

    def __init__(self, maxsize: int, context: str | None) -> None:
        ctx = torch_mp.get_context(context)
        self._queue = ctx.Queue()
        self._places = ctx.BoundedSemaphore(maxsize) if maxsize > 0 else None
        self._closed = ctx.Event()
        self._drained = False

    def put(self, item: Any, timeout: float | None) -> None:
        # docstring inherited
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._places is not None:
            while True:
                if self._closed.is_set():
                    raise ChannelClosedError("put: the channel is closed")
                left = _CLOSE_POLL_S if deadline is None else deadline - time.monotonic()
                if self._places.acquire(timeout=max(0.0, min(left, _CLOSE_POLL_S))):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise ChannelTimeoutError(f"put: channel stayed full for {timeout} s")
        if self._closed.is_set():
            self._release()
            raise ChannelClosedError("put: the channel is closed")
        self._queue.put(item)

    def _release(self) -> None:
        if self._places is not None:
            self._places.release()

    def _received(self, item: Any) -> Any:
        if isinstance(item, _ClosedMarker):
            self._drained = True
            self._queue.put(item)  # leave it for the other consumers
            return _NOTHING
        self._release()
        return item

    def get(self, timeout: float | None) -> Any:
        # docstring inherited
        if self._drained:
            raise ChannelClosedError("get: the channel is closed and drained")
        try:
            item = self._received(self._queue.get(timeout=timeout))
        except queue.Empty:
            raise ChannelTimeoutError(f"get: channel stayed empty for {timeout} s") from None
        if item is _NOTHING:
            raise ChannelClosedError("get: the channel is closed and drained")
        return item

    def get_nowait(self) -> Any:
        # docstring inherited
        if self._drained:
            return _NOTHING
        try:
            return self._received(self._queue.get_nowait())
        except queue.Empty:
            return _NOTHING

    def close(self) -> None:
        # docstring inherited
        if not self._closed.is_set():
            self._closed.set()
            self._queue.put(_ClosedMarker())

    @property
    def closed(self) -> bool:
        # docstring inherited
        return self._closed.is_set()


class Channel:
    """A FIFO channel of at most ``maxsize`` items between producers and consumers.

    Parameters
    ----------
    maxsize
        Items the channel holds before ``put`` blocks; ``0`` or less means unbounded.
    backend
        ``"thread"`` (one process) or ``"process"`` (a ``torch.multiprocessing`` queue; pass
        the channel to child processes as an argument when starting them).
    context
        With ``backend="process"``: the multiprocessing start method (``"spawn"``,
        ``"forkserver"``, ``"fork"``) whose primitives the channel uses; ``None`` for the
        default one. Children must be started from the same context.

    Raises
    ------
    ValueError
        For an unknown ``backend``, or a ``context`` given with ``backend="thread"``.

    Notes
    -----
    A process channel is asynchronous like ``multiprocessing.Queue``: an item becomes
    visible to ``get`` shortly after ``put`` returns, so ``get(timeout=0)`` or the
    ready-now part of :meth:`get_batch` may not see it yet. Order is FIFO per producer.
    Tensors sent through a process channel live in shared memory that the producer owns:
    by ``torch.multiprocessing``'s rules a producer process must stay alive until its
    tensors have been received. Items put by *another* process while ``close()`` runs may
    arrive behind the close marker and be lost; close a channel after its producers finish.
    """

    def __init__(
        self,
        maxsize: int = 0,
        backend: Literal["thread", "process"] = "thread",
        context: str | None = None,
    ) -> None:
        self._backend: _Backend
        if backend == "thread":
            if context is not None:
                raise ValueError("context applies only to backend='process'")
            self._backend = _ThreadBackend(maxsize)
        elif backend == "process":
            self._backend = _ProcessBackend(maxsize, context)
        else:
            raise ValueError(f"backend must be 'thread' or 'process', got {backend!r}")
        self.maxsize = maxsize
        self.backend = backend

    def put(self, item: Any, timeout: float | None = None) -> None:
        """Add ``item``, blocking while the channel is full (at most ``timeout`` seconds).

        Parameters
        ----------
        item
            Any object; with ``backend="process"`` it must be picklable (tensors travel
            through shared memory).
        timeout
            Seconds to wait for room; ``None`` waits for ever, ``0`` does not wait.

        Raises
        ------
        ChannelClosedError
            Once the channel is closed (also when it closes while ``put`` waits).
        ChannelTimeoutError
            When no room appeared within ``timeout`` seconds.
        ValueError
            If ``timeout`` is negative.
        """
        _check_timeout(timeout)
        self._backend.put(item, timeout)

    def get(self, timeout: float | None = None) -> Any:
        """Remove and return the oldest item, blocking while none is there.

        Parameters
        ----------
        timeout
            Seconds to wait for an item; ``None`` waits for ever, ``0`` does not wait.

        Returns
        -------
        Any
            The oldest item (FIFO per producer).

        Raises
        ------
        ChannelClosedError
            When the channel is closed and drained.
        ChannelTimeoutError
            When nothing arrived within ``timeout`` seconds.
        ValueError
            If ``timeout`` is negative.
        """
        _check_timeout(timeout)
        return self._backend.get(timeout)

    def get_batch(self, max_items: int, timeout: float | None = None) -> list[Any]:
        """Wait for one item as :meth:`get` does, then take up to ``max_items`` in all.

        Items beyond the first are taken only if they are ready now.

        Parameters
        ----------
        max_items
            The most items to return, at least 1.
        timeout
            Seconds to wait for the first item, as in :meth:`get`.

        Returns
        -------
        list
            Between 1 and ``max_items`` items, oldest first.

        Raises
        ------
        ValueError
            If ``max_items`` is below 1 or ``timeout`` is negative.
        ChannelClosedError
            When the channel is closed and drained before a first item arrives.
        ChannelTimeoutError
            When no first item arrived within ``timeout`` seconds.
        """
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        batch = [self.get(timeout)]
        while len(batch) < max_items:
            item = self._backend.get_nowait()
            if item is _NOTHING:
                break
            batch.append(item)
        return batch

    def close(self) -> None:
        """Refuse further puts; consumers drain what is left, then get ``ChannelClosedError``."""
        self._backend.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (by any producer or consumer)."""
        return self._backend.closed

    def __iter__(self) -> Iterator[Any]:
        """Yield items until the channel is closed and drained."""
        while True:
            try:
                yield self.get()
            except ChannelClosedError:
                return
