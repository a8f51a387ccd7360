"""The buffer's contract outside sampling parity: validation, fixes, writer, concurrency."""

from __future__ import annotations

import gc
import json
import threading

import pytest
import torch
import zarr
from conftest import assert_rows_consistent, assert_same_trajectory, make_trajectory

from rbzarr import (
    BufferClosedError,
    InvalidTrajectoryError,
    StoreExistsError,
    Trajectory,
    TrajectoryReplayBuffer,
)
from rbzarr.buffer.cache import RowCache
from rbzarr.buffer.commits import StoreCommitter
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class, open_store
from rbzarr.trajectory.validated import ValidatedTrajectory, clone_trajectory


def state(buffer: TrajectoryReplayBuffer) -> tuple:
    return (len(buffer), buffer.total_samples, buffer.trajectory_counter, buffer.get_stats())


def test_unknown_format_and_missing_path_are_clear_errors():
    with pytest.raises(ValueError, match="unknown trajectory_format 'h5'"):
        TrajectoryReplayBuffer(trajectory_format="h5")
    with pytest.raises(ValueError, match="requires auto_save_path"):
        TrajectoryReplayBuffer(auto_save=True)


def test_no_cache_without_auto_save_still_keeps_data():
    buffer = TrajectoryReplayBuffer(enable_cache=False, sample_window_size=3)
    buffer.add_trajectories([make_trajectory(2, 2, 0), make_trajectory(2, 2, 4)])
    numbers = assert_rows_consistent(buffer.sample(32))
    assert set(numbers.tolist()) <= set(range(8))


def test_window_zero_without_auto_save_keeps_everything():
    buffer = TrajectoryReplayBuffer(sample_window_size=0, seed=4)
    for k in range(12):
        buffer.add_trajectories([make_trajectory(1, 1, k)])
    assert buffer.get_stats()["cache_size"] == 12
    seen = set()
    for _ in range(40):
        seen |= set(assert_rows_consistent(buffer.sample(12)).tolist())
    assert seen == set(range(12))


def test_bad_trajectory_in_a_call_changes_nothing(tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s", seed=1)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.flush()
    before = state(buffer)
    files_before = sorted(p.name for p in (tmp_path / "s" / "trajectories").iterdir())
    bad = make_trajectory(2, 2, 100)
    bad.actions = torch.zeros(3, 2, 2, dtype=torch.int64)
    with pytest.raises(InvalidTrajectoryError, match=r"trajectory 1 of this call: field 'actions'"):
        buffer.add_trajectories([make_trajectory(2, 2, 4), bad])
    buffer.flush()
    assert state(buffer) == before
    assert sorted(p.name for p in (tmp_path / "s" / "trajectories").iterdir()) == files_before
    wrong_dtype = make_trajectory(2, 2, 4)
    wrong_dtype.curr_obs["state"] = wrong_dtype.curr_obs["state"].float()
    with pytest.raises(ValueError, match="field 'curr_obs/state': expected dtype float64"):
        buffer.add_trajectories([wrong_dtype])
    with pytest.raises(ValueError, match="no samples"):
        buffer.add_trajectories([Trajectory(actions=torch.zeros(2, 2))])
    assert state(buffer) == before
    buffer.close()


@pytest.mark.parametrize(
    ("argument", "kind"),
    [
        (make_trajectory(2, 2, 8), "Trajectory"),
        ("trajectories", "str"),
        ({"actions": torch.zeros(2, 2)}, "dict"),
        (None, "NoneType"),
    ],
)
def test_a_call_without_a_list_is_refused_and_changes_nothing(tmp_path, argument, kind):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s", seed=1)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.flush()
    before = state(buffer)
    message = rf"takes a list of trajectories, got {kind}: pass \[trajectory\] to add one"
    with pytest.raises(InvalidTrajectoryError, match=message) as info:
        buffer.add_trajectories(argument)
    assert isinstance(info.value, TypeError)  # what RLinf raises for it
    buffer.flush()
    assert state(buffer) == before
    buffer.add_trajectories(iter([make_trajectory(2, 2, 4)]))  # any other iterable is fine
    assert len(buffer) == 2
    buffer.close()


def test_caller_may_mutate_tensors_after_add(tmp_path):
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", enable_cache=False, seed=0
    )
    traj = make_trajectory(3, 2, 0)
    buffer.add_trajectories([traj])
    for tensor in traj.tensors().values():
        tensor.fill_(77)
    buffer.flush()
    assert set(assert_rows_consistent(buffer.sample(64)).tolist()) <= set(range(6))
    buffer.close()


