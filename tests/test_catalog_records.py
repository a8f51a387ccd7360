"""The records a store keeps beside its trajectories (priorities, pins) are the catalog's:
verify checks them, and export, split, merge and recode carry the priorities along."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.export import export_store
from rbzarr.analysis.merge_split import merge_stores, split_store
from rbzarr.analysis.recode import recode_store
from rbzarr.analysis.verify import verify_store
from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index.pins import Pin
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location


def make_store(path: Path, count: int, base: int = 0, fmt: str = "zarr") -> StoreIndex:
    """A committed store of ``count`` trajectories, each but the last with priorities."""
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), trajectory_format=fmt
    ) as buffer:
        buffer.add_trajectories(
            [make_trajectory(2, 2, base + 100 * i, mwid=f"w{base}") for i in range(count)]
        )
    store = StoreIndex.open(Location.from_url(path))
    for entry in index_of(store).entries.values():
        if entry.trajectory_id != count - 1:
            store.priorities.write(entry.trajectory_id, priorities_of(entry.uuid, 4))
    return store


def priorities_of(uuid: str, rows: int) -> np.ndarray:
    """Priorities that name their trajectory (by its uuid), whatever its id."""
    return np.arange(rows, dtype=np.float32) + float(int(uuid[:6], 16) % 1000)


def index_of(store: StoreIndex) -> TrajectoryIndex:
    return TrajectoryIndex.from_documents(store.read(), store.location.url)


def assert_priorities_carried(target: Path, expected: int) -> None:
    """Each trajectory of ``target`` has its source's priorities, found by its uuid."""
    store = StoreIndex.open(Location.from_url(target))
    stored = store.priorities.read_all(index_of(store).entries.values())
    assert len(stored) == expected
    for trajectory_id, values in stored.items():
        uuid = index_of(store).entries[trajectory_id].uuid
        np.testing.assert_array_equal(values, priorities_of(uuid, 4))
    assert verify_store(str(target)).ok


def test_verify_names_a_damaged_priority_file_and_repair_removes_it(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s", 3)
    assert verify_store(str(tmp_path / "s")).ok
    store.location.write_bytes(b"not priorities", "priorities", "1.f32")
    report = verify_store(str(tmp_path / "s"))
    assert [(p.kind, p.path, p.trajectory_id) for p in report.problems] == [
        ("damaged_priorities", "priorities/1.f32", 1)
    ]
    assert "not the priorities of trajectory 1" in report.problems[0].message
    repaired = verify_store(str(tmp_path / "s"), repair=True)
    assert repaired.ok and [p.kind for p in repaired.repaired] == ["damaged_priorities"]
    assert not store.location.exists("priorities", "1.f32")
    assert store.location.exists("priorities", "0.f32")  # an intact one stays
    assert verify_store(str(tmp_path / "s")).ok


def test_verify_names_a_pin_whose_trajectories_the_index_no_longer_lists(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path / "s", 2)
    entries = index_of(store).entries
    store.pins.add(Pin.new("file:///kept", [0, 1], [entries[0].uuid, entries[1].uuid]))
    assert verify_store(str(tmp_path / "s")).ok
    lost = Pin.new("file:///lost", [0, 7], [entries[0].uuid, "another"])
    store.pins.add(lost)
    report = verify_store(str(tmp_path / "s"), repair=True)
    assert [(p.kind, p.path) for p in report.problems] == [
        ("pinned_missing", f"pins/{lost.pin_id}.json")
    ]
    assert "[7]" in report.problems[0].message and "file:///lost" in report.problems[0].message
    assert store.pins.read(lost.pin_id) == lost  # a repair never drops a pin


def test_verify_names_an_unreadable_pin(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s", 1)
    store.location.write_bytes(b"{", "pins", "0" * 32 + ".json")
    report = verify_store(str(tmp_path / "s"))
    assert [p.kind for p in report.problems] == ["unreadable_pin"]


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_export_and_split_carry_the_priorities(tmp_path: Path, fmt: str) -> None:
    make_store(tmp_path / "s", 3)
    export_store(tmp_path / "s", tmp_path / "e", fmt)
    assert_priorities_carried(tmp_path / "e", 2)
    export_store(tmp_path / "s", tmp_path / "last", fmt, last=1)
    assert_priorities_carried(tmp_path / "last", 0)  # the last one has none
    split_store(str(tmp_path / "s"), str(tmp_path / "parts"), 3)
    for part, expected in enumerate([1, 1, 0]):
        assert_priorities_carried(tmp_path / "parts" / f"part_{part}", expected)


def test_merge_carries_the_priorities_under_the_new_ids(tmp_path: Path) -> None:
    make_store(tmp_path / "a", 2, base=0)
    make_store(tmp_path / "b", 3, base=1000)
    merge_stores(str(tmp_path / "m"), [str(tmp_path / "a"), str(tmp_path / "b")])
    assert_priorities_carried(tmp_path / "m", 1 + 2)


def test_recode_carries_the_priorities(tmp_path: Path) -> None:
    make_store(tmp_path / "s", 3)
    recode_store(tmp_path / "s", tmp_path / "r", {"default": "lossless"})
    assert_priorities_carried(tmp_path / "r", 2)


def test_export_refuses_a_damaged_priority_file_and_names_it(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s", 2)
    store.location.write_bytes(b"bad", "priorities", "0.f32")
    with pytest.raises(CorruptStoreError, match=r"priorities/0\.f32"):
        export_store(tmp_path / "s", tmp_path / "e", "zarr")
    assert not StoreIndex.open(Location.from_url(tmp_path / "e")).exists  # no index written


def test_an_export_records_its_own_codecs_never_the_sources(tmp_path: Path) -> None:
    make_store(tmp_path / "s", 1)
    source = StoreIndex.open(Location.from_url(tmp_path / "s"))
    assert source.codecs  # a zarr store records the codec of each key
    export_store(tmp_path / "s", tmp_path / "pt", "pt")
    assert StoreIndex.open(Location.from_url(tmp_path / "pt")).codecs == {}
    export_store(tmp_path / "pt", tmp_path / "z", "zarr")
    assert StoreIndex.open(Location.from_url(tmp_path / "z")).codecs == source.codecs
