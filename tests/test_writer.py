"""BackgroundWriter: order, backpressure, retries until success, bounded waits."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from rbzarr import BufferClosedError, UncommittedWritesWarning, WriterFailedError
from rbzarr.buffer.background import BackgroundWriter


def test_tasks_run_in_order():
    writer = BackgroundWriter(max_pending=3)
    seen: list[int] = []
    for k in range(20):
        writer.wait_for_room(1)
        writer.submit([lambda k=k: seen.append(k)])
    writer.flush()
    assert seen == list(range(20))
    writer.close()


def test_wait_for_room_blocks_while_queue_is_full():
    writer = BackgroundWriter(max_pending=1)
    release = threading.Event()
    writer.submit([release.wait])
    submitted = threading.Event()

    def submit_one() -> None:
        writer.wait_for_room(1)
        writer.submit([lambda: None])
        submitted.set()

    thread = threading.Thread(target=submit_one)
    thread.start()
    assert not submitted.wait(0.2)  # blocked by backpressure
    release.set()
    assert submitted.wait(10)
    thread.join()
    writer.close()


def test_a_call_larger_than_the_queue_is_admitted_alone():
    writer = BackgroundWriter(max_pending=2)
    writer.wait_for_room(5)  # an empty queue admits any call
    done: list[int] = []
    writer.submit([lambda k=k: done.append(k) for k in range(5)])
    writer.close()
    assert done == list(range(5))


def test_failing_task_is_retried_until_it_succeeds_and_nothing_is_dropped():
    writer = BackgroundWriter(max_pending=2, retry_delay=0.001, max_retry_delay=0.01)
    attempts = {"n": 0}
    fixed = threading.Event()
    done: list[str] = []

    def flaky() -> None:
        attempts["n"] += 1
        if not fixed.is_set():
            raise OSError(f"attempt {attempts['n']}")
        done.append("first")

    writer.submit([flaky, lambda: done.append("second")])
    with pytest.raises(
        WriterFailedError, match=r"2 write\(s\) to storage not committed.*attempt"
    ) as info:
        writer.flush(timeout=0.2)
    assert isinstance(info.value.__cause__, OSError)
    assert attempts["n"] > 1 and done == []
    # A full queue of a failing writer refuses at once, with nothing queued.
    with pytest.raises(WriterFailedError, match="nothing changed"):
        writer.wait_for_room(1)
    assert writer.pending == 2
    # close() waits a bounded time and reports, every time; the writes stay queued.
    for _ in range(2):
        with pytest.raises(WriterFailedError, match=r"2 write\(s\)"):
            writer.close(timeout=0.05)
    with pytest.raises(BufferClosedError):
        writer.submit([lambda: None])
    fixed.set()
    writer.close()
    assert done == ["first", "second"] and writer.last_error is None
    writer.close()
    writer.flush()


def test_close_without_waiting_warns_and_a_later_close_retries():
    writer = BackgroundWriter(retry_delay=0.01, target="file:///runs/a")
    fixed, retried = threading.Event(), threading.Event()
    done: list[str] = []
    attempts = {"n": 0}

    def flaky() -> None:
        attempts["n"] += 1
        if attempts["n"] > 1:
            retried.set()  # by now the first failure is recorded
        if not fixed.is_set():
            raise OSError("disk gone")
        done.append("first")

    writer.submit([flaky, lambda: done.append("second")])
    assert retried.wait(10)
    with pytest.warns(
        UncommittedWritesWarning,
        match=r"close\(wait=False\): 2 write\(s\) to file:///runs/a are not committed yet "
        r"\(last error: disk gone\).*lost when the process ends",
    ):
        writer.close(wait=False)
    # The thread stops at the next failure: flush says so at once, without waiting.
    with pytest.raises(WriterFailedError, match=r"2 write\(s\).*stopped at this failure"):
        writer.flush(timeout=60)
    assert done == []
    fixed.set()
    writer.close()  # retries what was left, and waits
    assert done == ["first", "second"] and writer.pending == 0


def test_close_without_waiting_is_silent_when_everything_is_committed():
    writer = BackgroundWriter()
    writer.submit([lambda: None])
    writer.flush()
    writer.close(wait=False)  # warnings are errors in this suite


LOST_AT_EXIT = """
from rbzarr.buffer.background import BackgroundWriter
def fail():
    raise OSError("disk gone")
writer = BackgroundWriter(retry_delay=0.01, target="file:///runs/a")
writer.submit([fail, fail, fail])
writer.close(wait=False)
"""


def test_writes_lost_at_exit_are_reported_as_lost():
    result = subprocess.run(
        [sys.executable, "-c", LOST_AT_EXIT],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "UncommittedWritesWarning: close(wait=False): 3 write(s)" in result.stderr
    assert (
        "rbzarr: at exit: 3 write(s) to file:///runs/a were not committed "
        "(last error: disk gone); the process is ending, so they are lost"
    ) in result.stderr
    assert "are retried" not in result.stderr
