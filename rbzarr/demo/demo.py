"""The demo run: a gymnasium vector env feeds a Zarr-backed buffer that trains a DQN.

Reproducible from its seed: the rollout of trajectory ``k`` acts with the weights the actor
had after training on trajectory ``k - 2``, so the hand-over is always the same.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rbzarr.analysis.plotting import plot_learning_curve
from rbzarr.analysis.view import open_buffer
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.demo.dqn import QNetwork, dqn_update, greedy_return
from rbzarr.demo.settings import DemoResult, DemoSettings
from rbzarr.rollout.channel import Channel
from rbzarr.rollout.collector import TrajectoryCollector

__all__ = ["DemoResult", "DemoSettings", "report", "run_demo", "write_learning_curve"]

# Weights reach the rollout thread this many trajectories after the data they trained on.
_POLICY_LAG = 2


def _make_env(settings: DemoSettings, num_envs: int) -> Any:
    import gymnasium as gym  # noqa: PLC0415  (an optional extra)

    return gym.make_vec(settings.env_id, num_envs=num_envs)


def _rollout(
    settings: DemoSettings,
    channel: Channel,
    weights: queue.Queue[dict[str, torch.Tensor]],
    stop: threading.Event,
) -> None:
    """Collect ``settings.trajectories`` trajectories with an epsilon-greedy policy."""
    envs = _make_env(settings, settings.num_envs)
    policy = QNetwork(int(envs.single_observation_space.shape[0]), 2, settings.hidden)
    policy.load_state_dict(weights.get())
    rng = np.random.default_rng(settings.seed)
    collector = TrajectoryCollector.for_vector_env(envs)
    obs, _ = envs.reset(seed=settings.seed)
    collector.reset({"state": torch.as_tensor(obs, dtype=torch.float32)})
    try:
        for version in range(settings.trajectories):
            if version >= _POLICY_LAG:
                policy.load_state_dict(weights.get())
            epsilon = settings.epsilon(version * settings.steps_per_round)
            for _ in range(settings.steps_per_trajectory):
                if stop.is_set():
                    return
                obs = _step(envs, policy, collector, obs, epsilon, rng, version)
            channel.put(collector.build())
    finally:
        envs.close()
        channel.close()


def _step(
    envs: Any,
    policy: QNetwork,
    collector: TrajectoryCollector,
    obs: np.ndarray,
    epsilon: float,
    rng: np.random.Generator,
    version: int,
) -> np.ndarray:
    """One epsilon-greedy step of every env, recorded in ``collector``."""
    state = torch.as_tensor(obs, dtype=torch.float32)
    with torch.no_grad():
        actions = policy(state).argmax(dim=1).numpy()
    explore = rng.random(len(actions)) < epsilon
    actions = np.where(explore, rng.integers(0, 2, len(actions)), actions)
    next_obs, rewards, terminated, truncated, _ = envs.step(actions)
    collector.add_step(
        actions=torch.as_tensor(actions).unsqueeze(-1),
        rewards=torch.as_tensor(rewards, dtype=torch.float32).unsqueeze(-1),
        next_obs={"state": torch.as_tensor(next_obs, dtype=torch.float32)},
        terminations=torch.as_tensor(terminated).unsqueeze(-1),
        truncations=torch.as_tensor(truncated).unsqueeze(-1),
        versions=torch.full((len(actions),), float(version)),
    )
    return np.asarray(next_obs)


def _directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Learner:
    """The actor's side: the Q-network, its target, the optimiser and the evaluations."""

    def __init__(self, settings: DemoSettings, log: Callable[[str], None]) -> None:
        torch.manual_seed(settings.seed)
        self.settings = settings
        self.q = QNetwork(4, 2, settings.hidden)
        self.target = copy.deepcopy(self.q)
        self.optimiser = torch.optim.Adam(self.q.parameters(), lr=settings.learning_rate)
        # The step size decays linearly to zero: late updates polish, they do not unlearn.
        total = max(1, settings.trajectories * settings.updates_per_trajectory)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimiser, lambda update: max(0.0, 1.0 - update / total)
        )
        self.updates = 0
        self.loss = float("nan")
        self.evaluations: list[tuple[int, float]] = []
        self.eval_env = _make_env(settings, settings.eval_episodes)
        self.log = log

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.q.state_dict().items()}

    def train(self, buffer: TrajectoryReplayBuffer, env_steps: int) -> int:
        """Run one trajectory's updates (once enough steps are in); return rows sampled."""
        if env_steps < self.settings.learning_starts:
            return 0
        rows = 0
        for _ in range(self.settings.updates_per_trajectory):
            batch = buffer.sample(self.settings.batch_size)
            rows += int(batch["rewards"].shape[0])
            self.loss = dqn_update(self.q, self.target, self.optimiser, batch, self.settings.gamma)
            self.schedule.step()
            self.updates += 1
            if self.updates % self.settings.target_every == 0:
                self.target.load_state_dict(self.q.state_dict())
        return rows

    def evaluate(self, env_steps: int) -> float:
        """Mean greedy return over ``eval_episodes`` fresh episodes; logged and kept."""
        seed = self.settings.seed + 1_000_003  # the same start states at every evaluation
        mean = greedy_return(self.q, self.eval_env, seed)
        self.evaluations.append((env_steps, mean))
        epsilon = self.settings.epsilon(env_steps)
        self.log(
            f"env steps {env_steps:>7,}  greedy return {mean:6.1f}  "
            f"epsilon {epsilon:.2f}  TD loss {self.loss:.3f}"
        )
        return mean


