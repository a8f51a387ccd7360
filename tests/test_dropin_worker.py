"""An RLinf-style actor worker, written against RLinf's replay API, runs on rbzarr.

The code below uses only what RLinf's SAC / DAgger / RLT workers and its visualizer call;
the import is the one line a switching user changes
(``from rlinf.data.storage.replay import ...`` -> ``from rbzarr import ...``).
"""

from __future__ import annotations

import asyncio
import os

import torch
from rlinf_oracle import RLinfTrajectory
from torch.utils.data import DataLoader

from rbzarr import (  # was: from rlinf.data.storage.replay import (
    PreloadReplayBufferDataset,
    ReplayBufferDataset,
    TrajectoryReplayBuffer,
    replay_buffer_collate_fn,
)
from rbzarr.trajectory.model import as_trajectory

T, B = 4, 3


def rollout(step: int, intervened: bool) -> RLinfTrajectory:
    """What an env worker sends: RLinf's Trajectory with one reset row in dones."""
    n = (100 * step + torch.arange(T * B)).reshape(T, B).float()
    flags = torch.zeros(T, B, 2, dtype=torch.bool)
    if intervened:
        flags[1:3, step % B] = True
    dones = torch.cat([torch.zeros(1, B, 1, dtype=torch.bool), (n > 1e9).unsqueeze(-1)])
    return RLinfTrajectory(
        max_episode_length=T,
        model_weights_id=f"v{step}",
        actions=n.unsqueeze(-1).repeat(1, 1, 2),
        intervene_flags=flags,
        rewards=n.unsqueeze(-1),
        terminations=dones,
        truncations=dones,
        dones=dones,
        prev_logprobs=n.unsqueeze(-1),
        versions=torch.full((T, B, 1), float(step)),
        forward_inputs={"action": n.unsqueeze(-1).repeat(1, 1, 2)},
        curr_obs={"states": n.unsqueeze(-1).repeat(1, 1, 3)},
        next_obs={"states": n.unsqueeze(-1).repeat(1, 1, 3) + 1},
    )


class ActorWorker:
    """The replay parts of an RLinf SAC actor worker."""

    def __init__(self, log_path: str, rank: int, preload: bool, demo_load_path: str) -> None:
        self.replay_buffer = TrajectoryReplayBuffer(
            seed=1234,
            enable_cache=True,
            cache_size=2,
            sample_window_size=10,
            auto_save=True,
            auto_save_path=os.path.join(log_path, f"replay_buffer/rank_{rank}"),
            trajectory_format="pt",
        )
        self.demo_buffer = TrajectoryReplayBuffer(
            seed=1234, enable_cache=True, cache_size=10, sample_window_size=10, auto_save=False
        )
        self.demo_buffer.load_checkpoint(
            demo_load_path, is_distributed=True, local_rank=rank, world_size=1
        )
        dataset_cls = PreloadReplayBufferDataset if preload else ReplayBufferDataset
        self.buffer_dataset = dataset_cls(
            replay_buffer=self.replay_buffer,
            demo_buffer=self.demo_buffer,
            batch_size=8,
            min_replay_buffer_size=2,
            min_demo_buffer_size=1,
            prefetch_size=3,
        )
        self.buffer_dataloader = DataLoader(
            self.buffer_dataset,
            batch_size=1,
            num_workers=0,
            drop_last=True,
            collate_fn=replay_buffer_collate_fn,
        )
        self.buffer_dataloader_iter = iter(self.buffer_dataloader)

    def recv_rollout_trajectories(self, recv_list: list[RLinfTrajectory]) -> None:
        self.replay_buffer.add_trajectories(recv_list)
        for traj in recv_list:
            intervene_trajs = as_trajectory(traj).extract_intervene_traj()
            if intervene_trajs is not None:
                self.demo_buffer.add_trajectories(intervene_trajs)

    async def wait_until_ready(self, min_buffer_size: int) -> bool:
        return await self.replay_buffer.is_ready_async(min_buffer_size)

    def run_training(self, min_buffer_size: int) -> dict:
        if not self.replay_buffer.is_ready(min_buffer_size):
            return {}
        batch = next(self.buffer_dataloader_iter)
        stats = self.replay_buffer.get_stats()
        return {"batch": batch, "stats": stats}


def demo_checkpoint(path: str) -> str:
    source = TrajectoryReplayBuffer(seed=0, sample_window_size=5, trajectory_format="pt")
    # demonstrations recorded from interventions, as the worker below records them
    parts = as_trajectory(rollout(50, intervened=True)).extract_intervene_traj()
    assert parts is not None
    source.add_trajectories(parts)
    source.save_checkpoint(path)
    source.close()
    return path


