"""Crash-test worker: a fork server whose children append to a store until SIGKILLed.

Importing torch and rbzarr costs ~2 s, too much to pay once per kill.  This script imports
them once, then serves one command per line on stdin::

    run <store> <format> <report-file> <delay-seconds>

It forks a child that opens ``<store>`` the way a user continues a run (``load_checkpoint``
on it, or a fresh buffer when nothing is committed there yet) and appends trajectories in a
loop; after each ``flush()`` it appends the ids it has committed so far to
``<report-file>``.  The server kills the child with SIGKILL after ``<delay-seconds>``, reaps
it and answers one line: ``killed``, or ``exited <code>`` if the child ended on its own (a
failure: it writes forever unless something raised).

The content of trajectory ``i`` depends only on ``i`` (:func:`expected_trajectory`), so a
reader can check any listed trajectory against what was written.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback

from conftest import make_trajectory

from rbzarr import CheckpointNotFoundError, Trajectory, TrajectoryReplayBuffer

B = 3


def expected_trajectory(trajectory_id: int) -> Trajectory:
    """What the worker writes as trajectory ``trajectory_id`` (T and model id vary)."""
    T = 2 + trajectory_id % 4
    return make_trajectory(
        T, B, base=1000 * trajectory_id, epochs=2 if T % 2 == 0 else 1, mwid=f"w{trajectory_id % 3}"
    )


def write_forever(store: str, fmt: str, report: str) -> None:
    """Continue the store at ``store`` and append trajectories until killed."""
    options = {"auto_save": True, "auto_save_path": store, "trajectory_format": fmt}
    buffer = TrajectoryReplayBuffer(cache_size=2, max_pending_writes=4, **options)
    try:
        buffer.load_checkpoint(store)
    except CheckpointNotFoundError:
        if os.path.exists(os.path.join(store, "metadata.json")) or os.path.exists(
            os.path.join(store, "trajectory_index.json")
        ):
            raise
    rng = random.Random(os.getpid())
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    added: list[int] = []
    while True:
        first = buffer.trajectory_counter
        ids = list(range(first, first + rng.randint(1, 3)))
        buffer.add_trajectories([expected_trajectory(i) for i in ids])
        added.extend(ids)
        if rng.random() < 0.5:
            buffer.flush()
            os.write(fd, "".join(f"{i}\n" for i in added).encode())


def serve() -> None:
    """Answer ``run`` commands from stdin until it closes."""
    for line in sys.stdin:
        _, store, fmt, report, delay = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                write_forever(store, fmt, report)
            except BaseException:
                traceback.print_exc()
                code = 3
            finally:
                os._exit(code)
        time.sleep(float(delay))  # the kill lands at a random point of the child's work
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            answer = "killed"
        else:
            answer = f"exited {os.waitstatus_to_exitcode(status)}"
        print(answer, flush=True)


if __name__ == "__main__":
    serve()
