"""The io pool's ``run_all``: results in order, and a failure raised only once every share ended."""

from __future__ import annotations

import threading
import time

import pytest

from rbzarr.storage.io import thread_pool


def test_results_keep_the_order_of_the_items() -> None:
    items = list(range(37))
    assert thread_pool.run_all(lambda i: i * i, items, threaded=True) == [i * i for i in items]


def test_a_failure_is_raised_only_once_every_other_share_has_ended() -> None:
    """The calling thread's share fails at once while the pool's shares still run: the
    error reaches the caller after they ended (a caller removing what a failed write made
    must not race a write still going on)."""
    ended: list[int] = []
    lock = threading.Lock()
    items = list(range(thread_pool.WORKERS))

    def work(item: int) -> None:
        if item == 0:  # the first share: the calling thread's
            raise ValueError("first share fails")
        time.sleep(0.2)
        with lock:
            ended.append(item)

    with pytest.raises(ValueError, match="first share fails"):
        thread_pool.run_all(work, items, threaded=True)
    assert sorted(ended) == items[1:]
