"""``save_checkpoint`` copies without the buffer's lock: sampling and adds go on meanwhile.

The checkpoint goes to moto behind the test's proxy, which holds every request; the buffer's
own store is local, so ``sample()`` and ``add_trajectories()`` need nothing of S3.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_trajectory

from benchmarks.s3_server import S3Proxy
from rbzarr import TrajectoryReplayBuffer, open_buffer

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

T, B = 4, 3
SAVED = 6


def test_sample_and_add_proceed_while_a_checkpoint_is_written_to_slow_s3(
    tmp_path: Path, s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    buffer = TrajectoryReplayBuffer(
        seed=3,
        cache_size=0,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=tmp_path / "store",
        storage_options=s3_options,
    )
    buffer.add_trajectories([make_trajectory(T, B, 100 * i) for i in range(SAVED)])
    buffer.flush()
    url = f"s3://{s3_bucket}/checkpoint"
    s3_proxy.slow_down(0.2)
    failures: list[BaseException] = []

    def save() -> None:
        try:
            buffer.save_checkpoint(url, copy=True)
        except BaseException as exc:  # re-raised by the test below
            failures.append(exc)

    saver = threading.Thread(target=save)
    saver.start()
    started = threading.Event()
    while saver.is_alive() and not started.is_set():  # the first copy: the set is taken
        started.wait(0.01)
        if any(r.method == "PUT" for r in s3_proxy.requests):
            started.set()
    assert started.is_set(), "the save ended before it wrote anything"

    batch = buffer.sample(8)
    buffer.add_trajectories([make_trajectory(T, B, 100 * SAVED)])
    during = len(s3_proxy.requests)
    still_saving = saver.is_alive()

    s3_proxy.slow_down(0)
    saver.join(timeout=100)  # a hang guard only
    assert not failures, failures
    assert still_saving, "sample() and add_trajectories() waited for the checkpoint's copies"
    assert len(s3_proxy.requests) > during  # the save went on after both returned
    assert batch["rewards"].shape[0] == 8
    assert len(buffer) == SAVED + 1
    buffer.close()
    # The checkpoint is the set of the call: the trajectory added meanwhile is not in it.
    saved = open_buffer(url, s3_options)
    assert saved.ids == list(range(SAVED))
    for trajectory_id in saved.ids:
        assert torch.equal(
            saved.trajectory(trajectory_id).rewards, buffer.trajectory(trajectory_id).rewards
        )
