"""Rollouts on Ray into one shared store; a learner samples them as they arrive.

    python examples/ray_rollouts.py --store /tmp/rollouts --writers 2 --trajectories 4
    python examples/ray_rollouts.py --store s3://bucket/run --writers 4 --trajectories 8 \\
        --storage-option endpoint_url=http://127.0.0.1:9000

It starts a local Ray cluster and ``--writers`` rollout actors.  Each collects gymnasium's
CartPole-v1 (random actions) with ``TrajectoryCollector``, writes every trajectory into the
shared store itself and sends the learner only a commit notice (a few hundred bytes)
through a Ray queue.  The learner adds each notice by reference and samples a batch.  The
last line printed is JSON: how many trajectories the learner holds and what it sampled.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch
from ray.util.queue import Queue

from rbzarr import TrajectoryCollector, TrajectoryReplayBuffer
from rbzarr.distributed import commit_notices

NUM_ENVS = 4
STEPS = 32
BATCH = 64


def parse_option(text: str) -> tuple[str, Any]:
    """``k=v``; ``v`` as JSON when it parses (numbers, booleans), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected k=v, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@ray.remote(num_cpus=0)
class RolloutActor:
    """Collects CartPole trajectories into the shared store; sends their commit notices."""

    def __init__(self, store: str, options: dict[str, Any], seed: int) -> None:
        self.envs = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS)
        self.rng = np.random.default_rng(seed)
        self.buffer = TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=store, storage_options=options, cache_size=0
        )
        self.collector = TrajectoryCollector.for_vector_env(self.envs)
        obs, _ = self.envs.reset(seed=seed)
        self.collector.reset({"state": torch.as_tensor(obs, dtype=torch.float32)})

    def run(self, trajectories: int, queue: Queue) -> int:
        """Collect ``trajectories`` trajectories; one notice each, once committed."""
        for _ in range(trajectories):
            for _ in range(STEPS):
                actions = self.rng.integers(0, 2, NUM_ENVS)
                obs, rewards, terminated, truncated, _ = self.envs.step(actions)
                self.collector.add_step(
                    actions=torch.as_tensor(actions).unsqueeze(-1),
                    rewards=torch.as_tensor(rewards, dtype=torch.float32).unsqueeze(-1),
                    next_obs={"state": torch.as_tensor(obs, dtype=torch.float32)},
                    terminations=torch.as_tensor(terminated).unsqueeze(-1),
                    truncations=torch.as_tensor(truncated).unsqueeze(-1),
                )
            self.buffer.add_trajectories([self.collector.build()])
            self.buffer.flush()  # committed: only now may the notice go out
            queue.put(commit_notices(self.buffer, self.buffer.trajectory_ids[-1:])[0])
        self.buffer.close()
        return trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="the shared store: a path or URL")
    parser.add_argument("--writers", type=int, default=2, help="rollout actors")
    parser.add_argument("--trajectories", type=int, default=4, help="trajectories per actor")
    parser.add_argument(
        "--storage-option",
        type=parse_option,
        action="append",
        default=[],
        metavar="K=V",
        help="an fsspec storage option (repeat for several)",
    )
    args = parser.parse_args()
    options = dict(args.storage_option)
    total = args.writers * args.trajectories

    ray.init(
        num_cpus=max(2, args.writers),
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        log_to_driver=False,
    )
    queue = Queue()
    learner = TrajectoryReplayBuffer(
        seed=0,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=args.store,
        storage_options=options,
    )
    actors = [RolloutActor.remote(args.store, options, seed) for seed in range(args.writers)]
    started = time.perf_counter()
    runs = [actor.run.remote(args.trajectories, queue) for actor in actors]
    sampled_rows = 0
    notice_bytes = 0
    rewards = 0.0
    for _ in range(total):
        notice = queue.get(timeout=300)
        notice_bytes = max(notice_bytes, len(pickle.dumps(notice)))
        learner.add_committed([notice])  # by reference: no trajectory bytes through Ray
        batch = learner.sample(BATCH)
        sampled_rows += int(batch["rewards"].shape[0])
        rewards += float(batch["rewards"].sum())
    ray.get(runs)
    seconds = time.perf_counter() - started
    result = {
        "trajectories": len(learner),
        "writers": args.writers,
        "samples_in_buffer": learner.total_samples,
        "sampled_batches": total,
        "sampled_rows": sampled_rows,
        "sampled_reward_mean": rewards / max(sampled_rows, 1),
        "max_notice_bytes": notice_bytes,
        "seconds": round(seconds, 2),
        "store": args.store,
    }
    learner.close()
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