@pytest.mark.parametrize("auto_save", [False, True])
def test_a_sparse_field_is_refused_before_anything_changes(tmp_path, auto_save):
    options = {"auto_save_path": tmp_path / "s"} if auto_save else {}
    buffer = TrajectoryReplayBuffer(auto_save=auto_save, seed=1, **options)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.flush()
    before = state(buffer)
    sparse = make_trajectory(2, 2, 4)
    sparse.rewards = sparse.rewards.to_sparse()
    message = r"trajectory 1 of this call: field 'rewards': expected a dense \(strided\) tensor"
    with pytest.raises(InvalidTrajectoryError, match=message):
        buffer.add_trajectories([make_trajectory(2, 2, 8), sparse])
    buffer.flush()
    assert state(buffer) == before
    buffer.close()


def test_the_cache_shares_the_writers_copy_not_the_callers_tensors(tmp_path):
    """One copy per add: the cache takes its rows from the writer's copy, never from the
    caller's tensors, and holds them itself once the write committed."""
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", cache_size=2, sample_window_size=2, seed=3
    )
    added = [make_trajectory(3, 2, 0), make_trajectory(3, 2, 6)]
    kept = [clone_trajectory(t) for t in added]
    buffer.add_trajectories(added)
    for trajectory in added:
        for tensor in trajectory.tensors().values():
            tensor.fill_(77)
    assert set(assert_rows_consistent(buffer.sample(64)).tolist()) <= set(range(12))
    buffer.flush()
    assert buffer.get_stats()["cache_bytes"] > 0  # copied into the slots (commit or read)
    seen: set[int] = set()
    for _ in range(10):
        seen |= set(assert_rows_consistent(buffer.sample(64)).tolist())
    assert seen == set(range(12))
    layout, documents = open_store(tmp_path / "s")
    entries = documents.trajectory_index["trajectory_index"]
    for trajectory_id, want in enumerate(kept):
        assert_same_trajectory(buffer.trajectory(trajectory_id), want)
        assert_same_trajectory(layout.read(entries[str(trajectory_id)]), want)
    buffer.close()


def test_trajectories_evicted_before_their_write_commits_are_still_sampled(tmp_path):
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", cache_size=1, sample_window_size=3, seed=5
    )
    # One call: the first two leave the cache before any of the three is written.
    buffer.add_trajectories([make_trajectory(2, 3, 6 * k) for k in range(3)])
    seen: set[int] = set()
    for _ in range(10):
        seen |= set(assert_rows_consistent(buffer.sample(64)).tolist())
    buffer.flush()
    for _ in range(10):
        seen |= set(assert_rows_consistent(buffer.sample(64)).tolist())
    assert seen == set(range(18))
    assert buffer.get_stats()["cache_size"] == 1
    buffer.close()


def test_close_is_idempotent_and_final(tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s")
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.close()
    buffer.close()
    with pytest.raises(BufferClosedError):
        buffer.add_trajectories([make_trajectory(2, 2, 0)])
    assert json.loads((tmp_path / "s" / "trajectory_index.json").read_text())[
        "trajectory_id_list"
    ] == [0]


def test_auto_save_appends_to_an_existing_store(tmp_path):
    """Re-running a collection script on the same folder appends; nothing is overwritten."""
    first = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s")
    first.add_trajectories([make_trajectory(2, 2, 0)])
    first.close()
    before = {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()}
    second = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s")
    assert (len(second), second.trajectory_counter) == (0, 1)
    second.add_trajectories([make_trajectory(2, 2, 4)])
    second.close()
    index = json.loads((tmp_path / "s" / "trajectory_index.json").read_text())
    assert index["trajectory_id_list"] == [0, 1]
    for path, data in before.items():
        # The documents and the index log (index/) are rewritten; no trajectory's data is.
        index_file = "index" in path.relative_to(tmp_path / "s").parts
        if not index_file and path.name not in (
            "trajectory_index.json",
            "metadata.json",
            "zarr.json",
        ):
            assert path.read_bytes() == data, path
    assert (tmp_path / "s" / "trajectories" / "0" / "zarr.json").read_bytes() == before[
        tmp_path / "s" / "trajectories" / "0" / "zarr.json"
    ]


def test_construction_refuses_what_it_cannot_append_to(tmp_path):
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "pt", trajectory_format="pt"
    ) as first:
        first.add_trajectories([make_trajectory(2, 2, 0)])
    listing = sorted(str(p) for p in (tmp_path / "pt").rglob("*"))
    with pytest.raises(StoreExistsError, match="trajectory_format='pt'"):
        TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=tmp_path / "pt", trajectory_format="zarr"
        )
    assert sorted(str(p) for p in (tmp_path / "pt").rglob("*")) == listing
    # Without an explicit format the buffer appends in the store's own format.
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "pt") as again:
        assert again.trajectory_format == "pt"
    (tmp_path / "file").write_text("a user's file")
    with pytest.raises(StoreExistsError, match="is a file"):
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "file")
    assert (tmp_path / "file").read_text() == "a user's file"


