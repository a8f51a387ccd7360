"""Arguments are checked where they enter: named TypeError / ValueError, nothing changed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_trajectory
from hypothesis import given
from hypothesis import strategies as st

from rbzarr import InvalidTrajectoryError, TrajectoryReplayBuffer
from rbzarr.analysis import open_buffer
from rbzarr.analysis.merge_split import split_store
from rbzarr.analysis.stats import RunningStats, compute_stats
from rbzarr.sampling.arguments import SEED_MAX, SEED_MIN


@pytest.fixture
def buffer() -> TrajectoryReplayBuffer:
    filled = TrajectoryReplayBuffer(seed=3)
    filled.add_trajectories([make_trajectory(4, 2, 0)])
    return filled


@pytest.mark.parametrize("bad", [2.5, 2.0, "4", None, True])
def test_sample_refuses_what_is_not_an_int(buffer, bad):
    with pytest.raises(TypeError, match="num_chunks must be a positive int"):
        buffer.sample(bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_sample_refuses_counts_below_one(buffer, bad):
    with pytest.raises(ValueError, match=f"num_chunks must be a positive int, got {bad}"):
        buffer.sample(bad)


def test_sample_takes_numpy_and_tensor_integers(buffer):
    assert buffer.sample(np.int64(3))["rewards"].shape[0] == 3
    assert buffer.sample(torch.tensor(2))["rewards"].shape[0] == 2


def test_a_view_checks_sample_counts_too(tmp_path: Path):
    store = tmp_path / "s"
    writer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store))
    writer.add_trajectories([make_trajectory(4, 2, 0)])
    writer.close()
    with pytest.raises(TypeError, match="num_chunks"):
        open_buffer(store).sample(2.5)


@given(st.integers(min_value=SEED_MIN, max_value=SEED_MAX))
def test_every_seed_torch_takes_is_accepted(seed):
    TrajectoryReplayBuffer(seed=seed)


@pytest.mark.parametrize("bad", [2**70, SEED_MAX + 1, SEED_MIN - 1])
def test_seeds_torch_refuses_are_a_named_value_error(bad):
    with pytest.raises(ValueError, match=r"seed must be None or an int from -2\*\*63|seed must"):
        TrajectoryReplayBuffer(seed=bad)


@pytest.mark.parametrize("bad", [1.5, "7", True])
def test_seeds_that_are_not_ints_are_a_type_error(bad):
    with pytest.raises(TypeError, match="seed must be None or an int"):
        TrajectoryReplayBuffer(seed=bad)


def test_cache_size_must_not_be_negative(tmp_path: Path):
    with pytest.raises(ValueError, match="cache_size must be an int >= 0, got -1"):
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "s"), cache_size=-1)
    assert list(tmp_path.iterdir()) == []


def test_split_refuses_more_parts_than_trajectories(tmp_path: Path):
    store = tmp_path / "s"
    writer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store))
    writer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(3)])
    writer.close()
    with pytest.raises(ValueError, match="holds 3 trajectories, so at most 3 parts"):
        split_store(store, tmp_path / "parts", 10)
    assert not (tmp_path / "parts").exists()
    assert len(split_store(store, tmp_path / "parts", 3)) == 3


def with_values(rewards: torch.Tensor) -> object:
    trajectory = make_trajectory(4, 2, 0)
    trajectory.rewards = rewards
    return trajectory


def test_check_finite_refuses_nan_and_inf_naming_the_field():
    buffer = TrajectoryReplayBuffer(check_finite=True)
    rewards = make_trajectory(4, 2, 0).rewards.clone()
    rewards[0, 0] = math.nan
    rewards[1, 1] = math.inf
    rewards[2, 1] = -math.inf
    with pytest.raises(InvalidTrajectoryError, match="field 'rewards': 1 NaN and 2 inf of 8"):
        buffer.add_trajectories([make_trajectory(4, 2, 0), with_values(rewards)])
    assert len(buffer) == 0
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    assert len(buffer) == 1


def test_without_check_finite_nan_is_stored_and_counted_by_stats(tmp_path: Path):
    store = tmp_path / "s"
    rewards = make_trajectory(4, 2, 0).rewards.clone().to(torch.float32)
    rewards[0, 0] = math.nan
    rewards[3, 1] = -math.inf
    writer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store))
    writer.add_trajectories([with_values(rewards)])
    writer.close()
    got = compute_stats(store, keys=["rewards"])["keys"]["rewards"]
    finite = rewards[torch.isfinite(rewards)].to(torch.float64)
    assert (got["count"], got["nan"], got["inf"]) == (6, 1, 1)
    assert got["mean"] == pytest.approx(float(finite.mean()))
    assert (got["min"], got["max"]) == (float(finite.min()), float(finite.max()))


def test_running_stats_of_integers_count_no_non_finite():
    stats = RunningStats()
    stats.update(torch.arange(5))
    assert (stats.count, stats.nan, stats.inf, stats.mean) == (5, 0, 0, 2.0)
