"""Deadlines for remote calls: an endpoint that accepts connections and never answers.

botocore's ``connect_timeout`` and ``read_timeout`` bound one request, but every retry
(botocore's and s3fs's) starts the clock again, and zarr's :func:`zarr.core.sync.sync` waits
forever by default.  Every remote call rbzarr makes therefore runs under a deadline: zarr
coroutines through :func:`sync` (the coroutine is cancelled when the deadline passes), fsspec's
blocking methods with the keyword arguments of :func:`deadline_options` (fsspec's own ``sync``
cancels the call).  A call that passes its deadline raises :class:`TimeoutError` naming it,
which :func:`~rbzarr.storage.io.backends.translate_errors` turns into
:class:`~rbzarr.errors.StorageUnavailableError` naming the URL.

The deadline is :data:`DEFAULT_DEADLINE_S` seconds, or the environment variable
:data:`DEADLINE_ENV`; a call moving ``nbytes`` gets ``nbytes / MIN_RATE`` seconds more, so a
large write on a slow but live link is not cut off.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import fsspec.asyn

__all__ = [
    "DEADLINE_ENV",
    "DEFAULT_DEADLINE_S",
    "MIN_RATE",
    "deadline_options",
    "deadline_s",
    "sync",
]

T = TypeVar("T")

DEFAULT_DEADLINE_S = 30.0
DEADLINE_ENV = "RBZARR_DEADLINE_S"
# Bytes per second below which a transfer counts as stalled (1 MiB/s).
MIN_RATE = 1 << 20
# The waiting thread gives the loop this long past the deadline to deliver the cancellation.
_CANCEL_GRACE_S = 5.0


def deadline_s(nbytes: int = 0) -> float:
    """Seconds a call moving ``nbytes`` may take: :data:`DEADLINE_ENV` or the default, plus
    ``nbytes / MIN_RATE``."""
    text = os.environ.get(DEADLINE_ENV, "")
    try:
        base = float(text) if text else DEFAULT_DEADLINE_S
    except ValueError:
        raise ValueError(f"{DEADLINE_ENV} must be a number of seconds, got {text!r}") from None
    if not base > 0:
        raise ValueError(f"{DEADLINE_ENV} must be > 0 seconds, got {text!r}")
    return base + nbytes / MIN_RATE


def sync(coro: Coroutine[Any, Any, T], nbytes: int = 0) -> T:
    """zarr's :func:`~zarr.core.sync.sync` of ``coro``, cancelled after :func:`deadline_s`.

    Raises
    ------
    TimeoutError
        ``coro`` did not finish within the deadline (it is cancelled).
    """
    from zarr.core.sync import sync as zarr_sync  # noqa: PLC0415 (zarr only when used)

    seconds = deadline_s(nbytes)
    started = time.monotonic()
    try:
        return zarr_sync(asyncio.wait_for(coro, seconds), timeout=seconds + _CANCEL_GRACE_S)
    except TimeoutError:
        if time.monotonic() - started < seconds:
            raise  # a timeout of the backend's own, not the deadline
        raise TimeoutError(no_answer(seconds)) from None


def deadline_options(fs: Any, nbytes: int = 0) -> dict[str, float]:
    """``{"timeout": seconds}`` for a blocking method of an asynchronous fsspec filesystem
    (fsspec's ``sync`` takes it and cancels the call); ``{}`` for others (local, memory),
    whose calls do not wait on a network."""
    if isinstance(fs, fsspec.asyn.AsyncFileSystem) and not fs.asynchronous:
        return {"timeout": deadline_s(nbytes)}
    return {}


def no_answer(seconds: float) -> str:
    """The message of a call that passed its deadline."""
    return (
        f"no answer within {seconds:g} s (the endpoint accepts connections but does not "
        f"respond); set {DEADLINE_ENV} to wait longer"
    )
