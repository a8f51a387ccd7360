"""TrajectoryCollector: steps in, [T, B, ...] trajectory out; and split_envs along B."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rbzarr
from rbzarr.errors import InvalidTrajectoryError
from rbzarr.rollout.collected import max_episode_length, model_weights_id, split_envs
from rbzarr.rollout.collector import TrajectoryCollector
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, validate

B = 3


def obs(value: float, num_envs: int = B) -> dict[str, Any]:
    """An observation whose every entry of env b is ``value + b``."""
    base = value + torch.arange(num_envs, dtype=torch.float32)
    return {"state": base[:, None].repeat(1, 2), "cam": {"depth": base[:, None, None]}}


def flags(*done_envs: int, num_envs: int = B) -> torch.Tensor:
    out = torch.zeros(num_envs, 1, dtype=torch.bool)
    out[list(done_envs)] = True
    return out


def step(collector: TrajectoryCollector, t: int, **overrides: object) -> None:
    """A regular step t: action t, reward 10t + b, next obs t + 1, nobody done."""
    kwargs: dict[str, object] = {
        "actions": torch.full((B, 2), float(t)),
        "rewards": 10.0 * t + torch.arange(B, dtype=torch.float32)[:, None],
        "next_obs": obs(t + 1.0),
        "terminations": flags(),
        "truncations": flags(),
    }
    kwargs.update(overrides)
    collector.add_step(**kwargs)  # type: ignore[arg-type]


def collect(steps: int, epochs: int = 1) -> TrajectoryCollector:
    collector = TrajectoryCollector(num_envs=B)
    for _ in range(epochs):
        collector.reset(obs(0.0))
        for t in range(steps):
            step(collector, t)
    return collector


def test_single_epoch_shapes_and_rows() -> None:
    traj = collect(steps=4).build()
    spec = validate(traj)
    assert (spec.T, spec.B) == (4, B)
    assert traj.actions is not None and traj.rewards is not None and traj.dones is not None
    assert traj.actions.shape == (4, B, 2)
    assert traj.rewards.shape == (4, B, 1)
    assert traj.dones.shape == (5, B, 1) and traj.dones.dtype == torch.bool
    assert traj.terminations is not None and traj.terminations.shape == (5, B, 1)
    assert traj.truncations is not None and traj.truncations.shape == (5, B, 1)
    assert traj.curr_obs["state"].shape == (4, B, 2)
    assert traj.next_obs["cam"]["depth"].shape == (4, B, 1, 1)
    for t in range(4):
        assert torch.equal(traj.curr_obs["state"][t], obs(float(t))["state"])
        assert torch.equal(traj.next_obs["state"][t], obs(t + 1.0)["state"])
        assert torch.equal(traj.rewards[t, :, 0], 10.0 * t + torch.arange(B).float())
    assert not traj.dones.any()
    assert traj.prev_logprobs is None and traj.versions is None and traj.forward_inputs == {}


def test_build_empties_the_collector() -> None:
    collector = collect(steps=2)
    collector.build()
    assert collector.num_steps == 0 and collector.num_epochs == 0
    with pytest.raises(InvalidTrajectoryError, match="no steps"):
        collector.build()
    with pytest.raises(InvalidTrajectoryError, match="before reset"):
        step(collector, 0)


def test_auto_reset_uses_final_obs_for_done_envs() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0))
    step(collector, 0)
    # env 1 terminates and env 2 is truncated at step 1; the env already returned
    # their reset observation (-50 + b); final_obs holds the true last one (70 + b).
    returned = obs(2.0)
    for key in ("state",):
        returned[key][1:] = obs(-50.0)[key][1:]
    step(
        collector,
        1,
        next_obs=returned,
        terminations=flags(1),
        truncations=flags(2),
        final_obs=obs(70.0),
    )
    step(collector, 2)
    traj = collector.build()
    assert traj.dones is not None
    assert traj.dones[:, :, 0].tolist() == [
        [False, False, False],  # reset row
        [False, False, False],
        [False, True, True],
        [False, False, False],
    ]
    next_state = traj.next_obs["state"][1, :, 0].tolist()
    assert next_state == [2.0, 71.0, 72.0]  # env 0 not done: what the env returned
    assert traj.curr_obs["state"][2, :, 0].tolist() == [2.0, -49.0, -48.0]


def test_epochs_get_one_reset_row_each() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0))
    step(collector, 0)
    step(collector, 1, terminations=flags(0))
    collector.reset(obs(5.0), dones=flags(0), terminations=flags(0))
    step(collector, 2)
    step(collector, 3, truncations=flags(2))
    traj = collector.build()
    spec = validate(traj)
    assert (spec.T, spec.B) == (4, B)
    assert traj.dones is not None and traj.terminations is not None
    assert traj.truncations is not None
    assert traj.dones[:, :, 0].int().tolist() == [
        [0, 0, 0],  # reset row of epoch 0 (zeros)
        [0, 0, 0],
        [1, 0, 0],
        [1, 0, 0],  # reset row of epoch 1 (given)
        [0, 0, 0],
        [0, 0, 1],
    ]
    assert traj.terminations[:, :, 0].int().tolist() == [
        [0, 0, 0],
        [0, 0, 0],
        [1, 0, 0],
        [1, 0, 0],
        [0, 0, 0],
        [0, 0, 0],
    ]
    assert traj.truncations[3].sum() == 0
    assert traj.curr_obs["state"][2, :, 0].tolist() == [5.0, 6.0, 7.0]
    flat = flatten_trajectory(traj, spec)
    assert flat["dones"][:, 0].int().tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_reset_dones_default_to_terminations_or_truncations() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0), terminations=flags(0), truncations=flags(2))
    step(collector, 0)
    traj = collector.build()
    assert traj.dones is not None
    assert traj.dones[0, :, 0].tolist() == [True, False, True]


def test_reset_without_steps_replaces_the_pending_reset() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset({"other": torch.zeros(B)})
    collector.reset(obs(9.0))  # no step yet: the observation keys may still change
    step(collector, 0)
    traj = collector.build()
    assert traj.dones is not None and traj.dones.shape[0] == 2
    assert traj.curr_obs["state"][0, 0, 0] == 9.0


def test_unequal_epochs_are_refused_and_kept() -> None:
    collector = collect(steps=2)
    collector.reset(obs(0.0))
    step(collector, 0)
    with pytest.raises(InvalidTrajectoryError, match=r"differ in length: \[2, 1\]"):
        collector.build()
    step(collector, 1)
    assert validate(collector.build()).T == 4


def test_max_episode_length_counts_steps_per_env_across_epochs() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0))
    step(collector, 0)
    step(collector, 1, terminations=flags(0))  # env 0: episode of 2
    step(collector, 2)
    collector.reset(obs(0.0))
    step(collector, 3, truncations=flags(1))  # env 1: episode of 4 (runs across the epochs)
    step(collector, 4)
    step(collector, 5)  # env 2: still running, 6 steps observed
    traj = collector.build()
    assert traj.max_episode_length == 6
    dones = torch.zeros(4, 2, 1, dtype=torch.bool)
    dones[1, 0] = dones[2, 1] = True
    assert max_episode_length(dones) == 3  # env 1: steps 0..2


def test_model_weights_id_follows_the_formula() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0))
    versions = [torch.full((B, 1), 3.0), torch.full((B, 1), 4.0)]
    for t, version in enumerate(versions):
        step(collector, t, versions=version)
    traj = collector.build()
    stacked = torch.stack(versions)
    expected = str(uuid.uuid5(uuid.NAMESPACE_DNS, stacked.cpu().numpy().tobytes().hex()))
    assert traj.versions is not None and torch.equal(traj.versions, stacked)
    assert traj.model_weights_id == expected
    no_versions = str(uuid.uuid5(uuid.NAMESPACE_DNS, torch.zeros(1).numpy().tobytes().hex()))
    assert collect(steps=1).build().model_weights_id == no_versions
    assert model_weights_id(None) == no_versions


def test_optional_fields_and_forward_inputs() -> None:
    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs(0.0))
    for t in range(2):
        step(
            collector,
            t,
            prev_logprobs=torch.full((B, 2), -float(t)),
            prev_values=torch.full((B, 1), 0.5),
            intervene_flags=flags(t),
            forward_inputs={"tokens": torch.full((B, 4), t, dtype=torch.int64)},
        )
    traj = collector.build()
    spec = validate(traj)
    assert spec.shape == (2, B, 2)  # from prev_logprobs
    assert traj.forward_inputs["tokens"][:, :, 0].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert traj.intervene_flags is not None and traj.intervene_flags[1, 1, 0]
    rlinf_order = "actions intervene_flags rewards terminations truncations dones prev_logprobs"
    assert list(traj.tensors())[:7] == rlinf_order.split()


def test_inputs_are_copied() -> None:
    collector = TrajectoryCollector(num_envs=B)
    first = obs(0.0)
    collector.reset(first)
    rewards = torch.ones(B, 1)
    step(collector, 0, rewards=rewards)
    rewards.fill_(7.0)
    first["state"].fill_(7.0)
    traj = collector.build()
    assert traj.rewards is not None and traj.rewards.sum() == B
    assert traj.curr_obs["state"].sum() == 2 * sum(range(B))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rewards": torch.zeros(B + 1, 1)}, r"'rewards': expected \[B=3, \.\.\.\], got \(4, 1\)"),
        ({"rewards": None}, r"'rewards': missing"),
        ({"actions": [1, 2, 3]}, r"'actions': expected a torch.Tensor, got list"),
        (
            {"truncations": torch.zeros(B, 2, dtype=torch.bool)},
            r"'truncations'.*\(3, 1\), got \(3, 2\)",
        ),
        ({"next_obs": {"state": torch.zeros(B, 2)}}, r"missing \['cam/depth'\]"),
        (
            {"next_obs": {**obs(1.0), "extra": torch.zeros(B)}},
            r"next_obs: fields differ .* unexpected \['extra'\]",
        ),
        (
            {"next_obs": {"state": torch.zeros(B, 3), "cam": obs(1.0)["cam"]}},
            r"next_obs field 'state': expected dtype torch.float32 shape \(3, 2\).*"
            r"got dtype torch.float32 shape \(3, 3\)",
        ),
        ({"final_obs": {"state": torch.zeros(B, 2)}}, r"final_obs: fields differ"),
        ({"actions": torch.zeros(B, 2, dtype=torch.int64)}, r"step field 'actions'.*int64"),
        ({"prev_values": torch.zeros(B, 1)}, r"step: fields differ.*unexpected \['prev_values'\]"),
        ({"versions": torch.zeros(B - 1, 1)}, r"'versions': expected \[B=3, \.\.\.\]"),
    ],
)
def test_bad_steps_are_rejected_without_changing_state(
    overrides: dict[str, object], message: str
) -> None:
    collector = collect(steps=2)
    with pytest.raises(InvalidTrajectoryError, match=message):
        step(collector, 2, **overrides)
    assert collector.num_steps == 2
    step(collector, 2)
    traj = collector.build()
    expected = collect(steps=3).build()
    assert traj.tensors().keys() == expected.tensors().keys()
    for path, value in expected.tensors().items():
        assert torch.equal(traj.tensors()[path], value), path


def test_bad_resets_are_rejected() -> None:
    collector = collect(steps=1)
    with pytest.raises(InvalidTrajectoryError, match=r"obs: fields differ.*missing"):
        collector.reset({"state": torch.zeros(B, 2)})
    with pytest.raises(InvalidTrajectoryError, match=r"reset row of 'dones'.*\(3, 1\).*\(3, 4\)"):
        collector.reset(obs(0.0), dones=torch.zeros(B, 4, dtype=torch.bool))
    with pytest.raises(InvalidTrajectoryError, match=r"'obs/state': expected \[B=3"):
        TrajectoryCollector(num_envs=B).reset({"state": torch.zeros(2, 1)})
    with pytest.raises(InvalidTrajectoryError, match=r"expected a torch\.Tensor, got list"):
        TrajectoryCollector(num_envs=B).reset({"task": ["a", "b", "c"]})
    assert collector.num_steps == 1 and collector.num_epochs == 1
    # a reset row given before the first step is checked against that step
    fresh = TrajectoryCollector(num_envs=B)
    fresh.reset(obs(0.0), terminations=torch.zeros(B, 2))
    with pytest.raises(InvalidTrajectoryError, match=r"reset row of 'terminations'"):
        step(fresh, 0)
    assert fresh.num_steps == 0


def test_split_along_b() -> None:
    collector = TrajectoryCollector(num_envs=5)
    collector.reset(obs(0.0, 5))
    for t in range(3):
        collector.add_step(
            actions=torch.full((5, 1), float(t)),
            rewards=torch.arange(5.0)[:, None] + 10 * t,
            next_obs=obs(t + 1.0, 5),
            terminations=flags(3, 4, num_envs=5) if t == 0 else flags(num_envs=5),
            truncations=flags(num_envs=5),
            versions=torch.ones(5, 1),
        )
    traj = collector.build()
    parts = split_envs(traj, 2)
    assert [validate(p).B for p in parts] == [3, 2]
    assert traj.dones is not None
    for part, envs in zip(parts, (slice(0, 3), slice(3, 5)), strict=True):
        assert part.dones is not None and part.dones.shape[0] == 4  # T + E rows kept
        assert part.model_weights_id == traj.model_weights_id
        for path, value in part.tensors().items():
            assert torch.equal(value, traj.tensors()[path][:, envs]), path
    assert traj.max_episode_length == 3
    assert [p.max_episode_length for p in parts] == [3, 2]
    assert [validate(p).B for p in split_envs(traj, 5)] == [1] * 5
    for bad in (0, -1, 6):
        with pytest.raises(ValueError, match=r"num_parts must be in \[1, B=5\]"):
            split_envs(traj, bad)


@settings(max_examples=30, deadline=None)
@given(
    num_envs=st.integers(1, 4),
    steps=st.integers(1, 4),
    epochs=st.integers(1, 3),
    trailing=st.lists(st.integers(1, 3), max_size=2),
    parts=st.integers(1, 4),
)
def test_flat_rows_match_the_steps_given(
    num_envs: int, steps: int, epochs: int, trailing: list[int], parts: int
) -> None:
    collector = TrajectoryCollector(num_envs=num_envs)
    given_rewards = []
    for _ in range(epochs):
        collector.reset({"x": torch.zeros(num_envs, *trailing)})
        for _ in range(steps):
            rewards = torch.randn(num_envs, *trailing)
            given_rewards.append(rewards)
            collector.add_step(
                actions=torch.zeros(num_envs, 1),
                rewards=rewards,
                next_obs={"x": rewards.clone()},
                terminations=torch.rand(num_envs, 1) < 0.3,
                truncations=torch.zeros(num_envs, 1, dtype=torch.bool),
            )
    traj = collector.build()
    spec = validate(traj)
    rows, envs = spec.T, spec.B
    assert rows == steps * epochs and envs == num_envs
    assert traj.dones is not None and traj.dones.shape[0] == steps * epochs + epochs
    flat = flatten_trajectory(traj, spec)
    for i in range(spec.num_samples):
        t, b = divmod(i, num_envs)
        assert torch.equal(flat["rewards"][i], given_rewards[t][b])
        assert torch.equal(flat["next_obs/x"][i], given_rewards[t][b])
    if parts <= num_envs:
        pieces = split_envs(traj, parts)
        assert sum(validate(p).B for p in pieces) == num_envs
        assert max(p.max_episode_length for p in pieces) == traj.max_episode_length


def test_split_keeps_1d_fields_and_the_parent_length_without_dones() -> None:
    rewards = torch.arange(8.0).reshape(2, 4, 1)
    traj = Trajectory(max_episode_length=9, model_weights_id="w", rewards=rewards)
    traj.versions = torch.zeros(2)  # 1-D: not sampled, copied whole into every part
    parts = split_envs(traj, 3)
    assert [p.rewards.shape[1] for p in parts if p.rewards is not None] == [2, 1, 1]
    assert all(p.max_episode_length == 9 and p.model_weights_id == "w" for p in parts)
    assert all(p.versions is not None and torch.equal(p.versions, torch.zeros(2)) for p in parts)


def test_rbzarr_split_is_a_deprecated_alias_of_split_envs() -> None:
    with pytest.warns(DeprecationWarning, match="split_envs"):
        alias = rbzarr.split
    assert alias is split_envs
    assert "split" not in rbzarr.__all__
    traj = Trajectory(max_episode_length=1, rewards=torch.zeros(2, 4, 1))
    assert [validate(p).B for p in alias(traj, 2)] == [2, 2]
