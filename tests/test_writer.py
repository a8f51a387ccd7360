"""BackgroundWriter: order, backpressure, failure and retry."""

from __future__ import annotations

import threading

import pytest

from rbzarr import BufferClosedError, WriterFailedError
from rbzarr.writer import BackgroundWriter


def test_tasks_run_in_order():
    writer = BackgroundWriter(max_pending=3)
    seen: list[int] = []
    for k in range(20):
        writer.submit(lambda k=k: seen.append(k))
    writer.flush()
    assert seen == list(range(20))
    writer.close()


def test_submit_blocks_while_queue_is_full():
    writer = BackgroundWriter(max_pending=1)
    release = threading.Event()
    writer.submit(release.wait)
    submitted = threading.Event()
    thread = threading.Thread(target=lambda: (writer.submit(lambda: None), submitted.set()))
    thread.start()
    assert not submitted.wait(0.2)  # blocked by backpressure
    release.set()
    assert submitted.wait(10)
    thread.join()
    writer.close()


def test_failure_is_kept_raised_and_retried():
    writer = BackgroundWriter(retries=1, retry_delay=0.0)
    attempts = {"n": 0}
    done: list[str] = []

    def flaky():
        attempts["n"] += 1
        if attempts["n"] <= 2:
            raise OSError(f"attempt {attempts['n']}")
        done.append("first")

    writer.submit(flaky)
    writer.submit(lambda: done.append("second"))
    with pytest.raises(WriterFailedError, match="attempt 2"):
        writer.flush()
    assert writer.failed and done == []
    with pytest.raises(WriterFailedError):
        writer.submit(lambda: None)
    writer.flush()
    assert done == ["first", "second"] and not writer.failed
    writer.close()
    writer.close()
    with pytest.raises(BufferClosedError):
        writer.submit(lambda: None)
