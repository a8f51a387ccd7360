"""A process forked while other threads use rbzarr's locks finds them free (DataLoader's fork
workers read the buffer's ids while its writer and read-ahead threads run)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.storage.zarr import regions
from rbzarr.trajectory.staging import BLOCK_BYTES, staging_buffer

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")

FORKS = 60


def _forks_finish(busy: Callable[[], object], in_child: Callable[[], object]) -> list[int]:
    """Fork up to ``FORKS`` times while a thread calls ``busy`` in a loop; each child calls
    ``in_child`` and exits.  The first child still running 5 s after its fork (killed)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            busy()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:  # the child: one thread, the locks as the fork left them
                try:
                    in_child()
                finally:
                    os._exit(0)
            waiter = threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True)
            waiter.start()
            waiter.join(timeout=5)
            if waiter.is_alive():  # hung: killed, then reaped by the waiter
                os.kill(pid, signal.SIGKILL)
                waiter.join()
                return [pid]
    finally:
        stop.set()
        thread.join()
    return []


def test_a_child_forked_while_a_thread_reads_the_buffer_reads_it_too() -> None:
    buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=2)
    buffer.add_trajectories([make_trajectory(4, 2, 1000 * i) for i in range(2)])
    assert _forks_finish(lambda: buffer.index_entries, lambda: buffer.trajectory_ids) == []
    assert len(buffer.trajectory_ids) == 2  # and the parent goes on as before


def test_a_child_forked_while_a_thread_stages_copies_stages_its_own() -> None:
    def stage() -> None:
        staging_buffer(BLOCK_BYTES)  # lent and, dropped at once, taken back

    assert _forks_finish(stage, stage) == []


@pytest.mark.skipif(sys.platform != "linux", reason="regions map with Linux's mmap")
def test_a_child_forked_while_a_thread_maps_shards_maps_its_own(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    shard.write_bytes(bytes(range(256)) * 64)  # 16 KiB: 128 rows of 128 bytes
    fd = os.open(shard, os.O_RDONLY)

    def map_one() -> None:
        bay = regions.place(fd, 16 << 10, 128)
        assert bay is not None
        bay.release()

    try:
        assert _forks_finish(map_one, map_one) == []
    finally:
        os.close(fd)
