"""The main job: a real environment feeding a Zarr-backed buffer that trains a Q-network.

A gymnasium vector environment (CartPole, nothing to download) is stepped by a rollout
thread with a random behaviour policy (DQN learns off-policy); a
:class:`~rbzarr.collector.TrajectoryCollector` turns its steps into trajectories that go
through a :class:`~rbzarr.channel.Channel` to the actor (this thread), which puts them in a
:class:`~rbzarr.buffer.TrajectoryReplayBuffer` with ``auto_save`` on a local Zarr store,
samples batches and runs DQN updates.  At the end it saves a checkpoint.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rbzarr.buffer import TrajectoryReplayBuffer
from rbzarr.channel import Channel
from rbzarr.collector import TrajectoryCollector

__all__ = ["DemoResult", "DemoSettings", "report", "run_demo"]


@dataclass(frozen=True)
class DemoSettings:
    """Knobs of the demo; the defaults finish in about a minute on 2 cores."""

    store: Path = Path("rbzarr-demo")
    env_id: str = "CartPole-v1"
    num_envs: int = 16
    steps_per_trajectory: int = 64
    trajectories: int = 100
    batch_size: int = 256
    updates_per_trajectory: int = 16
    sample_window_size: int = 20
    cache_size: int = 4
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class DemoResult:
    """Where the demo left its data, and how fast it went."""

    store: Path
    checkpoint: Path
    env_steps: int
    rows_sampled: int
    bytes_written: int
    seconds: float
    final_loss: float


def _rollout(settings: DemoSettings, channel: Channel, stop: threading.Event) -> None:
    import gymnasium as gym  # noqa: PLC0415  (an optional extra)

    envs = gym.make_vec(
        settings.env_id,
        num_envs=settings.num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    rng = np.random.default_rng(settings.seed)
    num_actions = int(getattr(envs.single_action_space, "n", 2))
    obs, _ = envs.reset(seed=settings.seed)
    collector = TrajectoryCollector(num_envs=settings.num_envs)
    try:
        for version in range(settings.trajectories):
            collector.reset({"state": torch.as_tensor(obs, dtype=torch.float32)})
            for _ in range(settings.steps_per_trajectory):
                actions = rng.integers(0, num_actions, settings.num_envs)
                next_obs, rewards, terminated, truncated, info = envs.step(actions)
                final = np.array(next_obs, copy=True)
                for env in np.flatnonzero(terminated | truncated):
                    final[env] = info["final_obs"][env]
                collector.add_step(
                    actions=torch.as_tensor(actions).unsqueeze(-1),
                    rewards=torch.as_tensor(rewards, dtype=torch.float32).unsqueeze(-1),
                    next_obs={"state": torch.as_tensor(next_obs, dtype=torch.float32)},
                    final_obs={"state": torch.as_tensor(final, dtype=torch.float32)},
                    terminations=torch.as_tensor(terminated).unsqueeze(-1),
                    truncations=torch.as_tensor(truncated).unsqueeze(-1),
                    prev_logprobs=torch.full((settings.num_envs, 1), -np.log(2.0)),
                    versions=torch.full((settings.num_envs,), float(version)),
                )
                obs = next_obs
            if stop.is_set():
                return
            channel.put(collector.build())
    finally:
        envs.close()
        channel.close()


class _QNetwork(torch.nn.Module):
    def __init__(self, obs_dim: int, actions: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def _dqn_update(
    q: _QNetwork, target: _QNetwork, optimiser: torch.optim.Optimizer, batch: dict[str, Any]
) -> float:
    obs, next_obs = batch["curr_obs"]["state"], batch["next_obs"]["state"]
    actions = batch["actions"].long()
    rewards = batch["rewards"].squeeze(-1)
    done = batch["terminations"].squeeze(-1).float()
    with torch.no_grad():
        bootstrap = target(next_obs).max(dim=1).values
        goal = rewards + 0.99 * (1.0 - done) * bootstrap
    value = q(obs).gather(1, actions).squeeze(1)
    loss = torch.nn.functional.smooth_l1_loss(value, goal)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    with torch.no_grad():  # a slowly trailing target network keeps bootstrapping stable
        for weight, trailing in zip(q.parameters(), target.parameters(), strict=True):
            trailing.lerp_(weight, 0.005)
    return float(loss.detach())


def _directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_demo(settings: DemoSettings) -> DemoResult:
    """Run the demo end to end and return where its data is and how fast it went."""
    run_dir = settings.store / time.strftime("run-%Y%m%d-%H%M%S")
    store, checkpoint_path = run_dir / "auto_save", run_dir / "checkpoint"
    torch.manual_seed(settings.seed)
    q, target = _QNetwork(4, 2), _QNetwork(4, 2)
    target.load_state_dict(q.state_dict())
    optimiser = torch.optim.Adam(q.parameters(), lr=1e-3)
    channel = Channel(maxsize=4)
    stop = threading.Event()
    producer = threading.Thread(target=_rollout, args=(settings, channel, stop), daemon=True)
    buffer = TrajectoryReplayBuffer(
        seed=settings.seed,
        cache_size=settings.cache_size,
        sample_window_size=settings.sample_window_size,
        auto_save=True,
        auto_save_path=store,
    )
    rows = 0
    loss = float("nan")
    started = time.perf_counter()
    producer.start()
    bar = tqdm(total=settings.trajectories, desc="trajectories", disable=not settings.progress)
    try:
        for trajectory in channel:
            buffer.add_trajectories([trajectory])
            for _ in range(settings.updates_per_trajectory):
                batch = buffer.sample(settings.batch_size)
                rows += int(batch["rewards"].shape[0])
                loss = _dqn_update(q, target, optimiser, batch)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", rows=rows)
        buffer.flush()
        buffer.save_checkpoint(checkpoint_path)
    finally:
        stop.set()
        bar.close()
        buffer.close()
        producer.join()
    seconds = time.perf_counter() - started
    return DemoResult(
        store=store,
        checkpoint=checkpoint_path,
        env_steps=settings.trajectories * settings.steps_per_trajectory * settings.num_envs,
        rows_sampled=rows,
        bytes_written=_directory_bytes(store),
        seconds=seconds,
        final_loss=loss,
    )


def report(result: DemoResult) -> str:
    """A short human summary of a demo run."""
    return "\n".join(
        [
            f"env steps      {result.env_steps} ({result.env_steps / result.seconds:,.0f}/s)",
            f"rows sampled   {result.rows_sampled} ({result.rows_sampled / result.seconds:,.0f}/s)",
            f"written        {result.bytes_written / 1e6:.1f} MB",
            f"store          {result.store}",
            f"checkpoint     {result.checkpoint}",
            f"final TD loss  {result.final_loss:.3f}",
            f"elapsed        {result.seconds:.1f} s",
        ]
    )
