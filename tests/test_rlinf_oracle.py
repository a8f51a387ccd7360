"""Differential tests: the same trajectories go into RLinf's buffer and into ours.

RLinf's ``TrajectoryReplayBuffer`` (``rlinf==0.3.0``) is the oracle: with the same seed and
settings both must draw the same rows, tensor by tensor, keep the same window and cache,
read each other's checkpoint folders, and feed RLinf's own datasets alike. Where RLinf is
wrong (``docs/behaviour.md``'s fixes) the tests stay inside what it gets right.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_oracle import (
    RLinfBuffer,
    RLinfDataset,
    RLinfPreloadDataset,
    RLinfTrajectoryCache,
    assert_batches_equal,
    rlinf_collate_fn,
    rlinf_copy,
    rlinf_window,
    wait_for_rlinf_files,
)
from torch.utils.data import DataLoader

from rbzarr import (
    PreloadReplayBufferDataset,
    ReplayBufferDataset,
    Trajectory,
    TrajectoryCache,
    TrajectoryReplayBuffer,
    replay_buffer_collate_fn,
)

SEED = 21
Program = list[tuple[str, Any]]

# An add is a list of (steps, B, epochs): trajectories of T = steps * epochs rows.
adds = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 2)), min_size=1, max_size=3
)
programs = st.lists(
    st.one_of(adds.map(lambda a: ("add", a)), st.integers(1, 40).map(lambda n: ("sample", n))),
    min_size=2,
    max_size=8,
)


def trajectories_of(program: Program) -> list[list[Trajectory]]:
    """The trajectories of each add of ``program``; every row of all of them is numbered apart."""
    out, base = [], 0
    for op, arg in program:
        if op == "add":
            call = []
            for steps, B, epochs in arg:
                call.append(make_trajectory(steps * epochs, B, base, epochs))
                base += steps * epochs * B
            out.append(call)
    return out


def run_both(
    program: Program,
    ours: TrajectoryReplayBuffer,
    theirs: RLinfBuffer,
    before_sample: Callable[[RLinfBuffer], None] = lambda buffer: None,
) -> None:
    """Run ``program`` on both buffers; after every step both must agree."""
    calls = iter(trajectories_of(program))
    for step, (op, arg) in enumerate(program):
        if op == "add":
            call = next(calls)
            ours.add_trajectories(call)
            theirs.add_trajectories([rlinf_copy(t) for t in call])
            assert ours._trajectory_id_list == theirs._trajectory_id_list
            assert (len(ours), ours.total_samples) == (len(theirs), theirs.total_samples)
            assert ours.get_stats()["cache_size"] == theirs.get_stats()["cache_size"]
            continue
        method = "sample" if step % 2 else "sample_chunks"
        if len(theirs) == 0:
            for buffer in (ours, theirs):
                with pytest.raises(RuntimeError):
                    getattr(buffer, method)(arg)
            continue
        before_sample(theirs)
        assert_batches_equal(getattr(ours, method)(arg), getattr(theirs, method)(arg), method)


def add_count(program: Program) -> int:
    return sum(len(arg) for op, arg in program if op == "add")


# -- draws ----------------------------------------------------------------------------
@settings(max_examples=8, deadline=None, derandomize=True)
@given(programs, st.sampled_from([0, 1, 2, 3, 100]))
def test_draws_equal_without_auto_save(program, window):
    """The cache is the storage: RLinf sizes it to the window, as we do."""
    theirs = RLinfBuffer(seed=SEED, sample_window_size=rlinf_window(window, add_count(program)))
    with TrajectoryReplayBuffer(seed=SEED, sample_window_size=window) as ours:
        run_both(program, ours, theirs)
    theirs.close()


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    programs,
    st.sampled_from([0, 1, 3, 100]),
    st.sampled_from([(False, 5), (True, 1), (True, 2), (True, 100)]),
    st.sampled_from(["zarr", "pt"]),
)
def test_draws_equal_from_cache_and_storage(program, window, cache, fmt):
    """With auto_save, rows of evicted (or never cached) trajectories come from the files."""
    enable_cache, cache_size = cache
    # Both buffers get the same settings; only where they save differs.
    both = {
        "seed": SEED,
        "enable_cache": enable_cache,
        "cache_size": cache_size,
        "sample_window_size": window,
        "auto_save": True,
    }
    with tempfile.TemporaryDirectory() as folder:
        theirs = RLinfBuffer(**both, auto_save_path=str(Path(folder, "rlinf")))
        with TrajectoryReplayBuffer(
            **both, auto_save_path=Path(folder, "ours"), trajectory_format=fmt
        ) as ours:
            run_both(program, ours, theirs, wait_for_rlinf_files)
        theirs.close()


def test_a_different_seed_draws_differently():
    """The comparison above can fail: RLinf with another seed draws other rows."""
    trajectories = [make_trajectory(4, 3, 0), make_trajectory(2, 2, 12)]
    ours = TrajectoryReplayBuffer(seed=SEED)
    theirs = RLinfBuffer(seed=SEED + 1)
    ours.add_trajectories(trajectories)
    theirs.add_trajectories([rlinf_copy(t) for t in trajectories])
    with pytest.raises(AssertionError):
        assert_batches_equal(ours.sample(16), theirs.sample(16))
    theirs.close()


# -- the window and the cache: the same FIFO --------------------------------------------
cache_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 5), st.integers(1, 4)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=14,
)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.integers(1, 3), cache_ops)
def test_trajectory_cache_is_rlinfs_fifo(max_size, ops):
    ours, theirs = TrajectoryCache(max_size), RLinfTrajectoryCache(max_size)
    flatten = TrajectoryReplayBuffer._flatten_trajectory
    for step, (op, trajectory_id, T) in enumerate(ops):
        if op == "clear":
            ours.clear()
            theirs.clear()
        else:
            flat = flatten(make_trajectory(T, 2, 100 * step))
            ours.put(trajectory_id, flat)
            theirs.put(trajectory_id, flat)
        assert ours.cache == theirs.cache
        for other in range(6):
            got, want = ours.get(other), theirs.get(other)
            assert (got is None) == (want is None), other
            if want is not None:
                assert_batches_equal(got, want, str(other))


@pytest.mark.parametrize("window", [1, 2, 3])
def test_cached_trajectories_are_rlinfs_after_every_add(tmp_path, window):
    """Without auto_save a checkpoint holds the cache: both save the same trajectory files."""
    ours = TrajectoryReplayBuffer(seed=SEED, sample_window_size=window, trajectory_format="pt")
    theirs = RLinfBuffer(seed=SEED, sample_window_size=window)
    for k in range(5):
        traj = make_trajectory(2, 2, 4 * k)
        ours.add_trajectories([traj])
        theirs.add_trajectories([rlinf_copy(traj)])
        ours.save_checkpoint(tmp_path / f"ours-{k}")
        theirs.save_checkpoint(str(tmp_path / f"rlinf-{k}"))
        saved = [
            sorted(p.name for p in (tmp_path / f"{who}-{k}").glob("trajectory_*.pt"))
            for who in ("ours", "rlinf")
        ]
        assert saved[0] == saved[1]
        assert saved[0] == [f"trajectory_{i}_w.pt" for i in range(max(0, k + 1 - window), k + 1)]
    theirs.close()


# -- checkpoint folders, read both ways -------------------------------------------------
TRAJECTORIES = [
    make_trajectory(4, 3, 0, epochs=2),
    make_trajectory(2, 2, 12),
    make_trajectory(3, 1, 16, epochs=3),
    make_trajectory(1, 3, 19),
    make_trajectory(2, 3, 22),
]


def rlinf_checkpoint(folder: Path, fmt: str, auto_save: bool) -> Path:
    """RLinf saves all of ``TRAJECTORIES`` in its ``fmt`` format."""
    theirs = RLinfBuffer(
        seed=SEED,
        sample_window_size=len(TRAJECTORIES),
        auto_save=auto_save,
        auto_save_path=str(folder / "rlinf-run") if auto_save else "",
        trajectory_format=fmt,
    )
    theirs.add_trajectories([rlinf_copy(t) for t in TRAJECTORIES])
    if auto_save:
        wait_for_rlinf_files(theirs)
        theirs.sample(1)  # RLinf copies the window of its last sample()
    theirs.save_checkpoint(str(folder / "ckpt"))
    theirs.close()
    return folder / "ckpt"


def our_checkpoint(folder: Path, fmt: str, auto_save: bool) -> Path:
    """We save all of ``TRAJECTORIES`` in RLinf's ``fmt`` format, before any sample()."""
    with TrajectoryReplayBuffer(
        seed=SEED,
        sample_window_size=len(TRAJECTORIES),
        auto_save=auto_save,
        auto_save_path=folder / "ours-run" if auto_save else "",
        trajectory_format=fmt,
    ) as ours:
        ours.add_trajectories(TRAJECTORIES)
        ours.save_checkpoint(folder / "ckpt")
    return folder / "ckpt"


