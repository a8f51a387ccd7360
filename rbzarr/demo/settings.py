"""The demo's knobs (:class:`DemoSettings`) and what a run leaves (:class:`DemoResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoResult", "DemoSettings"]


@dataclass(frozen=True)
class DemoSettings:
    """Knobs of the demo; the defaults learn CartPole in about two minutes on 2 cores."""

    store: Path = Path("rbzarr-demo")
    env_id: str = "CartPole-v1"
    num_envs: int = 8
    steps_per_trajectory: int = 32
    trajectories: int = 200
    batch_size: int = 64
    updates_per_trajectory: int = 128
    learning_starts: int = 1024
    sample_window_size: int = 0
    cache_size: int = 200
    learning_rate: float = 2.3e-3
    gamma: float = 0.99
    hidden: int = 256
    target_every: int = 128
    epsilon_start: float = 1.0
    epsilon_end: float = 0.04
    exploration_fraction: float = 0.16
    eval_every: int = 10
    eval_episodes: int = 8
    seed: int = 0
    progress: bool = True

    @property
    def steps_per_round(self) -> int:
        """Env steps in one trajectory: ``num_envs * steps_per_trajectory``."""
        return self.num_envs * self.steps_per_trajectory

    def epsilon(self, env_steps: int) -> float:
        """The exploration rate after ``env_steps`` env steps."""
        decay = self.exploration_fraction * self.trajectories * self.steps_per_round
        fraction = min(1.0, env_steps / decay) if decay > 0 else 1.0
        return self.epsilon_start + fraction * (self.epsilon_end - self.epsilon_start)


@dataclass(frozen=True)
class DemoResult:
    """Where the demo left its data, how fast it went and how well it learnt."""

    store: Path
    checkpoint: Path
    env_steps: int
    rows_sampled: int
    bytes_written: int
    seconds: float
    final_loss: float
    evaluations: list[tuple[int, float]]

    @property
    def final_return(self) -> float:
        """The mean greedy return of the last evaluation (NaN without one)."""
        return self.evaluations[-1][1] if self.evaluations else float("nan")
