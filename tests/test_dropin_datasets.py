"""RLinf's datasets, collate function, PriorityStore and TrajectoryCache, from ``rbzarr``."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import RLINF_BATCH_ORDER, assert_rows_consistent, make_trajectory
from torch.utils.data import DataLoader

from rbzarr import (
    PreloadReplayBufferDataset,
    PriorityStore,
    RbzarrError,
    ReplayBufferDataset,
    Trajectory,
    TrajectoryCache,
    TrajectoryReplayBuffer,
    WorkerProcessError,
    replay_buffer_collate_fn,
)


class WatchedBuffer(TrajectoryReplayBuffer):
    """A real buffer that records its ``is_ready`` calls and the threads that sample it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ready_calls = 0
        self.ready_threads: set[threading.Thread] = set()
        self.asked = threading.Event()
        self.sampling_threads: set[threading.Thread] = set()

    def is_ready(self, min_size: int) -> bool:
        self.ready_calls += 1
        self.ready_threads.add(threading.current_thread())
        if self.ready_calls >= 8:
            self.asked.set()
        return super().is_ready(min_size)

    def sample(self, num_chunks: int):
        self.sampling_threads.add(threading.current_thread())
        return super().sample(num_chunks)


def filled(seed: int, base: int = 0, count: int = 2) -> TrajectoryReplayBuffer:
    buffer = TrajectoryReplayBuffer(seed=seed)
    buffer.add_trajectories([make_trajectory(4, 3, base + 12 * k) for k in range(count)])
    return buffer


def demo_without_forward_inputs(seed: int) -> TrajectoryReplayBuffer:
    demo = TrajectoryReplayBuffer(seed=seed)
    for k in range(2):
        traj = make_trajectory(2, 2, 1000 + 4 * k)
        traj.forward_inputs = {}
        traj.next_obs = {"state": traj.next_obs["state"], "only_demo": torch.zeros(2, 2)}
        demo.add_trajectories([traj])
    return demo


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_replay_only_batches_are_buffer_samples(cls):
    dataset = cls(filled(7), None, batch_size=5, min_replay_buffer_size=2, min_demo_buffer_size=0)
    twin = filled(7)
    batches = iter(dataset)
    for _ in range(4):
        got, want = next(batches), twin.sample(5)
        assert torch.equal(assert_rows_consistent(got), assert_rows_consistent(want))
    dataset.close()


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_demo_batches_take_half_from_each_and_drop_missing_keys(cls):
    dataset = cls(
        replay_buffer=filled(3),
        demo_buffer=demo_without_forward_inputs(4),
        batch_size=7,
        min_replay_buffer_size=1,
        min_demo_buffer_size=2,
    )
    replay_twin, demo_twin = filled(3), demo_without_forward_inputs(4)
    batches = iter(dataset)
    for _ in range(3):
        batch = next(batches)
        replay_part, demo_part = replay_twin.sample(3), demo_twin.sample(3)
        assert list(batch) == RLINF_BATCH_ORDER
        assert list(batch["next_obs"]) == ["state"]
        numbers = assert_rows_consistent({**batch, "forward_inputs": {"tokens": batch["actions"]}})
        assert numbers.shape == (6,)  # 7 // 2 rows from each side, as RLinf
        want = torch.cat([replay_part["prev_logprobs"], demo_part["prev_logprobs"]])
        assert torch.equal(batch["prev_logprobs"], want)
        assert bool((numbers[:3] < 1000).all()) and bool((numbers[3:] >= 1000).all())
    dataset.close()


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_waits_without_spinning_until_both_buffers_are_ready(cls, monkeypatch):
    replay, demo = WatchedBuffer(seed=1), TrajectoryReplayBuffer(seed=2)
    dataset = cls(replay, demo, batch_size=4, min_replay_buffer_size=2, min_demo_buffer_size=1)
    out: list = []
    consumer = threading.Thread(target=lambda: out.append(next(iter(dataset))))
    # The waits between readiness checks, as the thread checking asks for them.
    waits: list[float | None] = []
    real_wait = threading.Event.wait

    def recorded_wait(event: threading.Event, timeout: float | None = None) -> bool:
        if threading.current_thread() in replay.ready_threads:
            waits.append(timeout)
        return real_wait(event, timeout)

    monkeypatch.setattr(threading.Event, "wait", recorded_wait)
    consumer.start()
    assert replay.asked.wait(timeout=60)
    # No busy loop: each of the first seven failed checks is followed by a wait twice as
    # long as the one before (1, 2, ..., 64 ms).
    assert waits[:7] == [0.001 * 2**k for k in range(7)]
    replay.add_trajectories([make_trajectory(2, 2, 0), make_trajectory(2, 2, 4)])
    demo.add_trajectories([make_trajectory(2, 2, 8)])
    consumer.join(timeout=60)
    assert not consumer.is_alive()
    assert_rows_consistent(out[0])
    dataset.close()