def assert_loaded_alike(reference: RLinfBuffer, *others: TrajectoryReplayBuffer | RLinfBuffer):
    """Each buffer lists, counts, draws and numbers on as ``reference`` does."""
    for other in others:
        assert other._trajectory_id_list == reference._trajectory_id_list
        assert (len(other), other.total_samples) == (len(reference), reference.total_samples)
        for trajectory_id, want in reference._trajectory_index.items():
            got = other._trajectory_index[trajectory_id]
            for key in ("trajectory_id", "num_samples", "max_episode_length", "model_weights_id"):
                assert got[key] == want[key], (trajectory_id, key)
            assert list(got["shape"]) == list(want["shape"])
    buffers = (reference, *others)
    if len(reference) == 0:
        for buffer in buffers:
            with pytest.raises(RuntimeError):
                buffer.sample(1)
    else:
        for n in (7, 30, 3):
            want = reference.sample(n)
            for other in others:
                assert_batches_equal(other.sample(n), want)
        want = reference.sample_chunks(9)
        for other in others:
            assert_batches_equal(other.sample_chunks(9), want)
    # all continue numbering after the checkpoint's counter (the share's highest id + 1,
    # 0 for an empty share) and draw alike over the new trajectory
    new = make_trajectory(2, 2, 100)
    for buffer in buffers:
        buffer.add_trajectories(
            [new if isinstance(buffer, TrajectoryReplayBuffer) else rlinf_copy(new)]
        )
        assert buffer._trajectory_id_list == reference._trajectory_id_list
    want = reference.sample(20)
    for other in others:
        assert_batches_equal(other.sample(20), want)
    for buffer in buffers:
        buffer.close()


