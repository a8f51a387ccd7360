"""Duck-typed trajectories, ``Trajectory`` equality and ``extract_intervene_traj``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_oracle import RLinfTrajectory, rlinf_copy

from rbzarr import InvalidTrajectoryError, Trajectory
from rbzarr.trajectory.flat_view import join_trajectory, split_trajectory
from rbzarr.trajectory.model import as_trajectory, validate


def test_fields_order_and_defaults_are_rlinfs():
    ours = [(f.name, f.default, f.default_factory) for f in dataclasses.fields(Trajectory)]
    theirs = [(f.name, f.default, f.default_factory) for f in dataclasses.fields(RLinfTrajectory)]
    assert ours == theirs
    assert Trajectory() == Trajectory()


def test_duck_typed_trajectory_validates_like_ours():
    ours = make_trajectory(4, 3, 0, epochs=2)
    assert validate(rlinf_copy(ours)) == validate(ours)
    assert as_trajectory(rlinf_copy(ours)) == ours
    assert as_trajectory(ours) is ours


class OnlySomeFields:
    """An object carrying a few of the fields, as an older RLinf (no ``versions``) would."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"actions": torch.zeros(3, 2)}, "no samples: it has neither 'prev_logprobs' nor"),
        (
            {"rewards": torch.zeros(3, 2), "actions": torch.zeros(4, 2, 1)},
            "field 'actions': expected T=3, B=2 as 'rewards', got (4, 2, 1)",
        ),
        (
            {"rewards": torch.zeros(3, 2), "curr_obs": {"x": torch.zeros(3, 5)}},
            "field 'curr_obs/x': expected T=3, B=2 as 'rewards', got (3, 5)",
        ),
        ({"rewards": torch.zeros(4, 2), "dones": torch.zeros(7, 2)}, "field 'dones'"),
        ({"rewards": torch.zeros(3, 2), "curr_obs": {"a/b": torch.zeros(3, 2)}}, "'a/b'"),
        (
            {"rewards": torch.zeros(3, 2), "max_episode_length": "long"},
            "field 'max_episode_length': expected an int, got str",
        ),
        (
            {"rewards": torch.zeros(3, 2), "model_weights_id": 7},
            "field 'model_weights_id': expected a str, got int",
        ),
        (
            {"rewards": torch.zeros(3, 2), "curr_obs": [torch.zeros(3, 2)]},
            "field 'curr_obs': expected a dict of tensors, got list",
        ),
    ],
)
def test_duck_typed_errors_are_the_same_named_errors(fields, message):
    with pytest.raises(InvalidTrajectoryError) as ours:
        validate(Trajectory(**fields))
    with pytest.raises(InvalidTrajectoryError) as duck:
        validate(RLinfTrajectory(**fields))
    with pytest.raises(InvalidTrajectoryError) as partial:
        validate(OnlySomeFields(**fields))
    assert str(duck.value) == str(ours.value) == str(partial.value)
    assert message in str(ours.value)


def test_an_object_missing_a_field_reads_its_default():
    traj = make_trajectory(2, 3, 0)
    partial = OnlySomeFields(rewards=traj.rewards, curr_obs=traj.curr_obs)
    assert as_trajectory(partial) == Trajectory(rewards=traj.rewards, curr_obs=traj.curr_obs)


@pytest.mark.parametrize("item", [None, 3, "rewards", {"rewards": torch.zeros(2, 2)}])
def test_objects_without_any_field_are_not_trajectories(item):
    with pytest.raises(InvalidTrajectoryError, match="expected a Trajectory"):
        validate(item)


def test_schema_order_wins_over_the_trajectory_key_order():
    first = make_trajectory(2, 2, 0)
    first.curr_obs = {"a": torch.zeros(2, 2, 1), "b": torch.ones(2, 2, 3)}
    second = make_trajectory(2, 2, 4)
    second.curr_obs = {"b": torch.ones(2, 2, 3) * 2, "a": torch.ones(2, 2, 1) * 3}
    schema = validate(first).schema
    spec = validate(second, schema)
    assert list(spec.schema) == list(schema)
    flat, _ = split_trajectory(second, spec)
    assert list(flat) == list(schema)
    assert torch.equal(flat["curr_obs/a"], torch.full((4, 1), 3.0))
    assert torch.equal(flat["curr_obs/b"], torch.full((4, 3), 2.0))


# -- equality --------------------------------------------------------------------------
def variants(traj: Trajectory) -> list[Trajectory]:
    """Copies of ``traj`` that differ from it in exactly one respect."""
    rewards = traj.rewards
    assert rewards is not None
    return [
        dataclasses.replace(traj, max_episode_length=traj.max_episode_length + 1),
        dataclasses.replace(traj, model_weights_id=traj.model_weights_id + "x"),
        dataclasses.replace(traj, rewards=rewards.float()),
        dataclasses.replace(traj, rewards=rewards.reshape(rewards.shape[0], -1, 1, 1)),
        dataclasses.replace(traj, rewards=rewards + 1),
        dataclasses.replace(traj, prev_values=torch.zeros(2)),
        dataclasses.replace(traj, curr_obs={**traj.curr_obs, "extra": torch.zeros(1)}),
        dataclasses.replace(traj, curr_obs={}),
    ]


