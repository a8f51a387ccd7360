"""Trajectory validation and the flatten / unflatten rules."""

from __future__ import annotations

import pytest
import torch
from conftest import make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import InvalidTrajectoryError, Trajectory
from rbzarr.trajectory.flat_view import flatten_trajectory, join_trajectory, split_trajectory
from rbzarr.trajectory.model import raw_time_rows, validate


def test_flat_row_is_t_times_b_plus_b():
    traj = make_trajectory(T=4, B=3, base=0, epochs=2)
    spec = validate(traj)
    assert (spec.T, spec.B, spec.num_samples, spec.shape) == (4, 3, 12, (4, 3))
    flat = flatten_trajectory(traj, spec)
    assert torch.equal(flat["prev_logprobs"], torch.arange(12, dtype=torch.float64))
    # dones: 2 epochs of 2 steps, each led by a reset row that flattening drops
    assert traj.dones is not None and traj.dones.shape == (6, 3, 1)
    assert torch.equal(flat["dones"][:, 0], torch.arange(12))
    assert "versions" not in flat  # 1-D


def test_raw_time_rows_skips_reset_rows():
    t = torch.arange(6)
    assert raw_time_rows(t, 6, 6).tolist() == [0, 1, 2, 3, 4, 5]
    assert raw_time_rows(t, 6, 8).tolist() == [1, 2, 3, 5, 6, 7]
    assert raw_time_rows(t, 6, 7).tolist() == [1, 2, 3, 4, 5, 6]


def test_reference_prefers_prev_logprobs_then_rewards():
    rewards = torch.zeros(3, 2)
    assert validate(Trajectory(rewards=rewards)).shape == (3, 2)
    both = Trajectory(rewards=torch.zeros(3, 2, 1), prev_logprobs=torch.zeros(3, 2, 5))
    assert validate(both).shape == (3, 2, 5)


@pytest.mark.parametrize(
    ("traj", "message"),
    [
        (Trajectory(actions=torch.zeros(3, 2)), "no samples"),
        (Trajectory(rewards=torch.zeros(0, 2)), "no samples"),
        (Trajectory(rewards=torch.zeros(3)), "expected \\[T, B, ...\\]"),
        (
            Trajectory(rewards=torch.zeros(3, 2), actions=torch.zeros(4, 2, 1)),
            "field 'actions': expected T=3, B=2 as 'rewards', got \\(4, 2, 1\\)",
        ),
        (
            Trajectory(rewards=torch.zeros(3, 2), curr_obs={"x": torch.zeros(3, 5)}),
            "field 'curr_obs/x': expected T=3, B=2",
        ),
        (Trajectory(rewards=torch.zeros(4, 2), dones=torch.zeros(7, 2)), "field 'dones'"),
        (Trajectory(rewards=torch.zeros(4, 2), dones=torch.zeros(3, 2)), "field 'dones'"),
        (Trajectory(rewards=torch.zeros(3, 2), curr_obs={"x": [1, 2]}), "expected a torch.Tensor"),
        (Trajectory(rewards=torch.zeros(3, 2), curr_obs={"a/b": torch.zeros(3, 2)}), "invalid key"),
    ],
)
def test_invalid_trajectories(traj, message):
    with pytest.raises(InvalidTrajectoryError, match=message):
        validate(traj)


def test_schema_mismatch_names_field():
    schema = validate(make_trajectory(2, 2, 0)).schema
    other = make_trajectory(2, 2, 0)
    other.rewards = other.rewards.float()
    with pytest.raises(ValueError, match="field 'rewards': expected dtype float64"):
        validate(other, schema)
    other = make_trajectory(2, 2, 0)
    other.curr_obs["extra"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="unexpected \\['curr_obs/extra'\\]"):
        validate(other, schema)


DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


@st.composite
def trajectories(draw):
    epochs = draw(st.integers(1, 3))
    T = epochs * draw(st.integers(1, 3))
    B = draw(st.integers(1, 4))
    trailing = draw(st.lists(st.integers(1, 3), max_size=2))
    dtype = draw(st.sampled_from(DTYPES))
    with_reset = draw(st.booleans())

    def tensor(rows, *shape):
        return (torch.rand(rows, B, *shape) * 100).to(dtype)

    return Trajectory(
        max_episode_length=draw(st.integers(0, 9)),
        model_weights_id=draw(st.text(max_size=4)),
        rewards=tensor(T),
        dones=tensor(T + epochs if with_reset else T, 1),
        versions=torch.arange(T),
        curr_obs={"obs": tensor(T, *trailing)},
    )


@settings(max_examples=40, deadline=None)
@given(trajectories())
def test_split_then_join_is_identity(traj):
    spec = validate(traj)
    flat, residue = split_trajectory(traj, spec)
    assert all(v.shape[0] == spec.num_samples for v in flat.values())
    rebuilt = join_trajectory(flat, residue, spec.B)
    original, back = traj.tensors(), rebuilt.tensors()
    assert list(original) == list(back) or set(original) == set(back)
    for key, value in original.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    assert rebuilt.max_episode_length == traj.max_episode_length
    assert rebuilt.model_weights_id == traj.model_weights_id


@pytest.mark.parametrize("key", ["", ".", "..", "zarr.json", ".zattrs", "a/b", "a\\b", "a\x00b", 3])
def test_a_key_that_is_not_a_plain_name_is_refused_with_the_rule_it_breaks(key):
    traj = Trajectory(rewards=torch.zeros(3, 2), curr_obs={key: torch.zeros(3, 2)})
    with pytest.raises(InvalidTrajectoryError, match="keys must be plain names") as caught:
        validate(traj)
    assert repr(key) in str(caught.value)


@pytest.mark.parametrize("short", ["rewards", "prev_logprobs", "actions"])
def test_a_field_one_row_short_is_the_one_blamed(short):
    """Whichever field T is usually read from, the field that disagrees with the rest is named."""
    trajectory = make_trajectory(20, 8, 0)
    setattr(trajectory, short, getattr(trajectory, short)[:-1])
    with pytest.raises(InvalidTrajectoryError, match=f"^field '{short}': expected T=20, B=8 as "):
        validate(trajectory)