def run_demo(settings: DemoSettings, log: Callable[[str], None] = tqdm.write) -> DemoResult:
    """Run the demo end to end: train, evaluate as it learns, checkpoint."""
    # One intra-op thread: the small network gains nothing from more, and the results then
    # do not depend on the machine's core count (reductions split across threads differ).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(settings, log)
    finally:
        torch.set_num_threads(threads)


def _run(settings: DemoSettings, log: Callable[[str], None]) -> DemoResult:
    run_dir = settings.store / time.strftime("run-%Y%m%d-%H%M%S")
    store, checkpoint_path = run_dir / "auto_save", run_dir / "checkpoint"
    learner = _Learner(settings, log)
    channel = Channel(maxsize=_POLICY_LAG)
    weights: queue.Queue[dict[str, torch.Tensor]] = queue.Queue()
    weights.put(learner.weights())
    stop = threading.Event()
    producer = threading.Thread(
        target=_rollout, args=(settings, channel, weights, stop), daemon=True
    )
    buffer = TrajectoryReplayBuffer(
        seed=settings.seed,
        cache_size=settings.cache_size,
        sample_window_size=settings.sample_window_size,
        auto_save=True,
        auto_save_path=store,
    )
    rows = env_steps = 0
    started = time.perf_counter()
    producer.start()
    bar = tqdm(total=settings.trajectories, desc="trajectories", disable=not settings.progress)
    try:
        for version, trajectory in enumerate(channel):
            buffer.add_trajectories([trajectory])
            env_steps += settings.steps_per_round
            rows += learner.train(buffer, env_steps)
            weights.put(learner.weights())
            last = version + 1 == settings.trajectories
            if (version + 1) % settings.eval_every == 0 or last:
                learner.evaluate(env_steps)
            bar.update(1)
        buffer.flush()
        buffer.save_checkpoint(checkpoint_path)
    finally:
        stop.set()
        bar.close()
        buffer.close()
        producer.join()
        learner.eval_env.close()
    return DemoResult(
        store=store,
        checkpoint=checkpoint_path,
        env_steps=env_steps,
        rows_sampled=rows,
        bytes_written=_directory_bytes(store),
        seconds=time.perf_counter() - started,
        final_loss=learner.loss,
        evaluations=learner.evaluations,
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
            f"greedy return  {result.final_return:.1f} (mean of the last evaluation)",
            f"elapsed        {result.seconds:.1f} s",
        ]
    )


def write_learning_curve(result: DemoResult) -> Path | str:
    """Draw the run's returns over training into ``learning-curve.png`` beside its store."""
    path = result.store.parent / "learning-curve.png"
    try:
        plot_learning_curve(result.evaluations, open_buffer(result.store), path)
    except ImportError as exc:
        return f"not drawn: {exc}"
    return path
