"""Ray: rollout tasks write one shared store and send commit notices; a buffer actor; ray.data.

One small local Ray cluster serves the whole module (its start-up is most of the cost).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_trajectory

from rbzarr import PrioritizedReplay, TrajectoryReplayBuffer, open_buffer
from rbzarr.distributed import CommitNotice, commit_notices
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

ray = pytest.importorskip("ray")

from rbzarr.distributed.ray_actor import remote_buffer  # noqa: E402
from rbzarr.distributed.ray_datasource import read_store  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    # ray.data's own settings warn about their deprecations on first use.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

WRITERS = 2
PER_WRITER = 4


@pytest.fixture(scope="module", autouse=True)
def cluster():
    tests = str(Path(__file__).parent)
    old = os.environ.get("PYTHONPATH")
    # Workers inherit the driver's environment: they import rbzarr and these helpers.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (old, tests) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 2**20,
        log_to_driver=False,
        configure_logging=False,
    )
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


def rollout_trajectory(writer: int, k: int):
    return make_trajectory(2, 3, base=1000 * (10 * writer + k), mwid=f"w{writer}k{k}")


@ray.remote(num_cpus=0)
def rollout(store: str, writer: int, count: int, learner) -> None:
    """A rollout task: write to the shared store, send the learner only a notice each."""
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    for k in range(count):
        buffer.add_trajectories([rollout_trajectory(writer, k)])
        buffer.flush()
        (notice,) = commit_notices(buffer, buffer.trajectory_ids[-1:])
        assert len(pickle.dumps(notice)) <= 1024
        ray.get(learner.add_committed.remote([notice]))
    buffer.close()


def test_rollouts_write_the_store_and_a_learner_actor_adds_by_reference(tmp_path):
    store = str(tmp_path / "store")
    learner = remote_buffer(seed=3, sample_window_size=0, auto_save=True, auto_save_path=store)
    ray.get([rollout.remote(store, w, PER_WRITER, learner) for w in range(WRITERS)], timeout=240)
    ids = ray.get(learner.trajectory_ids.remote())
    assert len(ids) == WRITERS * PER_WRITER
    view = open_buffer(store)
    notices = [CommitNotice(store, view.entries[i]) for i in ids]
    # What a buffer that added the same trajectories in notice order draws.
    adding = TrajectoryReplayBuffer(seed=3, sample_window_size=0)
    for notice in notices:
        writer, k = (int(p) for p in notice.entry["model_weights_id"][1:].split("k"))
        adding.add_trajectories([rollout_trajectory(writer, k)])
    got = ray.get(learner.sample.remote(32))
    want = adding.sample(32)
    assert torch.equal(got["rewards"], want["rewards"])
    assert torch.equal(got["curr_obs"]["state"], want["curr_obs"]["state"])
    # The actor's checkpoint holds the referenced trajectories.
    ray.get(learner.save_checkpoint.remote(str(tmp_path / "ckpt")))
    ray.get(learner.close.remote())
    loaded = TrajectoryReplayBuffer(sample_window_size=0)
    loaded.load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded.trajectory_ids == [n.trajectory_id for n in notices]

    # ray.data reads the union of both writers' trajectories, one row per flat sample.
    dataset = read_store(store, keys=["rewards"], override_num_blocks=2)
    rows = dataset.take_all()
    assert len(rows) == WRITERS * PER_WRITER * 2 * 3
    by_id = {}
    for row in rows:
        by_id.setdefault(row["trajectory_id"], {})[row["row"]] = row["rewards"]
    for notice in notices:
        writer, k = (int(p) for p in notice.entry["model_weights_id"][1:].split("k"))
        trajectory = rollout_trajectory(writer, k)
        flat = flatten_trajectory(trajectory, validate(trajectory))["rewards"]
        got_rows = by_id[notice.trajectory_id]
        assert np.array_equal(np.stack([got_rows[i] for i in range(6)]), flat.numpy())


def test_a_buffer_actor_adds_samples_and_checkpoints(tmp_path):
    actor = remote_buffer(seed=5, sample_window_size=0)
    trajectories = [make_trajectory(3, 2, base=100 * k) for k in range(3)]
    assert ray.get(actor.add_trajectories.remote(trajectories)) == 3
    local = TrajectoryReplayBuffer(seed=5, sample_window_size=0)
    local.add_trajectories(trajectories)
    assert torch.equal(ray.get(actor.sample.remote(16))["rewards"], local.sample(16)["rewards"])
    ray.get(actor.save_checkpoint.remote(str(tmp_path / "ckpt")))
    assert ray.get(actor.get_stats.remote())["num_trajectories"] == 3
    fresh = remote_buffer(seed=5, sample_window_size=0)
    assert ray.get(fresh.load_checkpoint.remote(str(tmp_path / "ckpt"))) == 3


def test_actor_owns_the_priorities_and_learners_route_updates_to_it(tmp_path):
    settings = PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)
    options = {"seed": 5, "sample_window_size": 0, "prioritized": settings}
    actor = remote_buffer(**options, auto_save=True, auto_save_path=str(tmp_path / "s"))
    trajectories = [make_trajectory(3, 2, base=100 * k) for k in range(3)]
    ray.get(actor.add_trajectories.remote(trajectories))
    local = TrajectoryReplayBuffer(**options)
    local.add_trajectories(trajectories)

    @ray.remote
    def learner(buffer, rows):
        _, info = ray.get(buffer.sample_with_info.remote(8))
        ray.get(buffer.update_priority.remote(info["index"], torch.full((8,), float(rows))))
        return info["index"]

    # Two learners' updates land on the one owner, in the order it receives them.
    for rows in (1, 2):
        index = ray.get(learner.remote(actor, rows))
        _, want = local.sample(8, return_info=True)
        assert torch.equal(index, want["index"])
        local.update_priority(want["index"], torch.full((8,), float(rows)))
    _, seq_info = ray.get(actor.sample_sequences.remote(4, 2, return_info=True))
    assert torch.equal(
        seq_info["index"], local.sample_sequences(4, 2, return_info=True)[1]["index"]
    )
    ray.get(actor.close.remote())
    resumed = TrajectoryReplayBuffer(**options)
    resumed.load_checkpoint(tmp_path / "s")
    every = torch.tensor([(k << 32) | r for k in range(3) for r in range(6)])
    assert torch.equal(resumed.get_priority(every), local.get_priority(every))
