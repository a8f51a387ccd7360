"""Concurrency soak: one writer thread, sampling threads and a reader process on one store.

The run is bounded by work, not time: the writer adds ``COUNT`` trajectories; samplers run
until it is done; the reader process exits after a pass over the final index.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_rows_consistent
from crash_writer import B, expected_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.verify import verify_store

COUNT = 80
SAMPLERS = 3
READER = Path(__file__).with_name("soak_reader.py")


def valid_number(number: int, counter: int) -> bool:
    """Whether ``number`` is a row some added trajectory holds (see ``expected_trajectory``)."""
    trajectory_id, row = divmod(number, 1000)
    return trajectory_id < counter and row < (2 + trajectory_id % 4) * B


def run_threads(buffer: TrajectoryReplayBuffer) -> tuple[list[BaseException], list[int]]:
    """Write ids 1..COUNT-1 on one thread while SAMPLERS threads sample; return errors."""
    done = threading.Event()
    errors: list[BaseException] = []
    sampled = [0] * SAMPLERS

    def write() -> None:
        try:
            next_id = 1
            while next_id < COUNT:
                batch = [
                    expected_trajectory(i)
                    for i in range(next_id, min(next_id + 1 + next_id % 3, COUNT))
                ]
                buffer.add_trajectories(batch)
                next_id += len(batch)
                if next_id % 7 == 0:
                    buffer.flush()
            buffer.flush()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def sample(slot: int) -> None:
        try:
            while not done.is_set():
                counter = buffer.trajectory_counter
                numbers = assert_rows_consistent(buffer.sample(32))
                latest = buffer.trajectory_counter
                assert all(valid_number(n, latest) for n in numbers.tolist()), numbers
                assert counter <= latest
                sampled[slot] += 1
                time.sleep(0.001)  # a trainer steps between samples: the writer gets its turn
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write)]
    threads += [threading.Thread(target=sample, args=(slot,)) for slot in range(SAMPLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return errors, sampled


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_writer_samplers_and_a_reader_process_share_a_store(tmp_path):
    store = tmp_path / "store"
    buffer = TrajectoryReplayBuffer(
        seed=7, auto_save=True, auto_save_path=store, cache_size=2, sample_window_size=10
    )
    buffer.add_trajectories([expected_trajectory(0)])
    buffer.flush()
    reader = subprocess.Popen(
        [sys.executable, str(READER), str(store), str(COUNT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=READER.parent,
    )
    assert reader.stdout is not None
    assert reader.stdout.readline().strip() == "ready", reader.stderr
    errors, sampled = run_threads(buffer)
    out, err = reader.communicate(timeout=90)
    assert not errors, errors
    assert reader.returncode == 0, err
    summary = json.loads(out)
    # It saw the store before the writer started and after it finished, at least.
    assert summary["reads"] >= COUNT and summary["states"] >= 2
    assert all(count > 0 for count in sampled)
    buffer.close()
    assert len(buffer) == COUNT and buffer.total_samples == sum(
        (2 + i % 4) * B for i in range(COUNT)
    )
    assert verify_store(store).ok
    fresh = TrajectoryReplayBuffer(sample_window_size=0)
    fresh.load_checkpoint(store)
    numbers = assert_rows_consistent(fresh.sample(256))
    assert torch.all(numbers >= 0)
    print(f"samples per thread {sampled}, reader {summary}")
