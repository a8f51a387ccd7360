"""ReplayDataset in real DataLoader worker processes: one stream per worker, a live store.

Spawned workers import torch and rbzarr (seconds each): every test here keeps to one
DataLoader of two workers.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from torch.utils.data import DataLoader

from rbzarr import (
    CheckpointNotFoundError,
    EmptyBufferError,
    ReplayDataset,
    TrajectoryReplayBuffer,
    open_buffer,
)
from rbzarr.storage.zarr import remote

# Batches a DataLoader of two workers can hold that were drawn before a given moment: per
# worker the prefetch queue (2), the batch its thread is putting (1) and the one the
# worker holds (1), plus DataLoader's prefetch_factor (2) per worker in flight.
STALE_BATCHES = 2 * (2 + 1 + 1) + 2 * 2


def numbers(batch: dict[str, Any]) -> tuple[int, ...]:
    return tuple(assert_rows_consistent(batch).tolist())


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("context", "seed"), [("fork", 0), ("spawn", None), ("forkserver", 1)])
def test_workers_draw_distinct_batches_and_see_new_commits(tmp_path, context, seed):
    with TrajectoryReplayBuffer(
        seed=0, sample_window_size=1, auto_save=True, auto_save_path=tmp_path / "store"
    ) as buffer:
        buffer.add_trajectories([make_trajectory(8, 8, 0)])
        buffer.flush()
        dataset = ReplayDataset(buffer, batch_size=16, seed=seed, max_staleness=0)
        loader = dataset.data_loader(num_workers=2, multiprocessing_context=context)
        batches = iter(loader)
        before = [numbers(next(batches)) for _ in range(6)]
        assert all(max(rows) < 64 for rows in before)
        # The window holds only the newest trajectory: once a worker re-reads the index
        # after this commit, every row it draws is >= 1000.
        buffer.add_trajectories([make_trajectory(8, 8, 1000)])
        buffer.flush()
        after = [numbers(next(batches)) for _ in range(STALE_BATCHES + 2)]
        del batches
    assert all(len(rows) == 16 for rows in before + after)
    assert len(set(before + after)) == len(before + after), "two batches were the same"
    assert min(after[-1]) >= 1000 and min(after[-2]) >= 1000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_in_memory_buffer_in_workers_is_a_clear_error(context):
    buffer = TrajectoryReplayBuffer(seed=0)
    buffer.add_trajectories([make_trajectory(4, 4, 0)])
    dataset = ReplayDataset(buffer, batch_size=4, seed=0)
    with pytest.raises(ValueError, match="without auto_save"):
        dataset.data_loader(num_workers=2)
    # A hand-made DataLoader fails too, in the worker (fork) or when pickling (spawn).
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    batches = None
    with pytest.raises(ValueError, match="num_workers=0") as caught:
        batches = iter(loader)  # spawn pickles the dataset here
        next(batches)  # fork fails in the workers
    # Left in a reference cycle, DataLoader's iterator takes seconds to shut down.
    caught.value.__traceback__ = None
    del batches, caught
    # The documented way: the prefetch thread in this process.
    batch = next(iter(dataset.data_loader()))
    assert batch["rewards"].shape == (4, 1)


@pytest.mark.timeout(60)
def test_workers_on_a_store_without_commits_say_so(tmp_path):
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
        dataset = ReplayDataset(buffer, batch_size=4, seed=0)
        batches = None
        with pytest.raises(CheckpointNotFoundError, match="no committed trajectory yet") as caught:
            batches = iter(dataset.data_loader(num_workers=1, multiprocessing_context="fork"))
            next(batches)
        caught.value.__traceback__ = None  # see test_in_memory_buffer_in_workers_...
        del batches, caught


def test_data_loader_keeps_the_batch_shape():
    buffer = TrajectoryReplayBuffer(seed=0)
    buffer.add_trajectories([make_trajectory(4, 4, 0)])
    dataset = ReplayDataset(buffer, batch_size=8, num_batches=3, seed=0)
    loader = dataset.data_loader()
    assert loader.batch_size is None
    shapes = [(b["rewards"].shape, b["curr_obs"]["state"].shape) for b in loader]
    assert shapes == [((8, 1), (8, 3))] * 3
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        dataset.data_loader(num_workers=-1)


def test_source_without_generator_cannot_feed_workers():
    class Plain:
        def sample(self, num_chunks: int) -> dict[str, Any]:
            return {"x": torch.zeros(num_chunks)}

    with pytest.raises(ValueError, match="takes no generator"):
        ReplayDataset(Plain(), batch_size=2).data_loader(num_workers=2)


def test_set_epoch_starts_new_streams(tmp_path):
    buffer = TrajectoryReplayBuffer(seed=0)
    buffer.add_trajectories([make_trajectory(16, 16, 0)])
    dataset = ReplayDataset(buffer, batch_size=32, num_batches=1, seed=4)
    first, again = list(dataset), list(dataset)
    dataset.set_epoch(1)
    later = list(dataset)
    assert numbers(first[0]) == numbers(again[0])
    assert numbers(later[0]) != numbers(first[0])


def test_view_pickles_as_a_reopened_store(tmp_path):
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
        buffer.add_trajectories([make_trajectory(4, 4, 0), make_trajectory(4, 4, 100)])
    view = open_buffer(tmp_path / "s", seed=3, sample_window_size=1, refresh_interval=2.5)
    view.sample(5)
    copy = pickle.loads(pickle.dumps(view))
    assert (copy.url, copy.ids, copy.sample_window_size, copy.refresh_interval) == (
        view.url,
        view.ids,
        1,
        2.5,
    )
    assert copy.layout is not view.layout
    # The generator's position travels too: both draw the same next rows.
    assert numbers(copy.sample(7)) == numbers(view.sample(7))


def test_view_refresh_interval(tmp_path):
    path = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buffer:
        buffer.add_trajectories([make_trajectory(4, 4, 0)])
        buffer.flush()
        live = open_buffer(path, sample_window_size=1, refresh_interval=0)
        frozen = open_buffer(path, sample_window_size=1)
        buffer.add_trajectories([make_trajectory(4, 4, 100)])
        buffer.flush()
        assert min(numbers(live.sample(8))) >= 100
        assert max(numbers(frozen.sample(8))) < 100
    with pytest.raises(ValueError, match="refresh_interval must be >= 0"):
        open_buffer(path, refresh_interval=-1)


@pytest.mark.s3
@pytest.mark.timeout(180)
def test_forked_workers_open_s3_stores_after_the_fork(s3_bucket, s3_options):
    url = f"s3://{s3_bucket}/store"
    with TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3_options, cache_size=0
    ) as buffer:
        buffer.add_trajectories([make_trajectory(4, 8, 0), make_trajectory(4, 8, 32)])
        buffer.flush()
        buffer.sample(4)  # this process's S3 clients are in use before the fork
        dataset = ReplayDataset(buffer, batch_size=8, num_batches=4, seed=1)
        loader = dataset.data_loader(num_workers=2, multiprocessing_context="fork")
        got = [numbers(batch) for batch in loader]
    assert len(got) == 4 and len(set(got)) == 4
    assert all(0 <= n < 64 for rows in got for n in rows)


@pytest.mark.timeout(120)
def test_workers_draw_from_the_buffers_window_not_an_earlier_run(tmp_path):
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as earlier:
        earlier.add_trajectories([make_trajectory(8, 8, 0)])
    with TrajectoryReplayBuffer(seed=0, auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([make_trajectory(8, 8, 1000)])
        buffer.flush()
        dataset = ReplayDataset(buffer, batch_size=16, num_batches=4, seed=0)
        in_workers = [numbers(b) for b in dataset.data_loader(num_workers=2)]
        here = [numbers(b) for b in dataset.data_loader(num_workers=0)]
    for rows in in_workers + here:
        assert all(1000 <= n < 1064 for n in rows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_new_buffer_over_an_earlier_run_is_empty_in_workers_too(tmp_path, num_workers):
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as earlier:
        earlier.add_trajectories([make_trajectory(8, 8, 0)])
    with TrajectoryReplayBuffer(seed=0, auto_save=True, auto_save_path=store) as buffer:
        dataset = ReplayDataset(buffer, batch_size=4, num_batches=2, seed=0)
        batches = None
        with pytest.raises(EmptyBufferError) as caught:
            batches = iter(dataset.data_loader(num_workers=num_workers))
            next(batches)
        caught.value.__traceback__ = None
        del batches, caught


@pytest.mark.s3
@pytest.mark.timeout(180)
def test_workers_read_cached_shards_from_the_local_cache(
    s3_proxy, s3_bucket, s3_options, tmp_path, monkeypatch
):
    # Shards kept out of the group documents: each is an object a worker would GET.
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)
    url = f"s3://{s3_bucket}/store"
    with TrajectoryReplayBuffer(
        seed=0,
        cache_size=0,
        enable_cache=False,
        auto_save=True,
        auto_save_path=url,
        storage_options=s3_options,
        local_cache_dir=tmp_path / "cache",
    ) as buffer:
        buffer.add_trajectories([make_trajectory(4, 8, 0), make_trajectory(4, 8, 32)])
        buffer.flush()  # written through to the cache
        s3_proxy.reset_log()
        dataset = ReplayDataset(buffer, batch_size=8, num_batches=4, seed=1)
        loader = dataset.data_loader(num_workers=2, multiprocessing_context="fork")
        got = [numbers(batch) for batch in loader]
    assert all(0 <= n < 64 for rows in got for n in rows)
    # Listings (GET of the bucket) and the index documents; no object of a trajectory.
    gets = [r.key for r in s3_proxy.requests if r.method == "GET"]
    assert [key for key in gets if "/trajectories/" in key] == []
    assert gets