def rlinf_loads(path: Path, **shard: int) -> RLinfBuffer:
    """A fresh RLinf buffer (another seed: the checkpoint's wins) that loaded ``path``."""
    buffer = RLinfBuffer(seed=5, sample_window_size=len(TRAJECTORIES))
    buffer.load_checkpoint(str(path), is_distributed=bool(shard), **shard)
    return buffer


def we_load(path: Path, **shard: int) -> TrajectoryReplayBuffer:
    """A fresh buffer of ours (another seed: the checkpoint's wins) that loaded ``path``."""
    buffer = TrajectoryReplayBuffer(seed=5, sample_window_size=len(TRAJECTORIES))
    buffer.load_checkpoint(path, is_distributed=bool(shard), **shard)
    return buffer


@pytest.mark.parametrize("auto_save", [False, True])
@pytest.mark.parametrize("fmt", ["pt", "pkl"])
@pytest.mark.parametrize("writer", [rlinf_checkpoint, our_checkpoint])
def test_checkpoints_load_alike_whoever_saved_them(tmp_path, writer, fmt, auto_save):
    """The reference is RLinf loading its own checkpoint of the same trajectories."""
    reference = rlinf_loads(rlinf_checkpoint(tmp_path / "reference", fmt, auto_save))
    path = writer(tmp_path / "written", fmt, auto_save)
    assert_loaded_alike(reference, we_load(path), rlinf_loads(path))


