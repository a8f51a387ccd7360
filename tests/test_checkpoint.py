"""Checkpoints follow the seed: what is saved, what a (sharded) load restores, and errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_rows_consistent, assert_same_trajectory, make_trajectory

from rbzarr import (
    CheckpointNotFoundError,
    StoreExistsError,
    Trajectory,
    TrajectoryReplayBuffer,
    WriterFailedError,
)
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.trajectory import tree

FORMATS = ["zarr", "pt", "pkl"]
T, B = 2, 3
ROWS = T * B


def traj(i: int) -> Trajectory:
    """Trajectory ``i``: its rows encode ``100 * i + row``."""
    return make_trajectory(T, B, 100 * i, mwid=f"w{i}")


def fill(buffer: TrajectoryReplayBuffer, ids) -> None:
    for i in ids:
        buffer.add_trajectories([traj(i)])


def saving(store: Any, fmt: str | None = None, **options: Any) -> TrajectoryReplayBuffer:
    """A buffer saving to ``store`` in ``fmt`` (seed 1, every trajectory in its window
    unless ``options`` say otherwise)."""
    defaults: dict[str, Any] = {"seed": 1, "sample_window_size": 0}
    return TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, trajectory_format=fmt, **{**defaults, **options}
    )


def saved_in_place(store: Path, fmt: str) -> None:
    """Trajectories 0-2 saved to ``store`` by a closed :func:`saving` buffer."""
    with saving(store, fmt) as first:
        fill(first, range(3))


def state(buffer: TrajectoryReplayBuffer) -> tuple[int, int, int]:
    return len(buffer), buffer.total_samples, buffer.trajectory_counter


def documents(url) -> Documents:
    return read_store_documents(Location.from_url(url))


def layout(url, fmt: str) -> TrajectoryLayout:
    return layout_class(fmt)(Location.from_url(url))


def sources(batch: dict) -> set[int]:
    """Which trajectories (by ``traj`` number) the rows of ``batch`` come from."""
    return set((assert_rows_consistent(batch) // 100).tolist())


def assert_batches_equal(got: dict, want: dict) -> None:
    got_flat, want_flat = tree.flatten(got), tree.flatten(want)
    assert list(got_flat) == list(want_flat)
    for key, value in want_flat.items():
        assert got_flat[key].dtype == value.dtype, key
        assert torch.equal(got_flat[key], value), key


def assert_checkpoint(url, fmt: str, ids: list[int], counter: int) -> None:
    """The checkpoint at ``url`` lists exactly ``ids`` and holds their data, nothing else."""
    docs = documents(url)
    assert docs.trajectory_index["trajectory_id_list"] == ids
    assert sorted(docs.trajectory_index["trajectory_index"], key=int) == [str(i) for i in ids]
    assert docs.metadata["trajectory_format"] == fmt
    assert docs.metadata["size"] == len(ids)
    assert docs.metadata["total_samples"] == ROWS * len(ids)
    assert docs.metadata["trajectory_counter"] == counter
    assert layout(url, fmt).list_ids() == sorted(ids)
    for i in ids:
        entry = docs.trajectory_index["trajectory_index"][str(i)]
        assert entry["trajectory_id"] == i and entry["shape"][:2] == [T, B]
        assert_same_trajectory(layout(url, fmt).read(entry), traj(i))


# -- the seed example ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_example(tmp_path, fmt):
    ckpt, again = tmp_path / "ckpt", tmp_path / "again"
    buffer = TrajectoryReplayBuffer(seed=11, sample_window_size=2, trajectory_format=fmt)
    twin = TrajectoryReplayBuffer(seed=11, sample_window_size=2, trajectory_format=fmt)
    for b in (buffer, twin):
        fill(b, range(5))
        b.sample(3)  # move the generator off its seed
    before = state(buffer)
    buffer.save_checkpoint(ckpt)
    # Saving changes nothing, the sampler's position included.
    assert state(buffer) == before == state(twin)
    assert_batches_equal(buffer.sample(17), twin.sample(17))

    assert_checkpoint(ckpt, fmt, [3, 4], counter=5)

    for rank, tid in enumerate([3, 4]):
        shard = TrajectoryReplayBuffer(seed=1, sample_window_size=2, trajectory_format=fmt)
        shard.load_checkpoint(ckpt, is_distributed=True, local_rank=rank, world_size=2)
        assert state(shard) == (1, ROWS, tid + 1)
        assert sources(shard.sample(20)) == {tid}

    full = TrajectoryReplayBuffer(seed=1, sample_window_size=2, trajectory_format=fmt)
    full.load_checkpoint(ckpt)
    assert state(full) == (2, 2 * ROWS, 5)
    full.add_trajectories([traj(5)])
    assert state(full) == (3, 3 * ROWS, 6)
    full.save_checkpoint(again)
    assert_checkpoint(again, fmt, [4, 5], counter=6)


@pytest.mark.parametrize("auto_save", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
def test_full_load_restores_the_sampler(tmp_path, fmt, auto_save):
    options = {"auto_save": True, "auto_save_path": tmp_path / "store", "cache_size": 2}
    with TrajectoryReplayBuffer(
        seed=7, sample_window_size=4, trajectory_format=fmt, **(options if auto_save else {})
    ) as buffer:
        fill(buffer, range(5))
        buffer.sample(5)
        buffer.sample(9)
        buffer.save_checkpoint(tmp_path / "ckpt")
        loaded = TrajectoryReplayBuffer(seed=999, sample_window_size=4, trajectory_format=fmt)
        loaded.load_checkpoint(tmp_path / "ckpt")
        assert loaded.seed == 7
        for n in (13, 24):
            want = buffer.sample(n)
            assert_batches_equal(loaded.sample(n), want)
            assert sources(want) <= {1, 2, 3, 4}


# -- auto_save ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("window", "expected"),
    [(2, [3, 4]), (0, [0, 1, 2, 3, 4]), (10, [0, 1, 2, 3, 4])],
    ids=["window<list", "window=0", "list<window"],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_save_checkpoint_holds_the_window(tmp_path, fmt, window, expected):
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    with saving(store, fmt, seed=3, sample_window_size=window, cache_size=1) as buffer:
        fill(buffer, range(5))
        # No sample() before: the window is taken at save time.  A zarr store's default
        # checkpoint is a manifest (tests/test_checkpoint_manifest.py): here the copy.
        buffer.save_checkpoint(ckpt, copy=True)
        assert state(buffer) == (5, 5 * ROWS, 5)
    assert_checkpoint(ckpt, fmt, expected, counter=5)
    # Older trajectories stay in the auto-save store.
    assert_checkpoint(store, fmt, [0, 1, 2, 3, 4], counter=5)


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_save_store_is_a_checkpoint(tmp_path, memory_url, fmt, where):
    store = tmp_path / "store" if where == "local" else f"{memory_url}/store"
    with saving(store, fmt, seed=5) as writer:
        fill(writer, range(4))
    loaded = TrajectoryReplayBuffer(seed=0, sample_window_size=0, trajectory_format=fmt)
    loaded.load_checkpoint(store)
    reference = TrajectoryReplayBuffer(seed=5, sample_window_size=0, trajectory_format=fmt)
    fill(reference, range(4))
    assert state(loaded) == state(reference) == (4, 4 * ROWS, 4)
    assert_batches_equal(loaded.sample(30), reference.sample(30))


@pytest.mark.parametrize("fmt", FORMATS)
def test_continue_in_place_and_refuse_foreign_store(tmp_path, fmt):
    store = tmp_path / "store"
    saved_in_place(store, fmt)
    with saving(store, fmt) as second:
        second.load_checkpoint(store)
        assert state(second) == (3, 3 * ROWS, 3)
        fill(second, range(3, 5))
        second.flush()
        assert state(second) == (5, 5 * ROWS, 5)
        assert_checkpoint(store, fmt, [0, 1, 2, 3, 4], counter=5)

    # Re-running the collection on the same folder, without loading, appends too.
    data = {
        p: p.read_bytes()
        for p in store.rglob("*")
        if p.is_file() and "index" not in p.relative_to(store).parts  # the index log
    }
    with saving(store, fmt) as rerun:
        assert state(rerun) == (0, 0, 5)
        fill(rerun, [9])
    assert_checkpoint_prefix(store, fmt, [0, 1, 2, 3, 4, 5], counter=6)
    for path, content in data.items():
        if path.name not in ("metadata.json", "trajectory_index.json", "zarr.json"):
            assert path.read_bytes() == content, path


def assert_checkpoint_prefix(url, fmt: str, ids: list[int], counter: int) -> None:
    """Like :func:`assert_checkpoint` where the last id holds ``traj(9)``."""
    docs = documents(url)
    assert docs.trajectory_index["trajectory_id_list"] == ids
    assert docs.metadata["trajectory_counter"] == counter
    assert layout(url, fmt).list_ids() == sorted(ids)
    for i in ids:
        entry = docs.trajectory_index["trajectory_index"][str(i)]
        want = traj(9) if i == ids[-1] else traj(i)
        assert_same_trajectory(layout(url, fmt).read(entry), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_into_a_new_auto_save_store(tmp_path, fmt):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    origin = TrajectoryReplayBuffer(seed=2, sample_window_size=3, trajectory_format=fmt)
    fill(origin, range(3))
    origin.save_checkpoint(a)
    with saving(b, fmt, seed=2, sample_window_size=4, cache_size=1) as resumed:
        resumed.load_checkpoint(a)
        fill(resumed, range(3, 5))
        assert state(resumed) == (5, 5 * ROWS, 5)
        resumed.save_checkpoint(c, copy=True)
    # The resumed trajectories 1 and 2 are in the window, so the checkpoint holds them.
    assert_checkpoint(c, fmt, [1, 2, 3, 4], counter=5)
    assert_checkpoint(b, fmt, [0, 1, 2, 3, 4], counter=5)
    loaded = TrajectoryReplayBuffer(seed=0, sample_window_size=0, trajectory_format=fmt)
    loaded.load_checkpoint(c)
    assert sources(loaded.sample(24)) <= {1, 2, 3, 4}


# -- round trip --------------------------------------------------------------------------------
def rich_trajectory(i: int) -> Trajectory:
    """Two epochs (reset rows in dones/terminations/truncations), bool and bfloat16 fields."""
    t = make_trajectory(4, 2, 100 * i, epochs=2, mwid=f"m{i}")
    n = torch.arange(8).reshape(4, 2) + i
    t.intervene_flags = (n % 3 == 0).unsqueeze(-1)
    t.prev_values = (n.to(torch.bfloat16) / 7).unsqueeze(-1)
    t.terminations = (torch.arange(12).reshape(6, 2) % 2 == 1) ^ bool(i % 2)
    t.truncations = torch.zeros(6, 2, dtype=torch.bool)
    t.curr_obs["image"] = (n.reshape(4, 2, 1, 1) * 3 + torch.arange(4).reshape(1, 1, 2, 2)).to(
        torch.uint8
    )
    return t


@pytest.mark.parametrize("auto_save", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_preserves_shapes_dtypes_and_reset_rows(tmp_path, fmt, auto_save):
    inputs = [rich_trajectory(i) for i in range(3)]
    options = {"auto_save": True, "auto_save_path": tmp_path / "store"} if auto_save else {}
    with TrajectoryReplayBuffer(
        seed=1, sample_window_size=0, trajectory_format=fmt, **options
    ) as buffer:
        buffer.add_trajectories(inputs)
        buffer.save_checkpoint(tmp_path / "ckpt", copy=True)
    loaded = TrajectoryReplayBuffer(seed=1, sample_window_size=0, trajectory_format=fmt)
    loaded.load_checkpoint(tmp_path / "ckpt")
    loaded.save_checkpoint(tmp_path / "again")  # from the warmed cache
    for url in (tmp_path / "ckpt", tmp_path / "again"):
        entries = documents(url).trajectory_index["trajectory_index"]
        assert sorted(entries, key=int) == ["0", "1", "2"]
        for i, want in enumerate(inputs):
            got = layout(url, fmt).read(entries[str(i)])
            assert_same_trajectory(got, want)
            assert got.dones.shape == (6, 2, 1) and got.prev_values.dtype == torch.bfloat16


# -- errors ------------------------------------------------------------------------------------
@pytest.fixture
def target_and_twin():
    """A non-empty buffer to load into, and an identical one that never loads."""
    buffers = [TrajectoryReplayBuffer(seed=4, sample_window_size=0) for _ in range(2)]
    for b in buffers:
        fill(b, [7, 8])
    return buffers


def assert_unchanged(target: TrajectoryReplayBuffer, twin: TrajectoryReplayBuffer) -> None:
    assert state(target) == state(twin) == (2, 2 * ROWS, 2)
    assert_batches_equal(target.sample(5), twin.sample(5))


def saved_checkpoint(tmp_path, fmt: str):
    ckpt = tmp_path / "ckpt"
    buffer = TrajectoryReplayBuffer(seed=1, sample_window_size=2, trajectory_format=fmt)
    fill(buffer, range(5))
    buffer.save_checkpoint(ckpt)
    return ckpt


@pytest.mark.parametrize("name", ["metadata.json", "trajectory_index.json"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_document(tmp_path, fmt, name, target_and_twin):
    target, twin = target_and_twin
    ckpt = saved_checkpoint(tmp_path, fmt)
    (ckpt / name).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(name)):
        target.load_checkpoint(ckpt)
    assert_unchanged(target, twin)
    with pytest.raises(FileNotFoundError, match=r"metadata\.json"):
        target.load_checkpoint(tmp_path / "nowhere")
    assert_unchanged(target, twin)


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_trajectory_data(tmp_path, fmt, target_and_twin):
    target, twin = target_and_twin
    ckpt = saved_checkpoint(tmp_path, fmt)
    entry = documents(ckpt).trajectory_index["trajectory_index"]["4"]
    layout(ckpt, fmt).delete(entry)
    with pytest.raises(CheckpointNotFoundError, match=r"\[4\]"):
        target.load_checkpoint(ckpt)
    assert_unchanged(target, twin)
    # Rank 0 owns only trajectory 3, whose data is there.
    target.load_checkpoint(ckpt, is_distributed=True, local_rank=0, world_size=2)
    assert state(target) == (1, ROWS, 4)


@pytest.mark.parametrize(
    ("rank", "world_size", "message"),
    [(0, 0, "world_size must be > 0, got 0"), (-1, 2, r"\[0, 2\), got -1"), (2, 2, "got 2")],
)
def test_bad_rank_arguments(tmp_path, target_and_twin, rank, world_size, message):
    target, twin = target_and_twin
    ckpt = saved_checkpoint(tmp_path, "zarr")
    with pytest.raises(ValueError, match=message):
        target.load_checkpoint(ckpt, is_distributed=True, local_rank=rank, world_size=world_size)
    assert_unchanged(target, twin)


def test_failed_adoption_leaves_the_buffer_unchanged(tmp_path):
    """Loading a checkpoint whose ids the auto-save store holds for other data is refused
    whole; one whose ids are free is appended to the store, which keeps its own data."""
    foreign = tmp_path / "foreign"
    with saving(foreign, seed=2, sample_window_size=2) as other:
        fill(other, range(5))
    snapshot = documents(foreign)
    clashing = saved_checkpoint(tmp_path, "zarr")  # ids 3 and 4, other uuids
    with saving(foreign, seed=4) as target:
        with pytest.raises(StoreExistsError, match=r"ids \[3, 4\].*new auto_save_path"):
            target.load_checkpoint(clashing)
        assert state(target) == (0, 0, 5)
        with pytest.raises(RuntimeError, match="empty buffer"):
            target.sample(1)
        target.save_checkpoint(tmp_path / "empty", copy=True)
        assert documents(tmp_path / "empty").trajectory_index["trajectory_id_list"] == []
        target.load_checkpoint(foreign)
        target.add_trajectories([traj(10)])
        target.flush()
    assert documents(foreign).trajectory_index["trajectory_id_list"] == [0, 1, 2, 3, 4, 5]
    assert snapshot.trajectory_index["trajectory_id_list"] == [0, 1, 2, 3, 4]


def test_distributed_load_cannot_continue_in_place(tmp_path):
    """A rank's counter is max(share) + 1: appending to the shared store would overwrite."""
    store = tmp_path / "store"
    options = {"sample_window_size": 0, "auto_save": True, "auto_save_path": store}
    with TrajectoryReplayBuffer(**options) as writer:
        fill(writer, range(4))
    with TrajectoryReplayBuffer(**options) as rank0:
        with pytest.raises(ValueError, match="own auto_save_path"):
            rank0.load_checkpoint(store, is_distributed=True, local_rank=0, world_size=2)
        assert state(rank0) == (0, 0, 4)  # built on the store: new ids follow its ids
        # The last rank's share is not the whole list either.
        with pytest.raises(ValueError, match="own auto_save_path"):
            rank0.load_checkpoint(store, is_distributed=True, local_rank=1, world_size=2)
        # One rank of one owns everything: that is a full load, in place.
        rank0.load_checkpoint(store, is_distributed=True, local_rank=0, world_size=1)
        fill(rank0, [4])
    assert_checkpoint(store, "zarr", [0, 1, 2, 3, 4], counter=5)


