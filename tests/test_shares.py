"""Rank shares: RLinf's split formula, per-share counters, and each rank reading only its share."""

from __future__ import annotations

import shutil

import pytest
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import CheckpointNotFoundError, TrajectoryReplayBuffer
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.index.trajectory_index import TrajectoryIndex, share_bounds
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import read_documents

FORMATS = ["zarr", "pt", "pkl"]
T, B = 2, 3


def expected_bounds(count: int, rank: int, world_size: int) -> tuple[int, int]:
    """The formula of docs/behaviour.md (load_checkpoint, distributed), written out."""
    q, r = divmod(count, world_size)
    start = rank * q + min(rank, r)
    return start, start + q + (1 if rank < r else 0)


@pytest.mark.parametrize("world_size", range(1, 8))
def test_share_bounds_formula_disjoint_and_covering(world_size):
    for count in range(10):
        bounds = [share_bounds(count, rank, world_size) for rank in range(world_size)]
        assert bounds == [expected_bounds(count, rank, world_size) for rank in range(world_size)]
        # In order, back to back, from 0 to count: disjoint and covering.
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(bounds[k][1] == bounds[k + 1][0] for k in range(world_size - 1))
        sizes = [end - start for start, end in bounds]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the first count % world_size get one more


def test_share_bounds_examples():
    assert [share_bounds(2, r, 2) for r in range(2)] == [(0, 1), (1, 2)]  # the seed example
    assert [share_bounds(5, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 5)]
    assert [share_bounds(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


@pytest.mark.parametrize(
    ("rank", "world_size", "message"),
    [
        (0, 0, "world_size must be > 0, got 0"),
        (0, -3, "got -3"),
        (-1, 2, r"local_rank must be in \[0, 2\), got -1"),
        (2, 2, r"\[0, 2\), got 2"),
    ],
)
def test_share_bounds_rejects_bad_arguments(rank, world_size, message):
    with pytest.raises(ValueError, match=message):
        share_bounds(5, rank, world_size)


def index_of(ids: list[int], samples: list[int]) -> TrajectoryIndex:
    entries = {i: IndexEntry.new(i, [n, 1], 0, "") for i, n in zip(ids, samples, strict=True)}
    return TrajectoryIndex(entries=entries, id_list=list(ids), trajectory_counter=max(ids) + 10)


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(0, 500), min_size=1, max_size=12, unique=True),
    world_size=st.integers(1, 7),
    data=st.data(),
)
def test_index_shares_partition_the_list_with_their_own_counters(ids, world_size, data):
    samples = data.draw(st.lists(st.integers(1, 9), min_size=len(ids), max_size=len(ids)))
    full = index_of(ids, samples)
    shares = [full.share(rank, world_size) for rank in range(world_size)]
    assert [i for share in shares for i in share.id_list] == ids
    assert sum(share.total_samples for share in shares) == full.total_samples
    for rank, share in enumerate(shares):
        start, end = expected_bounds(len(ids), rank, world_size)
        assert share.id_list == ids[start:end]
        assert sorted(share.entries) == sorted(ids[start:end])
        assert share.total_samples == sum(samples[start:end])
        assert share.trajectory_counter == (max(share.id_list) + 1 if share.id_list else 0)
    assert full.id_list == ids and full.trajectory_counter == max(ids) + 10  # not modified


def saved_checkpoint(path, fmt: str, count: int = 5):
    """A checkpoint of trajectories 0..count-1; trajectory ``i``'s rows encode ``100 * i + row``."""
    buffer = TrajectoryReplayBuffer(seed=1, sample_window_size=0, trajectory_format=fmt)
    for i in range(count):
        buffer.add_trajectories([make_trajectory(T, B, 100 * i, mwid=f"w{i}")])
    buffer.save_checkpoint(path)
    return path


def prune_to_share(source, destination, fmt: str, share: list[int]) -> None:
    """Copy a checkpoint, then delete the data of every trajectory outside ``share``."""
    shutil.copytree(source, destination)
    entries = read_documents(Location.from_url(destination)).trajectory_index["trajectory_index"]
    layout = layout_class(fmt)(Location.from_url(destination))
    for key, entry in entries.items():
        if int(key) not in share:
            layout.delete(entry)
    assert layout.list_ids() == share


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_rank_reads_only_its_share(tmp_path, fmt, world_size):
    full = saved_checkpoint(tmp_path / "full", fmt)
    seen: list[int] = []
    for rank in range(world_size):
        start, end = expected_bounds(5, rank, world_size)
        share = list(range(start, end))
        pruned = tmp_path / f"rank{rank}"
        prune_to_share(full, pruned, fmt, share)
        with pytest.raises(CheckpointNotFoundError):
            TrajectoryReplayBuffer(trajectory_format=fmt).load_checkpoint(pruned)
        buffer = TrajectoryReplayBuffer(seed=3, sample_window_size=0, trajectory_format=fmt)
        buffer.load_checkpoint(pruned, is_distributed=True, local_rank=rank, world_size=world_size)
        assert len(buffer) == len(share)
        assert buffer.total_samples == T * B * len(share)
        assert buffer.trajectory_counter == max(share) + 1
        drawn = set((assert_rows_consistent(buffer.sample(50)) // 100).tolist())
        assert drawn <= set(share)
        buffer.save_checkpoint(tmp_path / f"out{rank}")
        out = read_documents(Location.from_url(tmp_path / f"out{rank}"))
        assert out.trajectory_index["trajectory_id_list"] == share
        assert out.metadata["trajectory_counter"] == max(share) + 1
        seen += share
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rank_share_into_its_own_auto_save_store(tmp_path, fmt):
    full = saved_checkpoint(tmp_path / "full", fmt)
    prune_to_share(full, tmp_path / "rank1", fmt, [3, 4])
    store = tmp_path / "store1"
    with TrajectoryReplayBuffer(
        seed=3,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=store,
        cache_size=1,
        trajectory_format=fmt,
    ) as buffer:
        buffer.load_checkpoint(tmp_path / "rank1", is_distributed=True, local_rank=1, world_size=2)
        drawn = set((assert_rows_consistent(buffer.sample(20)) // 100).tolist())
        assert drawn == {3, 4}
        buffer.add_trajectories([make_trajectory(T, B, 500, mwid="w5")])
    documents = read_documents(Location.from_url(store))
    assert documents.trajectory_index["trajectory_id_list"] == [3, 4, 5]
    assert documents.metadata["trajectory_counter"] == 6
    assert layout_class(fmt)(Location.from_url(store)).list_ids() == [3, 4, 5]


def test_empty_shares(tmp_path):
    full = saved_checkpoint(tmp_path / "full", "zarr", count=2)
    for rank in range(4):
        buffer = TrajectoryReplayBuffer(seed=3, sample_window_size=0)
        buffer.load_checkpoint(full, is_distributed=True, local_rank=rank, world_size=4)
        want = (1, T * B, rank + 1) if rank < 2 else (0, 0, 0)
        assert (len(buffer), buffer.total_samples, buffer.trajectory_counter) == want
        if rank >= 2:
            with pytest.raises(RuntimeError, match="empty buffer"):
                buffer.sample(1)
            # The schema still comes from the checkpoint: a mismatching trajectory is refused.
            bad = make_trajectory(T, B, 0)
            bad.actions = bad.actions[..., :1]
            with pytest.raises(ValueError, match="actions"):
                buffer.add_trajectories([bad])
