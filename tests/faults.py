"""Fault injection at rbzarr's storage seam: call *k* of an operation fails, then storage heals.

The seam is where rbzarr's bytes meet a backend, wrapped in place (no parameter is threaded
through the layers): every :class:`~rbzarr.storage.io.location.Location` call that touches the
backend (read, write, delete, list, exists) and, below the layouts, the writes of a
trajectory group's files (``write_file`` / ``commit_file`` of the local publisher, and its
``create_file`` of the root groups; a zarr store's ``set`` elsewhere).  Code that moves
between modules keeps going through this seam.

:class:`Faults` first counts the calls of an operation (:meth:`Faults.count`), then replays
it with call ``k`` faulted (:meth:`Faults.arm`) in one of :data:`KINDS`:

``fail``
    The call raises before doing anything, once.
``lost``
    The call does its work, then raises (a reply lost on the way back), once.
``outage``
    The call and the next :data:`OUTAGE_CALLS` - 1 calls raise (storage down a while).
``hang``
    The call waits :data:`HANG_SECONDS`, then works (a bounded stall).

At each fault, :attr:`Faults.on_fault` runs outside the seam (its own calls are neither
counted nor faulted): a test checks there what a reader sees while storage is failing.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zarr.storage

from rbzarr.errors import StorageUnavailableError
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import publish

KINDS = ("fail", "lost", "outage", "hang")
OUTAGE_CALLS = 2
HANG_SECONDS = 0.05
LOCATION_CALLS = ("read_bytes", "write_bytes", "delete", "list_names", "list_files", "exists")


class InjectedFault(OSError):
    """The backend error a faulted call raises (EIO: retrying may cure it)."""

    def __init__(self, call: str) -> None:
        super().__init__(errno.EIO, f"injected fault at {call}")


class Faults:
    """Counts the storage calls made while armed and faults the chosen one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.fired: list[str] = []
        self.on_fault: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._outside = threading.local()
        self._active = False
        self._target: int | None = None
        self._kind = "fail"
        for name in LOCATION_CALLS:
            monkeypatch.setattr(Location, name, self._wrap(getattr(Location, name), name, True))
        for name in ("write_file", "commit_file", "create_file"):
            monkeypatch.setattr(publish, name, self._wrap(getattr(publish, name), name, False))
        for store in (zarr.storage.FsspecStore, zarr.storage.LocalStore):
            monkeypatch.setattr(store, "set", self._wrap_async(store.set, f"{store.__name__}.set"))

    def count(self) -> None:
        """Count the calls from now on, faulting none."""
        self._reset(None, "fail")

    def arm(self, k: int, kind: str) -> None:
        """Count the calls from now on and fault call ``k`` (0-based) with ``kind``."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {KINDS}")
        self._reset(k, kind)

    def disarm(self) -> None:
        """Stop counting and faulting."""
        with self._lock:
            self._active = False

    @contextlib.contextmanager
    def outside(self) -> Iterator[None]:
        """Calls made in this block (this thread) are neither counted nor faulted."""
        self._outside.on = True
        try:
            yield
        finally:
            self._outside.on = False

    def _reset(self, target: int | None, kind: str) -> None:
        with self._lock:
            self.calls = []
            self.fired = []
            self._target, self._kind, self._active = target, kind, True

    def _action(self, name: str) -> str | None:
        """Count a call; what to do to it (``None``: nothing)."""
        if getattr(self._outside, "on", False):
            return None
        with self._lock:
            if not self._active:
                return None
            index = len(self.calls)
            self.calls.append(name)
            if self._target is None or index < self._target:
                return None
            last = self._target + (OUTAGE_CALLS if self._kind == "outage" else 1)
            if index >= last:
                return None
            self.fired.append(name)
            return self._kind

    def _fault(self, name: str, kind: str, local: bool) -> Exception:
        if self.on_fault is not None:
            with self.outside():
                self.on_fault()
        if local:  # what a Location call raises for a backend failure
            return StorageUnavailableError(f"injected fault at {name}")
        return InjectedFault(name)

    def _wrap(self, call: Callable[..., Any], name: str, local: bool) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            kind = self._action(name)
            if kind is None:
                return call(*args, **kwargs)
            if kind == "hang":
                if self.on_fault is not None:
                    with self.outside():
                        self.on_fault()
                time.sleep(HANG_SECONDS)
                return call(*args, **kwargs)
            if kind == "lost":
                call(*args, **kwargs)
            raise self._fault(name, kind, local)

        return wrapped

    def _wrap_async(self, call: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(call)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            kind = self._action(name)
            if kind is None:
                return await call(*args, **kwargs)
            if kind == "hang":
                time.sleep(HANG_SECONDS)
                return await call(*args, **kwargs)
            if kind == "lost":
                await call(*args, **kwargs)
            raise self._fault(name, kind, False)

        return wrapped