def test_preload_samples_on_a_background_thread_and_close_stops_it():
    replay = WatchedBuffer(seed=1)
    replay.add_trajectories([make_trajectory(2, 2, 0)])
    dataset = PreloadReplayBufferDataset(replay, None, 4, 1, 0, prefetch_size=2)
    batches = iter(dataset)
    assert_rows_consistent(next(batches))
    assert replay.sampling_threads and threading.current_thread() not in replay.sampling_threads
    dataset.close()
    assert list(batches) == []
    assert not any(thread.is_alive() for thread in replay.sampling_threads)
    dataset.close()


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_close_ends_an_iterator_still_waiting(cls):
    dataset = cls(TrajectoryReplayBuffer(), None, 4, 1, 0)
    done = threading.Event()

    def consume() -> None:
        assert list(dataset) == []
        done.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    dataset.close()
    consumer.join(timeout=60)
    assert done.is_set()


class BrokenBuffer(TrajectoryReplayBuffer):
    def sample(self, num_chunks: int):
        raise OSError("disk gone")


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_a_closed_dataset_yields_nothing_more(cls):
    dataset = cls(filled(1), None, 4, 1, 0)
    batches = iter(dataset)
    assert_rows_consistent(next(batches))
    dataset.close()
    assert list(batches) == [] and list(dataset) == []


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_sampling_errors_reach_the_consumer(cls):
    broken = cls(BrokenBuffer(), None, 4, 0, 0)
    with pytest.raises(OSError, match="disk gone"):
        next(iter(broken))
    broken.close()


def test_rlinf_dataloader_recipe_and_collate():
    dataset = ReplayBufferDataset(
        replay_buffer=filled(5),
        demo_buffer=None,
        batch_size=6,
        min_replay_buffer_size=1,
        min_demo_buffer_size=0,
        prefetch_size=10,  # RLinf's workers pass it to both classes; ignored here
    )
    loader = DataLoader(
        dataset, batch_size=1, num_workers=0, drop_last=True, collate_fn=replay_buffer_collate_fn
    )
    batches = iter(loader)
    for _ in range(2):
        batch = next(batches)
        assert batch["prev_logprobs"].shape == (6,) and batch["curr_obs"]["state"].shape == (6, 3)
    assert replay_buffer_collate_fn([{"a": 1}, {"b": 2}]) == {"a": 1}


def test_worker_processes_are_refused_with_a_clear_error():
    dataset = ReplayBufferDataset(filled(5), None, 4, 1, 0)
    loader = DataLoader(
        dataset,
        batch_size=1,
        num_workers=1,
        collate_fn=replay_buffer_collate_fn,
        multiprocessing_context="fork",
    )
    with pytest.raises(WorkerProcessError, match="num_workers=0") as info:
        next(iter(loader))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, RbzarrError)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_size must be >= 2 with a demo buffer"):
        ReplayBufferDataset(filled(1), filled(2), 1, 1, 1)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ReplayBufferDataset(filled(1), None, 0, 1, 1)
    with pytest.raises(ValueError, match="prefetch_size must be > 0"):
        PreloadReplayBufferDataset(filled(1), None, 4, 1, 1, prefetch_size=0)


# -- PriorityStore and TrajectoryCache -----------------------------------------------------
def versioned(*versions: float) -> Trajectory:
    return Trajectory(versions=torch.tensor(versions))


def test_priority_store_keeps_the_highest_and_counts_unused_discards():
    store = PriorityStore(maxsize=2)
    a, b, c, d = versioned(1, 1), versioned(2, 2), versioned(3, 3), versioned(2.2, 1.9)
    assert store.add((1, 1.0), a) and store.add((2, 2.0), b)
    assert store.add((3, 3.0), c)  # evicts a, never used
    assert not store.add((1, 5.0), versioned(0))  # below the lowest kept: refused
    assert len(store) == 2
    assert store.topn(1) == [c]
    assert store.add((2, 2.0), d)  # ties with b: the older b goes
    assert store.topn(5) == [c, d] and store.topn(0) == []
    assert store.get_metric() == {3: {"ratio": 0.5}, 2: {"ratio": 0.5}, "discarded_unused": 3}
    store.remove_below(3)  # d was used: not counted
    assert store.topn(2) == [c]
    assert store.get_metric()["discarded_unused"] == 3
    store.remove_below(4)
    assert len(store) == 0 and store.get_metric() == {"discarded_unused": 3}
    with pytest.raises(ValueError, match="maxsize"):
        PriorityStore(0)


def test_trajectory_cache_is_a_fifo_of_flat_trajectories():
    buffer = TrajectoryReplayBuffer()
    flats = [buffer._flatten_trajectory(make_trajectory(2, 2, 4 * k)) for k in range(4)]
    cache = TrajectoryCache(max_size=2)
    assert TrajectoryCache().max_size == 5
    cache.put(0, flats[0])
    cache.put(1, flats[1])
    cache.put(0, flats[2])  # replaced in place: 0 stays the oldest
    assert cache.cache == {0: 0, 1: 1}
    cache.put(3, flats[3])
    assert cache.cache == {1: 1, 3: 0} and cache.get(0) is None
    got = cache.get(3)
    assert got is not None and list(got) == list(flats[3])
    assert torch.equal(got["curr_obs"]["state"], flats[3]["curr_obs"]["state"])
    flats[3]["prev_logprobs"].fill_(-1)  # put copied
    assert torch.equal(got["prev_logprobs"], torch.arange(12, 16, dtype=torch.float64))
    cache.clear()
    assert cache.cache == {} and len(cache) == 0
    with pytest.raises(ValueError, match="no tensor"):
        cache.put(5, {"note": "text"})