@pytest.mark.parametrize("writer", [rlinf_checkpoint, our_checkpoint])
@pytest.mark.parametrize(
    ("local_rank", "world_size"), [(0, 1), (0, 2), (1, 2), (0, 3), (2, 3), (4, 6), (5, 6)]
)
def test_distributed_shares_are_rlinfs(tmp_path, writer, local_rank, world_size):
    shard = {"local_rank": local_rank, "world_size": world_size}
    reference = rlinf_loads(rlinf_checkpoint(tmp_path / "reference", "pt", False), **shard)
    path = writer(tmp_path / "written", "pt", False)
    assert_loaded_alike(reference, we_load(path, **shard), rlinf_loads(path, **shard))


# -- RLinf's datasets and collate function over our buffer ------------------------------
def filled_pair(seed: int, base: int) -> tuple[TrajectoryReplayBuffer, RLinfBuffer]:
    trajectories = [make_trajectory(4, 3, base), make_trajectory(2, 2, base + 12)]
    ours, theirs = TrajectoryReplayBuffer(seed=seed), RLinfBuffer(seed=seed)
    ours.add_trajectories(trajectories)
    theirs.add_trajectories([rlinf_copy(t) for t in trajectories])
    return ours, theirs


def demo_pair(seed: int) -> tuple[TrajectoryReplayBuffer, RLinfBuffer]:
    """Demonstrations lacking ``forward_inputs`` and with an extra ``next_obs`` key."""
    traj = make_trajectory(2, 2, 1000)
    traj.forward_inputs = {}
    traj.next_obs = {"state": traj.next_obs["state"], "only_demo": torch.zeros(2, 2)}
    ours, theirs = TrajectoryReplayBuffer(seed=seed), RLinfBuffer(seed=seed)
    ours.add_trajectories([traj])
    theirs.add_trajectories([rlinf_copy(traj)])
    return ours, theirs


@pytest.mark.parametrize("with_demo", [False, True])
@pytest.mark.parametrize("preload", [False, True])
def test_rlinfs_datasets_over_our_buffer(with_demo, preload):
    """RLinf's dataset over our buffer, RLinf's over RLinf's and ours over ours: one stream."""
    replay = filled_pair(3, 0)
    demo = demo_pair(4) if with_demo else (None, None)
    twin_replay = filled_pair(3, 0)[0]
    twin_demo = demo_pair(4)[0] if with_demo else None
    rlinf_cls, our_cls = (
        (RLinfPreloadDataset, PreloadReplayBufferDataset)
        if preload
        else (RLinfDataset, ReplayBufferDataset)
    )
    datasets = [
        rlinf_cls(replay[0], demo[0], 6, 1, 1),
        rlinf_cls(replay[1], demo[1], 6, 1, 1),
        our_cls(twin_replay, twin_demo, 6, 1, 1),
    ]
    loaders = [
        DataLoader(d, batch_size=1, num_workers=0, collate_fn=collate)
        for d, collate in zip(
            datasets, [rlinf_collate_fn, rlinf_collate_fn, replay_buffer_collate_fn], strict=True
        )
    ]
    iterators = [iter(loader) for loader in loaders]
    for _ in range(3):
        on_ours, on_rlinf, ours_alone = (next(it) for it in iterators)
        assert_batches_equal(on_ours, on_rlinf)
        assert_batches_equal(ours_alone, on_rlinf)
    if preload:  # RLinf's plain dataset drops its buffers in __del__ (a second close fails)
        for dataset in datasets:
            dataset.close()
    else:
        datasets[2].close()
    for buffer in (replay[1], demo[1]):
        if buffer is not None:
            buffer.close()
