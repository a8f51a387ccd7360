"""IndexEntry: one frozen entry type, and the one check every reader of an entry goes through."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.entry import ENTRY_KEYS, IndexEntry
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Documents

dims = st.integers(min_value=0, max_value=50)


def raw_entry(
    trajectory_id: int, shape: list[int], changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    entry = IndexEntry.new(trajectory_id, shape, 4, "w").to_json()
    entry.update(changes or {})
    return entry


@settings(max_examples=30, deadline=None)
@given(
    trajectory_id=st.integers(min_value=0, max_value=2**40),
    shape=st.lists(dims, min_size=2, max_size=4),
)
def test_an_entry_reads_and_writes_as_its_json_object(trajectory_id: int, shape: list[int]) -> None:
    raw = raw_entry(trajectory_id, shape)
    entry = IndexEntry.parse(json.loads(json.dumps(raw)), "here", trajectory_id)
    assert entry.to_json() == raw and dict(entry) == raw and entry == raw
    assert list(entry) == list(ENTRY_KEYS)
    assert entry.num_samples == shape[0] * shape[1] and entry["shape"] == shape
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.num_samples = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry["num_samples"] = 0  # type: ignore[index]


def test_optional_keys_default_and_digit_strings_are_counts() -> None:
    raw = {"trajectory_id": "7", "num_samples": 6, "shape": [3, "2", 5]}
    entry = IndexEntry.parse(raw, "here", 7)
    assert (entry.trajectory_id, entry.shape) == (7, (3, 2, 5))
    assert (entry.uuid, entry.max_episode_length, entry.model_weights_id) == ("", 0, "")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_samples": 5}, "inconsistent"),
        ({"shape": [6]}, "inconsistent"),
        ({"shape": [3, -2]}, "malformed"),
        ({"trajectory_id": True}, "malformed"),
        ({"num_samples": 2**63}, "malformed"),
        ({"shape": "32"}, "malformed"),
        ({"trajectory_id": 8}, "inconsistent"),
    ],
)
def test_a_bad_entry_is_a_named_error(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(CorruptStoreError, match=f"^store/x: index entry .* is {message}"):
        IndexEntry.parse(raw_entry(7, [3, 2], changes), "store/x", 7)


def test_a_missing_key_or_a_non_object_is_malformed() -> None:
    raw = raw_entry(1, [2, 2])
    del raw["shape"]
    for bad in (raw, [1, 2], None):
        with pytest.raises(CorruptStoreError, match="malformed"):
            IndexEntry.parse(bad, "store/x")


def test_documents_and_a_log_refuse_the_same_entry(tmp_path: Path) -> None:
    """The index documents and the index log check an entry the same way (one check)."""
    bad = raw_entry(0, [3, 2], {"num_samples": 5})
    documents = Documents(
        {"trajectory_counter": 1},
        {"trajectory_index": {"0": bad}, "trajectory_id_list": [0]},
    )
    with pytest.raises(CorruptStoreError, match="index entry 0 is inconsistent"):
        TrajectoryIndex.from_documents(documents, "docs")
    location = Location.from_url(tmp_path / "log")
    index_log.IndexLog(location).rewrite([(bad, 0.0)], counter=1, metadata={})
    with pytest.raises(CorruptStoreError, match="index entry 0 is inconsistent"):
        index_log.read_slot_index(location)


def test_an_index_state_round_trips_and_refuses_a_bad_entry() -> None:
    index = TrajectoryIndex()
    index.new_entry([3, 2], 3, "w")
    index.new_entry([1, 4], 1, "w", uuid="given")
    state = json.loads(json.dumps(index.state_dict()))
    restored = TrajectoryIndex()
    restored.load_state_dict(state)
    assert restored.entries == index.entries and restored.entries[1].uuid == "given"
    state["entries"]["1"]["num_samples"] = 5
    with pytest.raises(CorruptStoreError, match="index entry 1 is inconsistent"):
        TrajectoryIndex().load_state_dict(state)


def test_new_entries_get_distinct_version_4_uuids():
    uuids = [IndexEntry.new(i, [2, 1], 0, "").uuid for i in range(2000)]
    assert len(set(uuids)) == len(uuids)
    for text in uuids[:50]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_draws_other_uuids_than_its_parent():
    IndexEntry.new(0, [2, 1], 0, "")  # the generator has run before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next uuids, then out without pytest's teardown
        os.close(read)
        os.write(write, " ".join(IndexEntry.new(i, [2, 1], 0, "").uuid for i in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [IndexEntry.new(i, [2, 1], 0, "").uuid for i in range(8)]
    assert len(child) == 8 and not set(child) & set(parent)
