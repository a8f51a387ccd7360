"""The commit as a resumable state machine: a storage call that fails, then works again.

Each test makes one storage step of a commit, a compaction or a read fail (or race) once
and checks what the issue's defects broke: nothing flushed is lost or listed twice, a
reader never goes backward, a repair keeps the store's format, schema and seed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trajectory

from rbzarr import CorruptStoreError, TrajectoryReplayBuffer, WriterFailedError
from rbzarr.analysis.verify import verify_store
from rbzarr.errors import StorageUnavailableError
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io import files
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import publish


def listed(url: str | Path) -> list[int]:
    """The ids a new reader lists."""
    documents = read_store_documents(Location.from_url(url))
    return list(documents.trajectory_index["trajectory_id_list"])


def fail_once(monkeypatch: pytest.MonkeyPatch, folder: str) -> list[str]:
    """Make the next log write into ``index/<folder>`` fail once; the failed paths."""
    failed: list[str] = []
    original = index_log.IndexLog._write

    def write(self: index_log.IndexLog, data: bytes, *names: str) -> None:
        if names[0] == folder and not failed:
            failed.append("/".join(names))
            raise StorageUnavailableError(f"injected: writing {'/'.join(names)} failed")
        original(self, data, *names)

    monkeypatch.setattr(index_log.IndexLog, "_write", write)
    return failed


def count_group_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each trajectory group's commit marker as it is written (local stores; a
    pack's own marker is not a trajectory's)."""
    markers: list[str] = []

    def counted(original: Callable[..., None]) -> Callable[..., None]:
        def write(path: str, *args: Any, **kwargs: Any) -> None:
            group = os.path.dirname(path)
            if os.path.basename(path) == "zarr.json" and (
                os.path.basename(os.path.dirname(group)) == "trajectories"
            ):
                markers.append(os.path.basename(group))
            original(path, *args, **kwargs)

        return write

    # A group's marker is committed by rename; a pack member's is written in its new folder.
    monkeypatch.setattr(publish, "commit_file", counted(publish.commit_file))
    monkeypatch.setattr(publish, "write_file", counted(publish.write_file))
    return markers


def test_a_failed_record_write_loses_no_trajectory_of_the_burst(tmp_path, monkeypatch):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=7)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.flush()
    failed = fail_once(monkeypatch, index_log.RECORDS)
    markers = count_group_writes(monkeypatch)
    buffer.add_trajectories([make_trajectory(2, 2, 4 * k) for k in range(1, 9)])
    buffer.flush()  # the record's write is retried with the whole burst
    assert failed
    assert listed(store) == list(range(9))
    assert sorted(int(m) for m in markers) == list(range(1, 9))  # no group written twice
    buffer.close()
    assert listed(store) == list(range(9))
    assert verify_store(store).ok


def test_a_failed_compaction_neither_fails_the_commit_nor_lists_an_id_twice(tmp_path, monkeypatch):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=7)
    markers = count_group_writes(monkeypatch)
    for k in range(index_log.COMPACT_RECORDS - 2):
        buffer.add_trajectories([make_trajectory(2, 2, 4 * k)])
        buffer.flush()
    failed = fail_once(monkeypatch, index_log.HEAD_FILE)
    for k in range(index_log.COMPACT_RECORDS - 2, index_log.COMPACT_RECORDS + 2):
        buffer.add_trajectories([make_trajectory(2, 2, 4 * k)])
        buffer.flush()
    assert failed == [index_log.HEAD_FILE]
    count = index_log.COMPACT_RECORDS + 2
    assert listed(store) == list(range(count))
    assert sorted(int(m) for m in markers) == list(range(count))
    buffer.close()
    assert listed(store) == list(range(count))
    assert verify_store(store).ok


def test_a_failed_compaction_is_retried_at_flush(tmp_path, monkeypatch):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=7)
    failed = fail_once(monkeypatch, index_log.HEAD_FILE)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])  # a metadata change: compacted at once
    buffer.flush()
    assert failed == [index_log.HEAD_FILE]
    # The flush compacted: readers of the metadata (the head) see the schema.
    assert StoreIndex.open(Location.from_url(store)).recorded["schema"] is not None
    assert not os.listdir(store / index_log.INDEX_DIR / index_log.RECORDS)
    buffer.close()


def test_a_reader_does_not_go_backward_across_a_compaction(tmp_path, monkeypatch):
    store = tmp_path / "s"
    location = Location.from_url(store)
    writer = index_log.IndexLog(location)
    entry = {"trajectory_id": 0, "num_samples": 4, "shape": [2, 2]}
    writer.append([entry], counter=1, metadata={"trajectory_format": "zarr"})
    for trajectory_id in range(1, 4):
        writer.append([{**entry, "trajectory_id": trajectory_id}], counter=trajectory_id + 1)
    original = Location.list_names
    raced: list[bool] = []

    def list_names(self: Location, *names: str) -> list[str]:
        if names == (index_log.INDEX_DIR, index_log.RECORDS) and not raced:
            raced.append(True)
            writer.compact()  # between the reader's head and its listing
        return original(self, *names)

    monkeypatch.setattr(Location, "list_names", list_names)
    state = index_log.read_slot_index(location)
    assert raced
    assert [e["trajectory_id"] for e, _ in state.entries] == [0, 1, 2, 3]


def test_repair_of_a_lost_head_keeps_the_format_schema_and_seed(tmp_path):
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=99) as buffer:
        buffer.add_trajectories([make_trajectory(2, 2, 4 * k) for k in range(3)])
    before = StoreIndex.open(Location.from_url(store)).recorded
    (store / index_log.INDEX_DIR / index_log.HEAD_FILE).unlink()
    with pytest.raises(CorruptStoreError, match=r"head\.json is missing"):
        listed(store)
    report = verify_store(store)
    assert [p.kind for p in report.problems] == ["damaged_log"]
    repaired = verify_store(store, repair=True)
    assert repaired.format == "zarr" and repaired.ok, repaired.problems
    after = StoreIndex.open(Location.from_url(store)).recorded
    for key in ("trajectory_format", "schema", "seed"):
        assert after[key] == before[key]
    assert listed(store) == [0, 1, 2]
    assert verify_store(store).ok


def test_flush_returns_only_when_every_write_is_recorded(tmp_path, monkeypatch):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=7)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.flush()
    original = index_log.IndexLog._write

    def refuse(self: index_log.IndexLog, data: bytes, *names: str) -> None:
        if names[0] == index_log.RECORDS:
            raise StorageUnavailableError("injected: the record is refused")
        original(self, data, *names)

    monkeypatch.setattr(index_log.IndexLog, "_write", refuse)
    buffer.add_trajectories([make_trajectory(2, 2, 4 * k) for k in range(1, 4)])
    with pytest.raises(WriterFailedError, match="not committed"):
        buffer.flush(timeout=1.0)
    assert listed(store) == [0]
    monkeypatch.setattr(index_log.IndexLog, "_write", original)
    buffer.flush()
    assert listed(store) == [0, 1, 2, 3]
    buffer.close()


def test_a_durable_store_syncs_its_new_folder_into_its_parent(tmp_path, monkeypatch):
    synced: list[str] = []
    original = files._sync

    def sync(path: str) -> None:
        synced.append(os.path.normpath(path))
        original(path)

    monkeypatch.setattr(files, "_sync", sync)
    store = tmp_path / "new" / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, durable=True) as buffer:
        buffer.add_trajectories([make_trajectory(2, 2, 0)])
    # Each new folder's entry is synced in its parent: the store's and its new parent's.
    assert str(tmp_path / "new") in synced
    assert str(tmp_path) in synced