# -- RLinf checkpoints and other formats -------------------------------------------------------
def strip_to_rlinf(url) -> None:
    """Drop the metadata keys only rbzarr writes (schema, sampler state, version)."""
    path = Path(url) / "metadata.json"
    metadata = json.loads(path.read_text())
    for key in ("schema", "sampler", "rbzarr_format_version"):
        metadata.pop(key)
    path.write_text(json.dumps(metadata))


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_rlinf_checkpoint_without_schema_into_a_cacheless_buffer(tmp_path, fmt):
    ckpt = saved_checkpoint(tmp_path, fmt)
    strip_to_rlinf(ckpt)
    with saving(tmp_path / "store", fmt, enable_cache=False) as buffer:
        buffer.load_checkpoint(ckpt)
        assert state(buffer) == (2, 2 * ROWS, 5)
        # Every row is read from storage; the schema was learnt from the data.
        assert sources(buffer.sample(12)) == {3, 4}
        with pytest.raises(ValueError, match="rewards"):
            buffer.add_trajectories([_other_schema()])
        fill(buffer, [5])
    assert_checkpoint(tmp_path / "store", fmt, [3, 4, 5], counter=6)


def _other_schema() -> Trajectory:
    t = traj(9)
    t.rewards = t.rewards.to(torch.float32)
    return t