def test_store_is_plain_zarr_and_index_is_commit_last(tmp_path):
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
        buffer.add_trajectories([make_trajectory(2, 3, 0), make_trajectory(4, 1, 6, epochs=2)])
    root = zarr.open_group(str(tmp_path / "s"), mode="r")
    index = json.loads((tmp_path / "s" / "trajectory_index.json").read_text())
    metadata = json.loads((tmp_path / "s" / "metadata.json").read_text())
    assert index["trajectory_id_list"] == [0, 1]
    # The root's attributes hold a small head: the metadata and the size, not the index.
    assert root.attrs["rbzarr"] == {"metadata": metadata, "head": {"size": 2, "index": "log"}}
    assert (metadata["size"], metadata["total_samples"], metadata["trajectory_format"]) == (
        2,
        10,
        "zarr",
    )
    # A trajectory's group consolidates its arrays' documents: zarr reads them through it.
    group = root["trajectories/1"]
    assert isinstance(group, zarr.Group)
    assert group["dones"].shape == (6, 1, 1)


def test_concurrent_add_and_sample_never_mix_rows(tmp_path):
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", cache_size=2, sample_window_size=6, seed=9
    )
    buffer.add_trajectories([make_trajectory(4, 3, 0)])
    errors: list[BaseException] = []
    stop = threading.Event()
    total = 40

    def sampler():
        try:
            while not stop.is_set():
                assert_rows_consistent(buffer.sample(64))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sampler) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for k in range(1, total):
            buffer.add_trajectories([make_trajectory(4, 3, 12 * k)])
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors[0]
    buffer.close()
    assert len(buffer) == total


def test_stats_and_readiness():
    buffer = TrajectoryReplayBuffer(sample_window_size=2)
    assert not buffer.is_ready(1)
    buffer.add_trajectories([make_trajectory(2, 2, 0), make_trajectory(3, 2, 4)])
    stats = buffer.get_stats()
    assert (stats["num_trajectories"], stats["total_samples"], stats["cache_size"]) == (2, 10, 2)
    assert buffer.is_ready(2) and not buffer.is_ready(3)


def test_a_buffer_dropped_without_close_frees_its_cache(tmp_path):
    def live_caches() -> int:
        gc.collect()
        return sum(type(o) is RowCache for o in gc.get_objects())

    before = live_caches()
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s", cache_size=4)
    buffer.add_trajectories([make_trajectory(4, 3, 0), make_trajectory(4, 3, 12)])
    buffer.flush()  # the writer thread now waits for work: it must not hold the last task
    assert live_caches() == before + 1
    del buffer
    assert live_caches() == before