def run_worker(tmp_path, preload: bool) -> None:
    worker = ActorWorker(
        str(tmp_path / "logs"), 0, preload, demo_checkpoint(str(tmp_path / "demo"))
    )
    assert worker.run_training(min_buffer_size=2) == {}
    worker.recv_rollout_trajectories([rollout(0, True), rollout(1, False), rollout(2, True)])
    assert asyncio.run(worker.wait_until_ready(3))
    assert len(worker.demo_buffer) == 3  # the loaded one + one column of each intervened rollout
    for _ in range(3):
        result = worker.run_training(min_buffer_size=2)
        batch = result["batch"]
        assert batch["actions"].shape == (8, 2) and batch["curr_obs"]["states"].shape == (8, 3)
        assert torch.equal(batch["next_obs"]["states"], batch["curr_obs"]["states"] + 1)
        assert result["stats"]["num_trajectories"] == 3
    # the RLT worker's use of the flattening
    flat = worker.replay_buffer._flatten_trajectory(rollout(3, False))
    assert flat["actions"].shape == (T * B, 2) and flat["dones"].shape == (T * B, 1)
    chunks = worker.replay_buffer.sample_chunks(8)
    assert chunks["rewards"].shape == (8, 1)
    # the visualizer's walk over the stored trajectories
    replay = worker.replay_buffer
    assert replay._trajectory_id_list == [0, 1, 2] and replay.size == 3
    for trajectory_id in replay._trajectory_id_list:
        info = replay._trajectory_index[trajectory_id]
        loaded = replay._load_trajectory(trajectory_id, info["model_weights_id"])
        assert loaded == as_trajectory(rollout(trajectory_id, trajectory_id != 1))
        assert list(info["shape"][:2]) == [T, B]
    worker.replay_buffer.clear_cache()
    assert worker.run_training(min_buffer_size=2)["batch"]["rewards"].shape == (8, 1)
    worker.buffer_dataset.close()
    worker.replay_buffer.close(wait=True)
    worker.demo_buffer.close(wait=True)


def test_sac_style_worker_runs_unchanged(tmp_path):
    run_worker(tmp_path, preload=False)


def test_sac_style_worker_with_preload_runs_unchanged(tmp_path):
    run_worker(tmp_path, preload=True)


def test_sac_style_resume_continues_the_previous_runs_store(tmp_path):
    """RLinf's resume: the same log folder for the store, then the run's checkpoint."""
    log_path, ckpt = str(tmp_path / "logs"), str(tmp_path / "ckpt" / "replay_buffer")
    first = ActorWorker(log_path, 0, False, demo_checkpoint(str(tmp_path / "demo")))
    first.recv_rollout_trajectories([rollout(k, False) for k in range(12)])
    first.replay_buffer.save_checkpoint(ckpt)  # the window: ids 2..11
    expected_next = first.replay_buffer.sample(8)
    first.buffer_dataset.close()
    first.replay_buffer.close(wait=True)

    second = ActorWorker(log_path, 0, False, str(tmp_path / "demo"))
    second.replay_buffer.load_checkpoint(ckpt)
    replay = second.replay_buffer
    assert replay._trajectory_id_list == list(range(2, 12))
    assert torch.equal(replay.sample(8)["prev_logprobs"], expected_next["prev_logprobs"])
    second.recv_rollout_trajectories([rollout(12, False)])
    assert replay._trajectory_id_list[-1] == 12 and replay.trajectory_counter == 13
    replay.flush()
    store = TrajectoryReplayBuffer(sample_window_size=0)
    store.load_checkpoint(os.path.join(log_path, "replay_buffer/rank_0"))
    assert store._trajectory_id_list == list(range(13))  # nothing of the first run is lost
    assert store._load_trajectory(0, "v0") == as_trajectory(rollout(0, False))
    second.buffer_dataset.close()
    replay.close(wait=True)


def test_visualizer_style_walk_over_a_pt_folder(tmp_path):
    """RLinf's visualizer: a buffer on the folder, load_checkpoint of that folder, walk ids."""
    folder = str(tmp_path / "replay_buffer")
    writer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=folder, trajectory_format="pt")
    writer.add_trajectories([rollout(k, False) for k in range(3)])
    writer.close(wait=True)
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=folder, enable_cache=True, cache_size=5
    )
    buffer.load_checkpoint(folder)
    assert (buffer.size, buffer.total_samples) == (3, 3 * T * B)
    for index, trajectory_id in enumerate(buffer._trajectory_id_list[:10]):
        info = buffer._trajectory_index[trajectory_id]
        trajectory = buffer._load_trajectory(trajectory_id, info["model_weights_id"])
        steps, envs = info["shape"][:2]
        assert (steps, envs) == (T, B) and trajectory == as_trajectory(rollout(index, False))
    buffer.close()