@pytest.mark.parametrize("source_fmt", FORMATS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_load_a_checkpoint_of_another_format(tmp_path, source_fmt, fmt):
    ckpt = saved_checkpoint(tmp_path, source_fmt)
    with saving(tmp_path / "store", fmt, cache_size=1) as buffer:
        buffer.load_checkpoint(ckpt)
        assert sources(buffer.sample(12)) == {3, 4}
        buffer.save_checkpoint(tmp_path / "out", copy=True)
    assert_checkpoint(tmp_path / "store", fmt, [3, 4], counter=5)
    assert_checkpoint(tmp_path / "out", fmt, [3, 4], counter=5)


def obstacle(store: Path, fmt: str, trajectory_id: int) -> Path:
    """A user's file exactly where trajectory ``trajectory_id`` would be written: the write
    fails (even as root) until the file is removed."""
    if fmt == "zarr":
        path = store / "trajectories" / str(trajectory_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("in the way")
    else:
        path = store / f"trajectory_{trajectory_id}_w{trajectory_id}.{fmt}"
        path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_save_while_a_write_is_in_flight(tmp_path, fmt):
    """A trajectory whose write has not completed is saved from memory, whole."""
    with saving(tmp_path / "store", fmt) as buffer:
        fill(buffer, range(2))
        buffer.flush()
        blocker = obstacle(tmp_path / "store", fmt, 2)
        fill(buffer, [2])
        with pytest.raises(WriterFailedError, match=r"1 write\(s\) to .* not committed"):
            buffer.flush(timeout=0.2)
        buffer.save_checkpoint(tmp_path / "ckpt", copy=True)
        if blocker.is_dir():
            blocker.rmdir()
        else:
            blocker.unlink()
    assert_checkpoint(tmp_path / "ckpt", fmt, [0, 1, 2], counter=3)
    assert_checkpoint(tmp_path / "store", fmt, [0, 1, 2], counter=3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_counter_behind_the_index_never_reuses_an_id(tmp_path, fmt):
    """A writer killed between the index and the metadata leaves an old counter behind."""
    store = tmp_path / "store"
    saved_in_place(store, fmt)
    metadata = json.loads((store / "metadata.json").read_text())
    metadata.update(size=2, total_samples=2 * ROWS, trajectory_counter=2)
    (store / "metadata.json").write_text(json.dumps(metadata))
    with saving(store, fmt) as second:
        second.load_checkpoint(store)
        assert state(second) == (3, 3 * ROWS, 3)
        fill(second, [3])
    assert_checkpoint(store, fmt, [0, 1, 2, 3], counter=4)


def test_save_never_overwrites_an_existing_store(tmp_path):
    buffer = TrajectoryReplayBuffer(sample_window_size=2)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.save_checkpoint(tmp_path / "ckpt")
    before = sorted(p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    buffer.add_trajectories([make_trajectory(2, 2, 4)])
    with pytest.raises(StoreExistsError, match="already holds a store"):
        buffer.save_checkpoint(tmp_path / "ckpt")
    after = sorted(p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    assert before == after


def test_load_refuses_to_orphan_the_buffers_own_trajectories(tmp_path):
    source = TrajectoryReplayBuffer(sample_window_size=2)
    source.add_trajectories([make_trajectory(2, 2, 0)])
    source.save_checkpoint(tmp_path / "ckpt")
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "auto")
    buffer.add_trajectories([make_trajectory(2, 2, 100)])
    buffer.flush()
    with pytest.raises(StoreExistsError, match=r"other trajectories with the ids \[0\]"):
        buffer.load_checkpoint(tmp_path / "ckpt")
    assert len(buffer) == 1 and buffer.trajectory_counter == 1
    # clear() keeps the store's data, so the clash remains; a fresh store takes the load.
    buffer.clear()
    with pytest.raises(StoreExistsError, match="new auto_save_path"):
        buffer.load_checkpoint(tmp_path / "ckpt")
    buffer.close()
    assert documents(tmp_path / "auto").trajectory_index["trajectory_id_list"] == [0]
    fresh = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "fresh")
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert len(fresh) == 1
    fresh.close()
