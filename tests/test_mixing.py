"""ReplayDataset: exact demo counts, annealing, sequence mode and samples per insert."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_sequences import Spec, make

from rbzarr import InsertTimeoutError, ReplayDataset, TrajectoryReplayBuffer
from rbzarr.data.mixing import DemoSchedule

DEMO_CODE = 500_000_000  # demo rows encode trajectory 500 and up


def buffers() -> tuple[TrajectoryReplayBuffer, TrajectoryReplayBuffer]:
    replay = TrajectoryReplayBuffer(seed=1, sample_window_size=0)
    replay.add_trajectories([make(Spec(i, 6, 2, frozenset({(3, 0)}))) for i in range(2)])
    demo = TrajectoryReplayBuffer(seed=2, sample_window_size=0)
    demo.add_trajectories([make(Spec(500 + i, 5, 1, frozenset({(4, 0)}))) for i in range(2)])
    return replay, demo


def demo_counts(batch: dict) -> torch.Tensor:
    """Per row (or sequence) of ``batch``: whether it came from the demo buffer."""
    first = batch["curr_obs"]["state"][..., 0]
    return (first.reshape(first.shape[0], -1)[:, 0] >= DEMO_CODE).long()


def test_every_batch_has_exactly_the_demo_count_last() -> None:
    replay, demo = buffers()
    dataset = ReplayDataset(
        replay, 10, num_batches=30, seed=0, demo_buffer=demo, demo_fraction=0.25
    )
    batches = list(dataset)
    assert len(batches) == 30
    for batch in batches:
        assert demo_counts(batch).tolist() == [0] * 8 + [1] * 2  # round(2.5) = 2, at the end
    assert dataset.get_stats()["demo_items"] == 60


def test_annealing_moves_the_count_linearly() -> None:
    schedule = DemoSchedule(10, 0.5, 0.0, 5)
    assert [schedule.demo_rows(k) for k in range(8)] == [5, 4, 3, 2, 1, 0, 0, 0]
    rising = DemoSchedule(7, 0.0, 1.0, 3)
    assert [rising.demo_rows(k) for k in range(5)] == [0, 2, 5, 7, 7]  # round(2.33), round(4.67)
    replay, demo = buffers()
    dataset = ReplayDataset(
        replay,
        10,
        num_batches=8,
        seed=0,
        demo_buffer=demo,
        demo_fraction=0.5,
        demo_fraction_end=0.0,
        anneal_batches=5,
    )
    assert [int(demo_counts(b).sum()) for b in dataset] == [5, 4, 3, 2, 1, 0, 0, 0]
    dataset.set_epoch(1)  # epochs continue the schedule: batch 8 onwards
    assert [int(demo_counts(b).sum()) for b in dataset] == [0] * 8
    with pytest.raises(ValueError, match="anneal_batches"):
        ReplayDataset(replay, 10, demo_buffer=demo, demo_fraction=0.5, demo_fraction_end=0.1)
    with pytest.raises(ValueError, match="demo_fraction_end"):
        ReplayDataset(replay, 10, demo_buffer=demo, demo_fraction_end=1.5, anneal_batches=2)


def test_sequence_mode_mixes_sequences_exactly() -> None:
    replay, demo = buffers()
    dataset = ReplayDataset(
        replay,
        6,
        num_batches=10,
        seed=0,
        demo_buffer=demo,
        demo_fraction=0.5,
        sequence_length=4,
    )
    for batch in dataset:
        assert batch["curr_obs"]["state"].shape == (6, 4, 2)
        assert batch["mask"].shape == (6, 4)
        assert demo_counts(batch).tolist() == [0, 0, 0, 1, 1, 1]
        # Each sequence is consecutive steps of one column until its mask ends.
        steps = batch["curr_obs"]["state"][..., 0]
        for row, mask in zip(steps, batch["mask"], strict=True):
            real = row[mask]
            assert torch.equal(real - real[0], torch.arange(len(real), dtype=real.dtype)) or (
                real[0] % 1000 > real[-1] % 1000  # crossed into the next trajectory
            )
    with pytest.raises(ValueError, match="sample_sequences"):
        list(ReplayDataset(_Rows(), 4, num_batches=1, sequence_length=3))


class _Rows:
    """A source without sequences."""

    def sample(self, num_chunks: int) -> dict:
        return {"x": torch.zeros(num_chunks)}


def test_samples_per_insert_waits_for_inserts_and_reports_the_ratio() -> None:
    replay, _ = buffers()  # 2 trajectories of 6 x 2 = 24 rows
    # No insert_timeout ends a wait in this test: only an insert or close() does.
    dataset = ReplayDataset(replay, 8, seed=0, samples_per_insert=1.0, insert_timeout=3600)
    iterator = iter(dataset)
    # sampled <= 1.0 * 24 before each batch: batches 1..4 (0, 8, 16, 24 rows before each).
    for _ in range(4):
        next(iterator)
    got: list[float] = []
    waiter = threading.Thread(target=lambda: (next(iterator), got.append(time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    assert not got, "the fifth batch must wait for an insert"
    added = time.monotonic()
    replay.add_trajectories([make(Spec(2, 6, 2, frozenset()))])  # 12 more rows: limit 36
    waiter.join(timeout=10)
    assert got and got[0] >= added
    stats = dataset.get_stats()
    assert stats["sampled_rows"] == 40
    assert stats["inserted_rows"] == 36
    assert stats["samples_per_insert"] == pytest.approx(40 / 36)
    assert stats["sampled_rows"] <= 1.0 * stats["inserted_rows"] + 8
    assert stats["rate_limited_s"] >= 0.25
    # The producer now waits for an insert that never comes: close() wakes it, and it has
    # ended when close() returns (without the wake-up this would hang until pytest's timeout).
    assert iterator.is_running
    iterator.close()
    assert not iterator.is_running


def test_no_inserts_is_a_clear_timeout() -> None:
    replay, _ = buffers()
    dataset = ReplayDataset(replay, 24, seed=0, samples_per_insert=0.5, insert_timeout=0.2)
    iterator = iter(dataset)
    next(iterator)  # 0 <= 12
    with pytest.raises(InsertTimeoutError, match=r"no insert arrived for 0\.2 s"):
        next(iterator)  # 24 > 12, and nothing arrives
    with pytest.raises(ValueError, match="samples_per_insert"):
        ReplayDataset(_Rows(), 4, samples_per_insert=1.0).__iter__()
    with pytest.raises(ValueError, match="samples_per_insert must be > 0"):
        ReplayDataset(replay, 4, samples_per_insert=0.0).__iter__()
