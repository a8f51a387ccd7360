"""A small DQN for the demo: the Q-network, one TD update on a sampled batch, greedy returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["QNetwork", "dqn_update", "greedy_return"]


class QNetwork(torch.nn.Module):
    """An MLP from observations to one value per discrete action."""

    def __init__(self, obs_dim: int, actions: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Action values ``[N, actions]`` of observations ``[N, obs_dim]``."""
        return self.net(obs)


def dqn_update(
    q: QNetwork,
    target: QNetwork,
    optimiser: torch.optim.Optimizer,
    batch: dict[str, Any],
    gamma: float,
    max_grad_norm: float = 10.0,
) -> float:
    """One TD(0) step of ``q`` towards ``r + gamma * max_a target(s', a)``; the loss."""
    obs, next_obs = batch["curr_obs"]["state"], batch["next_obs"]["state"]
    actions = batch["actions"].long()
    rewards = batch["rewards"].squeeze(-1)
    terminal = batch["terminations"].squeeze(-1).float()
    with torch.no_grad():
        bootstrap = target(next_obs).max(dim=1).values
        goal = rewards + gamma * (1.0 - terminal) * bootstrap
    value = q(obs).gather(1, actions).squeeze(1)
    loss = torch.nn.functional.smooth_l1_loss(value, goal)
    optimiser.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(q.parameters(), max_grad_norm)
    optimiser.step()
    return float(loss.detach())


def greedy_return(q: QNetwork, envs: Any, seed: int, max_steps: int = 10_000) -> float:
    """Mean return of the first episode of each env of ``envs`` under the greedy policy."""
    obs, _ = envs.reset(seed=seed)
    running = np.ones(envs.num_envs, dtype=bool)
    returns = np.zeros(envs.num_envs)
    for _ in range(max_steps):
        with torch.no_grad():
            actions = q(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=1).numpy()
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns += np.where(running, rewards, 0.0)
        running &= ~(terminated | truncated)
        if not running.any():
            break
    return float(returns.mean())
