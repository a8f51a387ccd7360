"""The store as the transport: commit notices, and a learner that adds by reference."""

from __future__ import annotations

import pickle

import pytest
import torch
from conftest import make_trajectory

from rbzarr import CheckpointNotFoundError, InvalidTrajectoryError, TrajectoryReplayBuffer
from rbzarr.distributed import CommitNotice, commit_notices
from rbzarr.storage.index.slots import ID_STRIDE


def trajectories(first: int, count: int) -> list:
    return [make_trajectory(2 + k % 3, 3, base=1000 * (first + k)) for k in range(count)]


def assert_same_batch(one: dict, other: dict) -> None:
    assert one.keys() == other.keys()
    for key, value in one.items():
        if isinstance(value, dict):
            assert_same_batch(value, other[key])
        else:
            assert value.dtype == other[key].dtype and torch.equal(value, other[key])


def test_a_learner_adding_by_reference_draws_what_an_adding_buffer_draws(tmp_path):
    store = str(tmp_path / "store")
    first = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    second = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    notices: list[CommitNotice] = []
    for k in range(3):  # two writers, interleaved in notice order
        for writer, base in ((first, 0), (second, 100)):
            writer.add_trajectories(trajectories(base + k, 1))
            writer.flush()
            notices += commit_notices(writer, writer.trajectory_ids[-1:])
    assert [n.writer for n in notices] == [0, 1, 0, 1, 0, 1]
    assert [n.trajectory_id for n in notices] == [0, ID_STRIDE, 1, ID_STRIDE + 1, 2, ID_STRIDE + 2]
    assert max(len(pickle.dumps(n)) for n in notices) <= 1024

    learner = TrajectoryReplayBuffer(
        seed=7, sample_window_size=4, auto_save=True, auto_save_path=store
    )
    adding = TrajectoryReplayBuffer(seed=7, sample_window_size=4)
    learner.add_committed(notices[:4])
    learner.add_committed(notices[4:])
    for k in range(3):
        adding.add_trajectories(trajectories(k, 1) + trajectories(100 + k, 1))
    assert learner.trajectory_ids == [n.trajectory_id for n in notices]
    assert learner.total_samples == adding.total_samples
    for _ in range(3):
        assert_same_batch(learner.sample(40), adding.sample(40))
    # Refused with nothing changed: a notice twice, of another store, or not committed.
    with pytest.raises(InvalidTrajectoryError, match="already"):
        learner.add_committed(notices[:1])
    other = CommitNotice(str(tmp_path / "other"), notices[0].entry)
    with pytest.raises(InvalidTrajectoryError, match="cannot be added by reference"):
        learner.add_committed([other])
    ghost = CommitNotice(store, {**notices[0].entry, "trajectory_id": 77})
    with pytest.raises(CheckpointNotFoundError, match="no committed data"):
        learner.add_committed([ghost])
    assert len(learner) == 6
    for buffer in (first, second, learner):
        buffer.close()


def test_notices_need_a_committed_trajectory_of_a_store(tmp_path):
    with pytest.raises(ValueError, match="auto_save"):
        commit_notices(TrajectoryReplayBuffer(), [0])
    with (
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "s")) as buffer,
        pytest.raises(CheckpointNotFoundError, match="not committed"),
    ):
        commit_notices(buffer, [0])
    with pytest.raises(ValueError, match="auto_save=True"):
        TrajectoryReplayBuffer().add_committed([])


def test_a_referenced_trajectory_enters_the_cache_on_its_first_read(tmp_path):
    store, elsewhere = str(tmp_path / "store"), str(tmp_path / "by-value")
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as writer:
        writer.add_trajectories(trajectories(0, 6))
        writer.flush()
        notices = commit_notices(writer, writer.trajectory_ids)
    options = {"seed": 3, "sample_window_size": 2, "cache_size": 3, "auto_save": True}
    learner = TrajectoryReplayBuffer(auto_save_path=store, **options)
    adding = TrajectoryReplayBuffer(auto_save_path=elsewhere, **options)
    learner.add_committed(notices)
    adding.add_trajectories(trajectories(0, 6))
    adding.flush()
    assert learner.get_stats()["cache_size"] == 0  # nothing read at add time
    assert_same_batch(learner.sample(30), adding.sample(30))  # the window's two: read, cached
    learner.sample_window_size = adding.sample_window_size = 3
    assert_same_batch(learner.sample(30), adding.sample(30))  # and the third
    keys = ("cache_size", "cache_bytes", "total_samples")
    assert [learner.get_stats()[k] for k in keys] == [adding.get_stats()[k] for k in keys]
    assert learner.get_stats()["cache_size"] == 3
    # The cache now holds what the by-value buffer holds: draws need no store at all.
    for path in (store, elsewhere):
        (tmp_path / path).rename(f"{path}-gone")
    for _ in range(3):
        assert_same_batch(learner.sample(50), adding.sample(50))
    for k in (3, 4, 5):
        assert_same_batch(learner.trajectory(k).tensors(), adding.trajectory(k).tensors())
    for path in (store, elsewhere):  # back for close(), which records the samplers' state
        (tmp_path / f"{path}-gone").rename(path)
    learner.close()
    adding.close()


@pytest.mark.s3
def test_a_learner_built_on_an_empty_s3_store_adds_what_a_writer_commits_later(
    s3_bucket, s3_options
):
    # The learner lists the store while it is empty; the writer's commit comes after.
    store = f"s3://{s3_bucket}/store"
    learner = TrajectoryReplayBuffer(
        seed=7, auto_save=True, auto_save_path=store, storage_options=s3_options
    )
    writer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, storage_options=s3_options
    )
    writer.add_trajectories(trajectories(0, 2))
    writer.flush()
    learner.add_committed(commit_notices(writer, writer.trajectory_ids))
    adding = TrajectoryReplayBuffer(seed=7)
    adding.add_trajectories(trajectories(0, 2))
    assert_same_batch(learner.sample(16), adding.sample(16))
    for buffer in (writer, learner):
        buffer.close()
