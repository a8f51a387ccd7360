"""The collector on real gymnasium vector envs: no stored transition crosses an episode end.

CartPole-v1 pays reward 1 on every real step; a next-step reset step pays 0.  So a stored
reward other than 1, or ``next_obs[t] != curr_obs[t + 1]`` where the env did not finish,
is a transition that leads from one episode into the next.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rbzarr import TrajectoryReplayBuffer
from rbzarr.errors import InvalidTrajectoryError
from rbzarr.rollout.collector import TrajectoryCollector
from rbzarr.trajectory.model import Trajectory

NUM_ENVS = 4
STEPS = 40
TRAJECTORIES = 4


def as_obs(obs: np.ndarray) -> dict[str, torch.Tensor]:
    return {"state": torch.as_tensor(obs, dtype=torch.float32)}


def step_args(envs: Any, rng: np.random.Generator) -> tuple[dict[str, Any], Any, dict]:
    actions = rng.integers(0, 2, NUM_ENVS)
    next_obs, rewards, terminated, truncated, info = envs.step(actions)
    args = {
        "actions": torch.as_tensor(actions).unsqueeze(-1),
        "rewards": torch.as_tensor(rewards, dtype=torch.float32).unsqueeze(-1),
        "next_obs": as_obs(next_obs),
        "terminations": torch.as_tensor(terminated).unsqueeze(-1),
        "truncations": torch.as_tensor(truncated).unsqueeze(-1),
    }
    return args, next_obs, info


def check_transitions(trajectories: list[Trajectory], continuous: bool) -> int:
    """Every reward is 1; next_obs[t] == curr_obs[t + 1] wherever the env did not finish
    (across trajectory boundaries too when ``continuous``). Returns the episode ends."""
    curr = torch.cat([t.curr_obs["state"] for t in trajectories])  # [sum T, B, 4]
    nxt = torch.cat([t.next_obs["state"] for t in trajectories])
    dones = torch.cat([t.dones[1:, :, 0] for t in trajectories])  # step rows (one epoch each)
    rewards = torch.cat([t.rewards[:, :, 0] for t in trajectories])
    assert bool((rewards == 1.0).all())
    follows = torch.all(nxt[:-1] == curr[1:], dim=-1)  # [sum T - 1, B]
    if not continuous:
        ends = np.cumsum([t.rewards.shape[0] for t in trajectories])[:-1] - 1
        follows[torch.as_tensor(ends)] = True
    assert bool((follows | dones[:-1]).all())
    # A finished step ends at a terminal state: the pole fell or the cart left the track.
    terminal = nxt[dones]
    assert bool(((terminal[:, 0].abs() > 2.4) | (terminal[:, 2].abs() > 0.2095)).all())
    return int(dones.sum())


@pytest.mark.timeout(60)
def test_default_next_step_mode_stores_only_real_transitions():
    envs = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    rng = np.random.default_rng(0)
    collector = TrajectoryCollector.for_vector_env(envs)
    obs, _ = envs.reset(seed=0)
    collector.reset(as_obs(obs))
    trajectories = []
    resets = 0
    was_done = np.zeros(NUM_ENVS, dtype=bool)
    for _ in range(TRAJECTORIES):
        for _ in range(STEPS):
            args, _, _ = step_args(envs, rng)
            resets += int(was_done.sum())
            was_done = (args["terminations"] | args["truncations"])[:, 0].numpy()
            collector.add_step(**args)
        trajectories.append(collector.build())
    envs.close()
    episode_ends = check_transitions(trajectories, continuous=True)
    assert episode_ends >= 4  # random CartPole episodes last ~20 steps
    # Every stored row is a real transition, none lost: T per column adds up to the
    # steps minus that column's reset steps, less what is still pending.
    stored = sum(t.rewards.shape[0] for t in trajectories) * NUM_ENVS
    assert stored + collector.num_steps * NUM_ENVS >= TRAJECTORIES * STEPS * NUM_ENVS - resets
    assert stored <= TRAJECTORIES * STEPS * NUM_ENVS - resets
    buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    buffer.add_trajectories(trajectories)
    batch = buffer.sample(512)
    assert bool((batch["rewards"] == 1.0).all())


@pytest.mark.timeout(60)
def test_same_step_mode_with_final_obs():
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=NUM_ENVS,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    rng = np.random.default_rng(1)
    collector = TrajectoryCollector.for_vector_env(envs)
    assert collector.autoreset_mode == "same_step"
    obs, _ = envs.reset(seed=1)
    trajectories = []
    for _ in range(TRAJECTORIES):
        collector.reset(as_obs(obs))
        for _ in range(STEPS):
            args, obs, info = step_args(envs, rng)
            final = np.array(obs, copy=True)
            for env in np.flatnonzero(info.get("_final_obs", np.zeros(NUM_ENVS, bool))):
                final[env] = info["final_obs"][env]
            collector.add_step(**args, final_obs=as_obs(final))
        trajectories.append(collector.build())
    envs.close()
    assert all(t.rewards.shape[0] == STEPS for t in trajectories)
    assert check_transitions(trajectories, continuous=True) >= 4


def test_disabled_mode_is_refused_with_the_fix():
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED},
    )
    with pytest.raises(ValueError, match=r"AutoresetMode\.NEXT_STEP"):
        TrajectoryCollector.for_vector_env(envs)
    envs.close()
    with pytest.raises(ValueError, match="unknown autoreset_mode 'sometimes'"):
        TrajectoryCollector(2, autoreset_mode="sometimes")


def flags(*envs: int) -> torch.Tensor:
    out = torch.zeros(3, 1, dtype=torch.bool)
    out[list(envs)] = True
    return out


def add(collector: TrajectoryCollector, t: int, done: tuple[int, ...] = ()) -> None:
    collector.add_step(
        actions=torch.full((3, 1), t),
        rewards=torch.full((3, 1), float(t)),
        next_obs={"x": torch.full((3, 1), float(t + 1))},
        terminations=flags(*done),
        truncations=flags(),
    )


def test_next_step_columns_skip_reset_steps_and_carry_over():
    collector = TrajectoryCollector(3, autoreset_mode="next_step")
    collector.reset({"x": torch.zeros(3, 1)})
    add(collector, 0)
    add(collector, 1, done=(1,))  # env 1's episode ends; step 2 is its reset step
    add(collector, 2)
    add(collector, 3)
    first = collector.build()
    # env 1 made 3 transitions (steps 0, 1, 3), the others 4: T = 3.
    assert first.actions[:, :, 0].T.tolist() == [[0, 1, 2], [0, 1, 3], [0, 1, 2]]
    assert first.dones[:, :, 0].T.tolist() == [
        [False, False, False, False],
        [False, False, True, False],  # the reset row, then env 1's done at its step 1
        [False, False, False, False],
    ]
    # env 1's reset step: its curr_obs is the reset observation the env returned (3.0).
    assert first.curr_obs["x"][:, 1, 0].tolist() == [0.0, 1.0, 3.0]
    assert first.max_episode_length == 3
    assert collector.num_steps == 1  # step 3 still holds env 0's and env 2's transition
    add(collector, 4)
    second = collector.build()
    assert second.actions[:, :, 0].T.tolist() == [[3], [4], [3]]
    assert second.dones.shape == (2, 3, 1)
    assert collector.num_steps == 1


def test_next_step_refusals_change_nothing():
    collector = TrajectoryCollector(3, autoreset_mode="next_step")
    collector.reset({"x": torch.zeros(3, 1)})
    with pytest.raises(InvalidTrajectoryError, match="drop final_obs"):
        collector.add_step(
            actions=torch.zeros(3, 1),
            rewards=torch.zeros(3, 1),
            next_obs={"x": torch.zeros(3, 1)},
            terminations=flags(),
            truncations=flags(),
            final_obs={"x": torch.zeros(3, 1)},
        )
    add(collector, 0, done=(0, 1, 2))
    add(collector, 1)  # every env's reset step: no transition yet for the second row
    first = collector.build()
    assert first.actions.shape == (1, 3, 1)
    add(collector, 2, done=(0,))
    collector.build()
    add(collector, 3)  # env 0's reset step
    with pytest.raises(InvalidTrajectoryError, match="no transition yet"):
        collector.build()
    assert collector.num_steps == 1
    with pytest.raises(InvalidTrajectoryError, match="call clear"):
        collector.reset({"x": torch.zeros(3, 1)})
    collector.clear()
    collector.reset({"x": torch.zeros(3, 1)})
