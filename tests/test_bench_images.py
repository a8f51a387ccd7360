"""The ``images`` bench suite: RLinf-shaped rollouts and targets that say what was not measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.draws import DrawSequence, gather_rows, same_rows
from benchmarks.frames import EPISODE_STEPS, image_keys, rollout, to_trajectory
from benchmarks.images import _state_shape, _state_trajectory, images_targets, store_reader
from benchmarks.workloads import image_trajectory
from rbzarr import TrajectoryReplayBuffer
from rbzarr.trajectory import tree
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate


class CountingScenes:
    """Frames that name the environment, its episode and the step within it."""

    def __init__(self, B: int, terminate_at: int) -> None:
        self.episode = [0] * B
        self.step_in = [0] * B
        self.terminate_at = terminate_at

    def observe(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[b, episode, step]`` painted into two 2x2 frames and a state."""
        value = np.array([b, self.episode[b], self.step_in[b]], dtype=np.uint8)
        frame = np.broadcast_to(value, (2, 2, 3)).copy()
        return frame, 255 - frame, value.astype(np.float32)

    def step(self, b: int, action: np.ndarray) -> tuple[float, bool]:
        """One step; terminates at ``terminate_at`` steps into an episode."""
        self.step_in[b] += 1
        return float(action[0]), self.step_in[b] == self.terminate_at

    def reset(self, b: int) -> None:
        """The next episode, from step 0."""
        self.episode[b] += 1
        self.step_in[b] = 0


@settings(max_examples=20, deadline=None)
@given(
    count=st.integers(1, 4),
    T=st.integers(1, 12),
    B=st.integers(1, 4),
    terminate_at=st.integers(1, 2 * EPISODE_STEPS),
)
def test_next_obs_is_the_following_curr_obs_except_at_dones(
    count: int, T: int, B: int, terminate_at: int
) -> None:
    trajectories = list(rollout(CountingScenes(B, terminate_at), count, T, B, seed=0))
    assert len(trajectories) == count
    for k, arrays in enumerate(trajectories):
        dones = arrays["dones"]
        assert dones.shape == (T + 1, B)
        for key in ("main_images", "wrist_images", "states"):
            curr, after = arrays[f"curr_obs/{key}"], arrays[f"next_obs/{key}"]
            assert curr.shape[:2] == after.shape[:2] == (T, B)
            for t in range(T - 1):
                for b in range(B):
                    same = np.array_equal(after[t, b], curr[t + 1, b])
                    assert same != bool(dones[t + 1, b])
        # a done ends the episode: the frame after it is step 0 of the next one
        steps = arrays["curr_obs/states"][..., 2]
        for t in range(T):
            for b in range(B):
                assert (steps[t, b] == 0) == (bool(dones[t, b]) or (k == 0 and t == 0))
        if k + 1 < count:  # the next trajectory continues the same environments
            following = trajectories[k + 1]
            assert np.array_equal(following["dones"][0], dones[T])
            ended = dones[T]
            kept = following["curr_obs/states"][0][~ended]
            assert np.array_equal(kept, arrays["next_obs/states"][T - 1][~ended])


def test_a_rollout_becomes_an_rlinf_trajectory() -> None:
    arrays = next(rollout(CountingScenes(2, 3), 1, 4, 2, seed=0))
    trajectory = to_trajectory(arrays, 4)
    tensors = trajectory.tensors()
    assert set(image_keys()) < set(tensors)
    assert len(tensors) == 10  # RLinf-shaped: 10 arrays
    assert tuple(tensors["curr_obs/main_images"].shape) == (4, 2, 2, 2, 3)


def test_targets_name_what_was_not_measured() -> None:
    missing = {"unavailable": "mujoco is not installed"}
    results = {
        "sources": {"mujoco128": missing, "mujoco224": missing, "photos224": missing},
        "state_writes": {"unavailable": "torchrl is not installed"},
        "s3": {"unavailable": "no frame source is installed"},
    }
    found = images_targets(results)
    assert len(found) == 30  # 3 sizes, 2 jpeg, 9 sampling, 12 writes, 4 more
    assert all(t["met"] is None and t["reason"] for t in found)
    assert any(t["reason"] == "torchrl is not installed" for t in found)


def test_the_sampled_stores_are_read_from_disk_not_held_in_memory(tmp_path: Path) -> None:
    trajectories = [image_trajectory(seed, T=4, B=2) for seed in (1, 2)]
    with TrajectoryReplayBuffer(seed=5, auto_save=True, auto_save_path=str(tmp_path)) as writer:
        writer.add_trajectories(trajectories)
    with store_reader(tmp_path, len(trajectories), seed=5) as buffer:
        assert buffer.get_stats()["cache_size"] == 0  # no trajectory in memory
        batch = tree.flatten(buffer.sample(16))
    flats = [flatten_trajectory(t, validate(t)) for t in trajectories]
    draws = DrawSequence([validate(t).num_samples for t in trajectories], 16, seed=5)
    assert same_rows(batch, gather_rows(flats, *draws.at(0)))


def test_state_writes_report_the_layouts_floor_beside_torchrl(tmp_path: Path) -> None:
    """Each state shape times the buffer, ``LazyMemmapStorage.extend`` and the layout's
    floor: the same groups' and packs' folders and files, learnt from the buffer's store,
    made with bare ``os`` calls (two small trajectories added at once are one pack: its
    folder, one per array, the shards and its document; each member's folder and
    document; ``trajectories/`` and ``packs/`` with their documents; an all-zero ``dones``
    has no shard)."""
    trajectories = [_state_trajectory(4, 2, 8, seed) for seed in range(2)]
    found = _state_shape(trajectories, one_add=True, root=tmp_path, repeats=1)
    arrays = len(trajectories[0].tensors())
    shards = 2 * found["files per trajectory"] - 5  # beside the documents
    assert arrays - 1 <= shards <= arrays
    # curr_obs/ and next_obs/ hold state
    assert 2 * found["folders per trajectory"] == 2 + 1 + 2 + shards + 2
    for name in ("rows_s", "LazyMemmapStorage.extend rows_s", "layout floor rows_s"):
        assert len(found[name]["runs"]) == 1 and found[name]["min"] > 0, name
    ratio = found["layout floor / LazyMemmapStorage.extend"]["median"]
    floor = found["layout floor rows_s"]["median"]
    assert ratio == floor / found["LazyMemmapStorage.extend rows_s"]["median"]