def test_equality_answers_field_by_field():
    traj = make_trajectory(3, 2, 0, epochs=3)
    same = Trajectory(**{f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)})
    clone = as_trajectory(rlinf_copy(traj))
    assert traj == same and traj == clone and (traj != clone) is False
    for other in variants(traj):
        assert traj != other and other != traj
    assert traj != rlinf_copy(traj)  # another type: not equal, never an exception
    assert traj != 3
    with pytest.raises(TypeError):
        hash(traj)


def test_equality_ignores_dict_key_order_and_matches_nan():
    a = Trajectory(rewards=torch.tensor([[float("nan"), 1.0]]), curr_obs={"x": 1, "y": 2})
    b = Trajectory(rewards=torch.tensor([[float("nan"), 1.0]]), curr_obs={"y": 2, "x": 1})
    assert a == b
    assert a != Trajectory(rewards=torch.tensor([[0.0, 1.0]]), curr_obs={"x": 1, "y": 2})


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 100), st.integers(1, 2))
def test_equality_is_value_equality(T, B, base, epochs):
    traj = make_trajectory(T * epochs, B, base, epochs)
    flat, residue = split_trajectory(traj, validate(traj))
    rebuilt = join_trajectory({k: v.clone() for k, v in flat.items()}, residue, B)
    assert rebuilt == traj
    assert all(traj != other for other in variants(traj))


# -- extract_intervene_traj ------------------------------------------------------------
def intervened_example() -> Trajectory:
    """T=4 steps of B=3 envs, D=2 flags; row values encode ``10 * t + b``."""
    T, B = 4, 3
    n = 10 * torch.arange(T).unsqueeze(1) + torch.arange(B)
    flags = torch.zeros(T, B, 2, dtype=torch.bool)
    flags[1, 0] = True  # env 0, step 1: both flags
    flags[3, 0, 1] = True  # env 0, step 3: one flag
    flags[2, 2, 0] = True  # env 2, step 2: one flag
    resets = torch.full((2, 1, B), -1)
    dones = torch.cat([resets, n.reshape(2, 2, B)], dim=1).reshape(T + 2, B, 1)
    fields = {
        "max_episode_length": 9,
        "model_weights_id": "m",
        "actions": n.unsqueeze(-1).float(),
        "intervene_flags": flags,
        "rewards": n.float(),
        "terminations": dones.bool(),
        "truncations": dones,
        "dones": dones,
        "versions": torch.ones(T, B),
        "curr_obs": {"s": n.unsqueeze(-1) + 0.5},
    }
    return Trajectory(**fields)


def test_extract_intervene_traj_any_and_all():
    traj = intervened_example()
    parts = traj.extract_intervene_traj()
    assert parts is not None and len(parts) == 2
    env0, env2 = parts
    assert env0.rewards is not None and env0.rewards.tolist() == [[10.0], [30.0]]
    assert env0.actions is not None and env0.actions.shape == (2, 1, 1)
    assert env0.intervene_flags is not None
    assert env0.intervene_flags.tolist() == [[[True, True]], [[False, True]]]
    # reset rows kept, then the intervened steps of each epoch: (reset, 10), (reset, 30)
    assert env0.dones is not None and env0.dones[:, 0, 0].tolist() == [-1, 10, -1, 30]
    assert env0.terminations is not None and env0.terminations.dtype == torch.bool
    assert env0.curr_obs["s"][:, 0, 0].tolist() == [10.5, 30.5]
    assert env0.versions is None and env0.prev_logprobs is None
    assert (env0.max_episode_length, env0.model_weights_id) == (9, "m")
    assert env2.rewards is not None and env2.rewards.tolist() == [[22.0]]
    # env 2 kept one step of epoch 1 and none of epoch 0: RLinf's [-1, -1, 22] would be
    # a trajectory of 2 epochs for 1 step; one leading reset row keeps it valid
    assert env2.dones is not None and env2.dones[:, 0, 0].tolist() == [-1, 22]
    only_all = traj.extract_intervene_traj(mode="all")
    assert only_all is not None and len(only_all) == 1
    assert only_all[0].rewards is not None and only_all[0].rewards.tolist() == [[10.0]]
    for part in parts + only_all:
        validate(part)


def test_extract_intervene_traj_none_cases_and_bad_mode():
    traj = make_trajectory(2, 2, 0)
    assert traj.extract_intervene_traj() is None
    traj.intervene_flags = torch.zeros(2, 2, 3, dtype=torch.bool)
    assert traj.extract_intervene_traj() is None
    traj.intervene_flags[0, 0, 0] = True
    assert traj.extract_intervene_traj(mode="all") is None
    with pytest.raises(NotImplementedError, match="mode 'most'"):
        traj.extract_intervene_traj(mode="most")
    traj.intervene_flags = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="intervene_flags"):
        traj.extract_intervene_traj()
