"""RLinf's compatibility surface on the buffer: names, argument names and results."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import torch
from conftest import assert_rows_consistent, assert_same_trajectory, make_trajectory
from rlinf_oracle import RLinfBuffer, assert_batches_equal, make_rlinf_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.trajectory.model import as_trajectory

MODES = ["memory", "zarr", "pt", "pkl"]


def new_buffer(tmp_path, mode: str, **kwargs) -> TrajectoryReplayBuffer:
    if mode == "memory":
        return TrajectoryReplayBuffer(**kwargs)
    return TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", trajectory_format=mode, **kwargs
    )


def test_is_ready_takes_rlinfs_keyword_and_counts_trajectories():
    buffer = TrajectoryReplayBuffer()
    assert buffer.is_ready(min_size=0) and not buffer.is_ready(min_size=1)
    buffer.add_trajectories([make_rlinf_trajectory(3, 4, 0), make_rlinf_trajectory(3, 4, 12)])
    assert buffer.is_ready(min_size=2) and not buffer.is_ready(3)
    assert list(inspect.signature(buffer.is_ready).parameters) == ["min_size"]


def test_is_ready_async_is_awaitable():
    buffer = TrajectoryReplayBuffer()
    assert inspect.iscoroutinefunction(buffer.is_ready_async)

    async def worker_loop() -> list[bool]:
        seen = [await buffer.is_ready_async(1)]
        buffer.add_trajectories([make_rlinf_trajectory(2, 2, 0)])
        seen.append(await buffer.is_ready_async(min_size=1))
        return seen

    assert asyncio.run(worker_loop()) == [False, True]


def test_sample_chunks_is_sample():
    one, other = TrajectoryReplayBuffer(seed=5), TrajectoryReplayBuffer(seed=5)
    for buffer in (one, other):
        buffer.add_trajectories([make_trajectory(4, 3, 0, epochs=2), make_trajectory(2, 2, 12)])
    for _ in range(3):
        got, want = one.sample_chunks(num_chunks=20), other.sample(20)
        assert torch.equal(assert_rows_consistent(got), assert_rows_consistent(want))
    with pytest.raises(ValueError, match="num_chunks"):
        one.sample_chunks(0)


@pytest.mark.parametrize("mode", ["zarr", "pt"])
def test_clear_cache_empties_the_cache_only(tmp_path, mode):
    buffer = new_buffer(tmp_path, mode, cache_size=5, seed=2)
    buffer.add_trajectories([make_trajectory(2, 3, 0), make_trajectory(2, 3, 6)])
    buffer.clear_cache()
    stats = buffer.get_stats()
    assert stats["cache_size"] == 0 and stats["num_trajectories"] == 2
    assert set(assert_rows_consistent(buffer.sample(40)).tolist()) <= set(range(12))
    buffer.add_trajectories([make_trajectory(2, 3, 12)])  # not shut down
    assert len(buffer) == 3 and buffer.get_stats()["cache_size"] == 1
    assert set(assert_rows_consistent(buffer.sample(200)).tolist()) <= set(range(18))
    buffer.close(wait=True)


def test_clear_cache_without_auto_save_empties_the_buffer_consistently():
    buffer = TrajectoryReplayBuffer(seed=2)
    buffer.add_trajectories([make_trajectory(2, 3, 0)])
    buffer.clear_cache()
    assert (len(buffer), buffer.total_samples, buffer.get_stats()["cache_size"]) == (0, 0, 0)
    with pytest.raises(RuntimeError, match="empty buffer"):
        buffer.sample(4)
    buffer.add_trajectories([make_trajectory(2, 3, 6)])
    assert set(assert_rows_consistent(buffer.sample(40)).tolist()) <= set(range(6, 12))


def test_rlinfs_cleanup_sequence_runs(tmp_path):
    buffer = new_buffer(tmp_path, "zarr")
    buffer.add_trajectories([make_trajectory(2, 3, 0)])
    buffer.close()
    buffer.clear()
    buffer.clear_cache()
    buffer.close(wait=False)
    assert len(buffer) == 0


@pytest.mark.filterwarnings("ignore::rbzarr.UncommittedWritesWarning")  # the write may be queued
@pytest.mark.parametrize("wait", [True, False])
def test_close_takes_wait(tmp_path, wait):
    buffer = new_buffer(tmp_path, "zarr")
    buffer.add_trajectories([make_trajectory(2, 3, 0)])
    buffer.close(wait=wait)
    buffer.close(wait=wait)
    reopened = TrajectoryReplayBuffer(sample_window_size=0)
    buffer.close()
    reopened.load_checkpoint(tmp_path / "s")
    assert len(reopened) == 1


def test_auto_save_path_and_random_generator(tmp_path):
    assert TrajectoryReplayBuffer().auto_save_path is None
    buffer = new_buffer(tmp_path, "zarr", seed=11)
    assert buffer.auto_save_path == str(tmp_path / "s")
    generator = buffer.random_generator
    assert isinstance(generator, torch.Generator)
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(11).get_state())
    buffer.add_trajectories([make_trajectory(2, 3, 0)])
    buffer.sample(4)
    assert not torch.equal(generator.get_state(), torch.Generator().manual_seed(11).get_state())
    with pytest.raises(AttributeError):
        buffer.random_generator = torch.Generator()
    buffer.close()


def test_flatten_trajectory_is_rlinfs_and_changes_nothing():
    buffer, rlinf = TrajectoryReplayBuffer(), RLinfBuffer()
    traj = make_rlinf_trajectory(4, 3, 0, epochs=2)
    traj.terminations = traj.truncations = traj.dones
    assert_batches_equal(buffer._flatten_trajectory(traj), rlinf._flatten_trajectory(traj))
    assert len(buffer) == 0
    rlinf.close()


@pytest.mark.parametrize("mode", MODES)
def test_index_views_and_load_trajectory(tmp_path, mode):
    buffer = new_buffer(tmp_path, mode, cache_size=1, sample_window_size=0)
    trajectories = [make_trajectory(2, 3, 0), make_trajectory(4, 2, 6, epochs=2)]
    buffer.add_trajectories([make_rlinf_trajectory(2, 3, 0), make_rlinf_trajectory(4, 2, 6, 2)])
    buffer.flush()
    assert buffer._trajectory_id_list == [0, 1]
    index = buffer._trajectory_index
    assert list(index) == [0, 1]
    assert {k: index[1][k] for k in ("trajectory_id", "num_samples", "max_episode_length")} == {
        "trajectory_id": 1,
        "num_samples": 8,
        "max_episode_length": 4,
    }
    assert list(index[1]["shape"]) == [4, 2] and index[1]["model_weights_id"] == "w"
    # read-only: the views are copies and cannot be rebound
    buffer._trajectory_id_list.append(9)
    buffer._trajectory_index[0]["num_samples"] = -1
    assert buffer._trajectory_id_list == [0, 1]
    assert buffer._trajectory_index[0]["num_samples"] == 6
    with pytest.raises(AttributeError):
        buffer._trajectory_id_list = []
    for trajectory_id, want in enumerate(trajectories):
        got = buffer._load_trajectory(trajectory_id, index[trajectory_id]["model_weights_id"])
        assert_same_trajectory(got, want)
        assert got == want
    with pytest.raises(ValueError, match="Trajectory 7 not found"):
        buffer._load_trajectory(7, "w")
    with pytest.raises(FileNotFoundError, match="model_weights_id 'w', not 'v'"):
        buffer._load_trajectory(0, "v")
    buffer.close()


def test_loaded_trajectory_is_the_callers_trajectory(tmp_path):
    buffer = new_buffer(tmp_path, "zarr", enable_cache=False)
    traj = make_rlinf_trajectory(3, 2, 0, epochs=3)
    buffer.add_trajectories([traj])
    want = as_trajectory(traj)
    assert buffer._load_trajectory(0, "w") == want  # from the write queue or the store
    buffer.flush()
    assert buffer._load_trajectory(0, "w") == want
    buffer.close()
