"""Shared fixtures: trajectories whose every field encodes its global sample number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fsspec
import pytest
import torch

from rbzarr import Trajectory, TrajectoryReplayBuffer

pytest_plugins = ["s3_fixtures"]


def make_trajectory(T: int, B: int, base: int, epochs: int = 1, mwid: str = "w") -> Trajectory:
    """A trajectory where flat row ``i`` of every sampled field encodes ``base + i``.

    ``dones`` holds one reset row (-1) leading each of ``epochs`` epochs.
    """
    n = (base + torch.arange(T * B, dtype=torch.int64)).reshape(T, B)
    steps = n.reshape(epochs, T // epochs, B)
    resets = torch.full((epochs, 1, B), -1, dtype=torch.int64)
    dones = torch.cat([resets, steps], dim=1).reshape(T + epochs, B, 1)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=mwid,
        actions=n.unsqueeze(-1).repeat(1, 1, 2),
        rewards=n.to(torch.float64).unsqueeze(-1),
        dones=dones,
        prev_logprobs=n.to(torch.float64),
        versions=torch.zeros(T),
        forward_inputs={"tokens": n.to(torch.int32).unsqueeze(-1).repeat(1, 1, 2)},
        curr_obs={"state": n.to(torch.float64).unsqueeze(-1).repeat(1, 1, 3)},
        next_obs={"state": (n.to(torch.float64) + 0.5).unsqueeze(-1).repeat(1, 1, 3)},
    )


def assert_rows_consistent(batch: dict) -> torch.Tensor:
    """Check every field of every sampled row encodes the same number; return the numbers."""
    numbers = batch["prev_logprobs"].to(torch.int64)
    assert torch.equal(batch["rewards"][:, 0].to(torch.int64), numbers)
    assert torch.equal(batch["actions"], numbers.unsqueeze(-1).repeat(1, 2))
    assert torch.equal(batch["dones"][:, 0], numbers)
    assert torch.equal(batch["forward_inputs"]["tokens"][:, 0].to(torch.int64), numbers)
    assert torch.equal(batch["curr_obs"]["state"][:, 1].to(torch.int64), numbers)
    assert torch.equal(batch["next_obs"]["state"][:, 2], numbers.to(torch.float64) + 0.5)
    return numbers


def assert_same_trajectory(got: Trajectory, want: Trajectory) -> None:
    """Every field equal in key order, dtype, shape and value, and the scalar fields too."""
    got_fields, want_fields = got.tensors(), want.tensors()
    assert list(got_fields) == list(want_fields)
    for key, value in want_fields.items():
        assert got_fields[key].dtype == value.dtype, key
        assert got_fields[key].shape == value.shape, key
        assert torch.equal(got_fields[key], value), key
    assert got.max_episode_length == want.max_episode_length
    assert got.model_weights_id == want.model_weights_id


def assert_checkpoint_loads(path: Any, ids: list[int], made: Callable[[int], Trajectory]) -> None:
    """A fresh buffer loads exactly ``ids`` from the checkpoint at ``path``, trajectory
    ``i`` equal to ``made(i)``."""
    loaded = TrajectoryReplayBuffer(sample_window_size=0)
    loaded.load_checkpoint(path)
    assert loaded.trajectory_ids == ids
    for i in ids:
        assert_same_trajectory(loaded.trajectory(i), made(i))


@pytest.fixture
def memory_url(request: pytest.FixtureRequest):
    """A fresh ``memory://`` URL, emptied afterwards (the memory filesystem is global)."""
    fs = fsspec.filesystem("memory")
    root = f"/test-{request.node.name}".replace("[", "-").replace("]", "")
    yield f"memory://{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)
