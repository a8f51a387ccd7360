"""Samples per insert: a sampler that waits for inserts instead of sampling stale data ahead.

Before each batch the limiter waits until ``sampled <= ratio * inserted``, so that after the
batch ``sampled <= ratio * inserted + batch rows`` (Reverb's ``SampleToInsertRatio`` without
its lower bound).  *Inserted* is the source's ``total_samples`` (a view re-reads its index
while waiting); *sampled* counts replay rows drawn, ``n * length`` for sequences.  It waits
with exponential backoff (sleeping, never spinning), and raises
:class:`~rbzarr.errors.InsertTimeoutError` when no insert arrives for ``timeout`` seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rbzarr.errors import InsertTimeoutError

__all__ = ["SampleRateLimiter", "inserted_rows"]

FIRST_DELAY_S = 0.001
MAX_DELAY_S = 0.05


def inserted_rows(source: Any) -> int:
    """The rows ``source`` holds now (``total_samples``; a view re-reads its index first)."""
    refresh = getattr(source, "refresh", None)
    if callable(refresh):
        refresh()
    return int(source.total_samples)


class SampleRateLimiter:
    """Keeps one sampler's drawn rows within ``ratio`` times the rows inserted into its source."""

    def __init__(self, source: Any, ratio: float, timeout: float, stop: threading.Event) -> None:
        if not ratio > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {ratio}")
        if not timeout > 0:
            raise ValueError(f"insert_timeout must be > 0 seconds, got {timeout}")
        if not hasattr(source, "total_samples"):
            raise ValueError(
                f"samples_per_insert needs a source that counts its rows (total_samples); "
                f"{type(source).__name__} has none"
            )
        self.source = source
        self.ratio = ratio
        self.timeout = timeout
        self._stop = stop  # set when the iterator closes: a wait must not outlive it
        self.sampled = 0
        self.inserted = 0
        self.waited_s = 0.0

    def wait(self) -> None:
        """Block until the next batch may be drawn (or the iterator stops).

        Raises
        ------
        InsertTimeoutError
            No row was inserted for ``timeout`` seconds while waiting.
        """
        self.inserted = int(self.source.total_samples)
        if self.sampled <= self.ratio * self.inserted:
            return
        began = last_insert = time.monotonic()
        delay = FIRST_DELAY_S
        while not self._stop.wait(delay):
            inserted = inserted_rows(self.source)
            now = time.monotonic()
            if inserted > self.inserted:
                self.inserted, last_insert, delay = inserted, now, FIRST_DELAY_S
            if self.sampled <= self.ratio * self.inserted:
                break
            if now - last_insert >= self.timeout:
                self.waited_s += now - began
                raise InsertTimeoutError(
                    f"samples_per_insert={self.ratio}: {self.sampled} rows sampled from "
                    f"{self.inserted} inserted, and no insert arrived for {self.timeout:g} s "
                    "(insert_timeout); is the collector still adding trajectories?"
                )
            delay = min(2 * delay, MAX_DELAY_S)
        self.waited_s += time.monotonic() - began

    def record(self, rows: int) -> None:
        """Count ``rows`` drawn."""
        self.sampled += rows
