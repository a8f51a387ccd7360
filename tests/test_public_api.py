"""The public API works as users write it: the names import, are documented and behave.

An RLinf user switches by changing one import line (README, "Switching from RLinf"); the
names on that line must work as RLinf's do, and errors must stay catchable as the builtins
RLinf raises.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from conftest import make_trajectory
from torch.utils.data import DataLoader

import rbzarr
from rbzarr.errors import TrajectoryListError

# rbzarr.cli's one export is a click command: its --help is checked in test_docstrings.py.
PUBLIC_PACKAGES = (
    "rbzarr",
    "rbzarr.analysis",
    "rbzarr.buffer",
    "rbzarr.data",
    "rbzarr.interop",
    "rbzarr.rollout",
    "rbzarr.trajectory",
)


@pytest.mark.parametrize("package_name", PUBLIC_PACKAGES)
def test_every_exported_name_imports_and_is_documented(package_name):
    package = importlib.import_module(package_name)
    assert len(set(package.__all__)) == len(package.__all__), "a name exported twice"
    namespace: dict[str, object] = {}
    exec(f"from {package_name} import *", namespace)
    undocumented = [name for name in package.__all__ if not inspect.getdoc(namespace[name])]
    assert undocumented == []


def test_the_rlinf_import_line_works_as_rlinfs():
    # The README's import, in place of ``from rlinf.data.storage.replay import (...)``.
    from rbzarr import (  # noqa: PLC0415
        PreloadReplayBufferDataset,
        PriorityStore,
        ReplayBufferDataset,
        Trajectory,
        TrajectoryCache,
        TrajectoryReplayBuffer,
        replay_buffer_collate_fn,
    )

    buffer = TrajectoryReplayBuffer(
        seed=1234, enable_cache=True, cache_size=5, sample_window_size=100, auto_save=False
    )
    trajectory = Trajectory(  # RLinf's field names: [T, B, ...] tensors, T=4, B=3
        max_episode_length=4,
        model_weights_id="w0",
        actions=torch.zeros(4, 3, 2),
        rewards=torch.ones(4, 3, 1),
        dones=torch.zeros(5, 3, 1, dtype=torch.bool),  # a reset row leads the epoch
        prev_logprobs=torch.arange(12.0).reshape(4, 3),
        forward_inputs={"tokens": torch.zeros(4, 3, 2, dtype=torch.int32)},
        curr_obs={"state": torch.zeros(4, 3, 3)},
        next_obs={"state": torch.zeros(4, 3, 3)},
    )
    buffer.add_trajectories([trajectory, trajectory])
    assert len(buffer) == 2 and buffer.total_samples == 24 and buffer.is_ready(2)
    batch = buffer.sample(8)
    assert list(batch)[-3:] == ["curr_obs", "next_obs", "forward_inputs"]
    assert batch["actions"].shape == (8, 2) and batch["curr_obs"]["state"].shape == (8, 3)
    assert bool((batch["prev_logprobs"] < 12).all()) and bool((batch["rewards"] == 1).all())

    for dataset_class in (ReplayBufferDataset, PreloadReplayBufferDataset):
        dataset = dataset_class(buffer, None, 6, 1, 0)
        loader = DataLoader(dataset, batch_size=1, collate_fn=replay_buffer_collate_fn)
        assert next(iter(loader))["rewards"].shape == (6, 1)
        dataset.close()

    store = PriorityStore(maxsize=1)
    assert store.add((1, 1.0), "old") and store.add((2, 2.0), "new")
    assert store.topn(1) == ["new"]
    cache = TrajectoryCache(max_size=1)
    cache.put(7, {"rewards": torch.ones(3, 1)})
    got = cache.get(7)
    assert got is not None and torch.equal(got["rewards"], torch.ones(3, 1))
    buffer.close()


def test_errors_are_caught_as_the_builtins_rlinf_raises(tmp_path):
    buffer = rbzarr.TrajectoryReplayBuffer()
    with pytest.raises(RuntimeError):  # empty buffer
        buffer.sample(4)
    bad = make_trajectory(4, 3, 0)
    bad.rewards = bad.rewards[:3]
    with pytest.raises(ValueError, match="rewards"):
        buffer.add_trajectories([bad])
    with pytest.raises(FileNotFoundError):
        buffer.load_checkpoint(tmp_path / "no-checkpoint")
    buffer.close()
    with pytest.raises(RuntimeError):  # closed
        buffer.add_trajectories([make_trajectory(4, 3, 0)])
    assert len(buffer) == 0


def test_rbzarr_errors_share_one_base_users_can_catch(tmp_path):
    buffer = rbzarr.TrajectoryReplayBuffer()
    failures = []
    for call in (
        lambda: buffer.sample(4),
        lambda: buffer.load_checkpoint(tmp_path / "no-checkpoint"),
        lambda: buffer.add_trajectories(make_trajectory(4, 3, 0)),  # not a list
    ):
        with pytest.raises(rbzarr.RbzarrError) as info:
            call()
        failures.append(type(info.value))
    assert failures == [
        rbzarr.EmptyBufferError,
        rbzarr.CheckpointNotFoundError,
        TrajectoryListError,
    ]
    buffer.close()