def test_writing_a_store_leaves_nothing_for_the_garbage_collector(tmp_path):
    # What a write makes is freed as it goes (no reference cycles): a collection run in a
    # peer's time, or a trainer's step, pays for none of it.
    def session(path) -> None:
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, cache_size=8) as buffer:
            # One pack of six (queued together), then four written alone.
            buffer.add_trajectories([make_trajectory(4, 2, 8 * k) for k in range(6)])
            buffer.flush()
            for k in range(4):
                buffer.add_trajectories([make_trajectory(6, 3, 100 + 18 * k)])
                buffer.flush()
            buffer.sample(16)

    def garbage_of_a_session(path) -> list[str]:
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            session(path)
            gc.collect()
            return sorted({type(o).__name__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    session(tmp_path / "first")  # imports, and what is made once per process and schema
    # A write's own garbage is left by every session; a thread another test left running
    # may make some in one of them.
    found = [garbage_of_a_session(tmp_path / f"store-{k}") for k in range(3)]
    assert [] in found, found


def test_the_commit_callback_hears_whether_writes_wait_behind_each_commit(tmp_path):
    """A burst queued at once: each commit but the last has writes behind it (the buffer
    leaves those rows shared, copied on first read, while the writer has work)."""
    heard: list[tuple[int, bool]] = []
    layout = layout_class("zarr")(Location.from_url(tmp_path / "s"))
    writer = StoreCommitter(layout, on_committed=lambda tid, more: heard.append((tid, more)))
    index = TrajectoryIndex()
    items = []
    for seed in range(3):
        trajectory = ValidatedTrajectory.check(make_trajectory(4, 3, seed), None, copy=True)
        raw = trajectory.trajectory
        entry = index.new_entry(trajectory.spec.shape, raw.max_episode_length, raw.model_weights_id)
        items.append((entry, trajectory))
    writer.submit(items)
    writer.close()
    assert heard == [(0, True), (1, True), (2, False)]


def test_a_failing_commit_callback_neither_fails_nor_repeats_the_commit(tmp_path, monkeypatch):
    layout_type = layout_class("zarr")
    original = layout_type.write
    writes: list[int] = []

    def counted(layout, entry, trajectory) -> None:
        writes.append(int(entry["trajectory_id"]))
        original(layout, entry, trajectory)

    called: list[tuple[int, bool]] = []

    def failing_callback(trajectory_id: int, more_queued: bool) -> None:
        called.append((trajectory_id, more_queued))
        raise MemoryError(f"no room to copy trajectory {trajectory_id}")

    monkeypatch.setattr(layout_type, "write", counted)
    layout = layout_type(Location.from_url(tmp_path / "s"))
    writer = StoreCommitter(layout, on_committed=failing_callback)
    trajectory = ValidatedTrajectory.check(make_trajectory(4, 3, 0), None, copy=True)
    raw = trajectory.trajectory
    entry = TrajectoryIndex().new_entry(
        trajectory.spec.shape, raw.max_episode_length, raw.model_weights_id
    )
    writer.submit([(entry, trajectory)])
    writer.close()
    assert writes == [0]
    assert called == [(0, False)]  # it ran (and failed), nothing queued behind it
    layout, documents = open_store(tmp_path / "s")
    assert documents.trajectory_index["trajectory_id_list"] == [0]
    assert_same_trajectory(
        layout.read(documents.trajectory_index["trajectory_index"]["0"]), trajectory.trajectory
    )


def test_a_copy_that_fails_midway_says_which_trajectories_it_left_added(tmp_path, monkeypatch):
    # add_trajectories queues each copy as soon as it is made (here every one: no byte
    # threshold), so a copy that fails (out of memory) leaves those queued before added;
    # the error must say so, and they must be the ones kept and stored.
    from rbzarr.buffer import buffer as buffer_module  # noqa: PLC0415 (its threshold)

    monkeypatch.setattr(buffer_module, "PIPELINED_BYTES", 0)
    real = ValidatedTrajectory.copied
    copies: list[int] = []

    def copied_until_memory_runs_out(self: ValidatedTrajectory) -> ValidatedTrajectory:
        copies.append(1)
        if len(copies) == 3:
            raise MemoryError("no room for the third copy")
        return real(self)

    monkeypatch.setattr(ValidatedTrajectory, "copied", copied_until_memory_runs_out)
    store = str(tmp_path / "s")
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        with pytest.raises(MemoryError) as raised:
            buffer.add_trajectories([make_trajectory(3, 2, 100 * k) for k in range(4)])
        assert raised.value.__notes__ == [
            "add_trajectories: the first 2 of these 4 trajectories were added (queued for "
            "writing) before this copy failed; the other 2 were not"
        ]
        assert len(buffer) == 2
    layout, documents = open_store(store)
    assert documents.trajectory_index["trajectory_id_list"] == [0, 1]
    for k in range(2):
        stored = layout.read(documents.trajectory_index["trajectory_index"][str(k)])
        assert_same_trajectory(stored, make_trajectory(3, 2, 100 * k))
