"""The main job: a short run checks its pieces (not how well a tiny run learns)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import matplotlib.image
import numpy as np
import pytest
import torch

from rbzarr import TrajectoryReplayBuffer, open_buffer
from rbzarr.demo.demo import DemoSettings, report, run_demo, write_learning_curve
from rbzarr.demo.dqn import QNetwork, dqn_update, greedy_return


def short_run(store: Path, seed: int = 0) -> DemoSettings:
    """A run of 6 trajectories of 8 steps on 4 envs, evaluated after 4 and at the end."""
    return DemoSettings(
        store=store,
        num_envs=4,
        steps_per_trajectory=8,
        trajectories=6,
        batch_size=16,
        updates_per_trajectory=2,
        learning_starts=32,
        sample_window_size=3,
        cache_size=1,
        eval_every=4,
        eval_episodes=2,
        seed=seed,
        progress=False,
    )


@pytest.mark.timeout(120)
def test_demo_runs_evaluates_and_its_outputs_reopen(tmp_path):
    lines: list[str] = []
    result = run_demo(short_run(tmp_path), log=lines.append)
    assert result.env_steps == 6 * 8 * 4
    # Updates start once 32 env steps are in: from the first trajectory on.
    assert result.rows_sampled == 6 * 2 * 16
    # An evaluation every 4 trajectories and one at the end, each printed.
    assert [steps for steps, _ in result.evaluations] == [4 * 32, 6 * 32]
    assert len(lines) == 2 and "greedy return" in lines[0]
    assert result.final_return == result.evaluations[-1][1]
    assert "greedy return" in report(result)
    index = json.loads((result.store / "trajectory_index.json").read_text())
    assert index["trajectory_id_list"] == [0, 1, 2, 3, 4, 5]
    # A zarr store's checkpoint is a manifest naming the window's trajectories in the store.
    checkpoint = json.loads((result.checkpoint / "checkpoint.json").read_text())
    assert checkpoint["trajectory_index"]["trajectory_id_list"] == [3, 4, 5]
    for path, count in ((result.store, 6), (result.checkpoint, 3)):
        buffer = TrajectoryReplayBuffer(sample_window_size=0)
        buffer.load_checkpoint(path)
        assert len(buffer) == count
        batch = buffer.sample(32)
        assert batch["curr_obs"]["state"].shape == (32, 4)
        assert bool((batch["rewards"] == 1.0).all())  # next-step reset steps are not stored
    # versions count the rollouts (a column may begin with rows carried over from the
    # previous one: next-step mode).
    versions = [open_buffer(result.store).trajectory(i).versions for i in range(6)]
    assert [int(v.max()) for v in versions] == list(range(6))
    curve = write_learning_curve(result)
    assert matplotlib.image.imread(curve).shape == (500, 1000, 4)


@pytest.mark.timeout(120)
def test_a_seeded_run_is_reproducible_and_the_seed_matters(tmp_path):
    runs = {
        name: run_demo(short_run(tmp_path / name, seed), log=lambda _: None)
        for name, seed in (("first", 0), ("again", 0), ("other", 1))
    }
    first, again, other = runs["first"], runs["again"], runs["other"]
    assert again.evaluations == first.evaluations
    assert again.final_loss == first.final_loss
    stored = {name: open_buffer(run.store) for name, run in runs.items()}
    for i in range(6):
        assert stored["again"].trajectory(i) == stored["first"].trajectory(i), i
    assert other.final_loss != first.final_loss
    assert stored["other"].trajectory(0) != stored["first"].trajectory(0)


def test_epsilon_decays_linearly_then_stays():
    settings = DemoSettings(trajectories=10, num_envs=2, steps_per_trajectory=5)
    total = 10 * 2 * 5
    decay = settings.exploration_fraction * total
    assert settings.epsilon(0) == settings.epsilon_start
    assert settings.epsilon(int(decay)) == pytest.approx(settings.epsilon_end)
    assert settings.epsilon(total) == pytest.approx(settings.epsilon_end)
    assert settings.epsilon_end < settings.epsilon(int(decay / 2)) < settings.epsilon_start


def test_dqn_update_moves_q_towards_the_td_target():
    torch.manual_seed(0)
    q, target = QNetwork(4, 2, 16), QNetwork(4, 2, 16)
    target.load_state_dict(q.state_dict())
    optimiser = torch.optim.SGD(q.parameters(), lr=0.05)
    obs = torch.randn(8, 4)
    batch = {
        "curr_obs": {"state": obs},
        "next_obs": {"state": torch.randn(8, 4)},
        "actions": torch.zeros(8, 1, dtype=torch.int64),
        "rewards": torch.ones(8, 1),
        "terminations": torch.ones(8, 1, dtype=torch.bool),  # goal = reward: no bootstrap
    }
    losses = [dqn_update(q, target, optimiser, batch, 0.99) for _ in range(50)]
    assert losses[-1] < losses[0]
    assert torch.allclose(q(obs)[:, 0], torch.ones(8), atol=0.2)


def test_greedy_return_counts_each_env_first_episode():
    envs = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    q = QNetwork(4, 2, 8)
    with torch.no_grad():  # always push left: episodes end within a few dozen steps
        for parameter in q.parameters():
            parameter.zero_()
        q.net[-1].bias.copy_(torch.tensor([1.0, 0.0]))
    got = greedy_return(q, envs, seed=5)
    lengths = []
    for env in range(3):
        single = gym.make("CartPole-v1")
        single.reset(seed=5 + env)  # gymnasium seeds sub-env i with seed + i
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = single.step(0)
            steps, done = steps + 1, terminated or truncated
        lengths.append(steps)
    assert got == pytest.approx(np.mean(lengths))
    envs.close()
