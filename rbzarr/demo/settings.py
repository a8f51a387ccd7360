"""The demo's knobs (:class:`DemoSettings`) and what a run leaves (:class:`DemoResult`).

:func:`rbzarr.demo.demo.run_demo` takes the one and returns the other; ``rbzarr demo`` exposes
the knobs as options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoResult", "DemoSettings"]


@dataclass(frozen=True)
class DemoSettings:
    """Knobs of the demo; the defaults learn CartPole in about two minutes on 2 cores.

    Parameters
    ----------
    store
        The directory in which each run makes ``run-<time>/`` with its ``auto_save`` store
        and its checkpoint.
    env_id
        The gymnasium env id; the Q-network assumes 4 observations and 2 actions (CartPole).
    num_envs
        Environments of the rollout vector env (``B`` of every trajectory).
    steps_per_trajectory
        Collector steps per trajectory (``T``).
    trajectories
        Trajectories the run collects and trains on.
    batch_size
        Rows per sampled batch.
    updates_per_trajectory
        DQN updates after each trajectory is added.
    learning_starts
        Env steps collected before the first update.
    sample_window_size
        The buffer's sampling window in trajectories; 0 samples every trajectory of the run.
    cache_size
        Trajectories the buffer samples from memory; every one is also written to the store.
    learning_rate
        Adam's initial step size; it decays linearly to 0 over the run.
    gamma
        The discount of the TD target.
    hidden
        Width of the Q-network's two hidden layers.
    target_every
        Updates between copies of the Q-network into the target network.
    epsilon_start, epsilon_end
        Exploration rate of the first rollout, and after the decay.
    exploration_fraction
        Share of all env steps over which epsilon decays linearly.
    eval_every
        Trajectories between greedy evaluations (the last trajectory is always evaluated).
    eval_episodes
        Fresh episodes per greedy evaluation (environments of the evaluation vector env).
    seed
        Seeds torch, the env resets, exploration and the buffer's sampling.
    progress
        Show a progress bar of the trajectories.
    """

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
        """The exploration rate after ``env_steps`` env steps.

        Parameters
        ----------
        env_steps
            Env steps collected so far (all environments together).

        Returns
        -------
        float
            ``epsilon_start`` moved linearly towards ``epsilon_end``, reached after
            ``exploration_fraction`` of the run's env steps and kept from then on.
        """
        decay = self.exploration_fraction * self.trajectories * self.steps_per_round
        fraction = min(1.0, env_steps / decay) if decay > 0 else 1.0
        return self.epsilon_start + fraction * (self.epsilon_end - self.epsilon_start)


@dataclass(frozen=True)
class DemoResult:
    """Where the demo left its data, how fast it went and how well it learnt.

    Parameters
    ----------
    store
        The run's ``auto_save`` Zarr store.
    checkpoint
        The checkpoint saved at the end of the run.
    env_steps
        Env steps collected, all environments together.
    rows_sampled
        Rows the DQN updates sampled from the buffer.
    bytes_written
        Size of the files in ``store``.
    seconds
        Wall-clock time from starting the rollout thread to the end of the run (checkpoint
        saved, buffer closed, threads joined).
    final_loss
        The TD loss of the last update (NaN when no update ran).
    evaluations
        ``(env_steps, mean greedy return)`` pairs, in order.
    """

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
