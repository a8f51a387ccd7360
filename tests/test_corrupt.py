"""Corrupt stores: damage is a named error at load or sample time, never garbage or a hang.

Each case damages a committed three-trajectory store, then reads it two ways: a full
``load_checkpoint`` into a memory buffer that warms every trajectory (the cache path), and an
``auto_save`` buffer of the same format continuing the store with no cache, so sampling
reads rows from storage (the storage path).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import assert_rows_consistent, make_trajectory, store_reader

from rbzarr import (
    CheckpointNotFoundError,
    CorruptStoreError,
    RbzarrError,
    TrajectoryReplayBuffer,
    UnsafePathError,
    open_buffer,
)

NAMED = (CorruptStoreError, CheckpointNotFoundError, UnsafePathError)
pytestmark = pytest.mark.timeout(60)


def build(path: Path, fmt: str) -> Path:
    """A committed store whose two documents are its index: RLinf's formats, and a zarr
    store as rbzarr wrote it before its index log (its damage cases are test_index_log's),
    one group per trajectory (before packs: a pack's damage cases are test_packs')."""
    options = {"layout_options": {"pack_bytes": 0}} if fmt == "zarr" else {}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, trajectory_format=fmt, **options
    ) as b:
        b.add_trajectories([make_trajectory(4, 3, 100 * i, epochs=2) for i in range(3)])
    shutil.rmtree(path / "index", ignore_errors=True)
    return path


def via_cache(store: Path) -> dict:
    buffer = TrajectoryReplayBuffer(sample_window_size=0)
    buffer.load_checkpoint(store)
    return buffer.sample(64)


def via_storage(store: Path, fmt: str) -> dict:
    with store_reader(store, trajectory_format=fmt) as buffer:
        return buffer.sample(64)


def assert_refused(store: Path, fmt: str, names: str) -> None:
    """Both read paths raise a named rbzarr error whose message mentions ``names``."""
    for read in (lambda: via_cache(store), lambda: via_storage(store, fmt)):
        with pytest.raises(NAMED) as info:
            batch = read()
            assert_rows_consistent(batch)  # reached only if nothing was detected
        assert names in str(info.value), str(info.value)


def chunk(store: Path) -> Path:
    return store / "trajectories" / "1" / "rewards" / "c.0.0.0"


def rewrite(path: Path, transform: Callable[[bytes], bytes]) -> None:
    path.write_bytes(transform(path.read_bytes()))


CHUNK_DAMAGE = {
    "truncated": lambda p: rewrite(p, lambda b: b[: len(b) // 2]),
    "garbage": lambda p: rewrite(p, lambda b: bytes(255 - x for x in b)),
    "empty": lambda p: rewrite(p, lambda b: b""),
    "missing": os.remove,
}


@pytest.mark.parametrize("damage", sorted(CHUNK_DAMAGE))
def test_zarr_chunk_damage_is_a_named_error(tmp_path, damage):
    store = build(tmp_path / "s", "zarr")
    CHUNK_DAMAGE[damage](chunk(store))
    assert_refused(store, "zarr", "trajectories/1")


def unconsolidate(group: Path) -> None:
    """Lay a trajectory group out as rbzarr wrote it before it consolidated its members'
    documents: a ``zarr.json`` per subgroup and array, none inside the group's."""
    document = json.loads((group / "zarr.json").read_bytes())
    for path, member in document.pop("consolidated_metadata")["metadata"].items():
        member.pop("consolidated_metadata", None)
        (group / path).mkdir(parents=True, exist_ok=True)
        (group / path / "zarr.json").write_text(json.dumps(member))
    (group / "zarr.json").write_text(json.dumps(document))


@pytest.mark.parametrize("document", ["zarr.json", "rewards/zarr.json"])
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_zarr_node_metadata_damage_is_a_named_error(tmp_path, document, damage):
    store = build(tmp_path / "s", "zarr")
    if document != "zarr.json":  # an array's own document: a store written before
        unconsolidate(store / "trajectories" / "1")
    target = store / "trajectories" / "1" / document
    rewrite(target, (lambda b: b"{not json") if damage == "garbage" else (lambda b: b[:30]))
    assert_refused(store, "zarr", "trajectories/1")


@pytest.mark.parametrize("damage", ["garbage", "missing", "other shape"])
def test_a_damaged_consolidated_array_document_is_a_named_error(tmp_path, damage):
    store = build(tmp_path / "s", "zarr")

    def change(raw: bytes) -> bytes:
        document = json.loads(raw)
        members = document["consolidated_metadata"]["metadata"]
        if damage == "garbage":
            members["rewards"] = "garbage"
        elif damage == "missing":
            del members["rewards"]
        else:
            members["rewards"]["shape"] = [5, 3, 1]
        return json.dumps(document).encode()

    rewrite(store / "trajectories" / "1" / "zarr.json", change)
    assert_refused(store, "zarr", "trajectories/1")


def test_a_store_written_before_its_documents_were_consolidated_reads_the_same(tmp_path):
    store = build(tmp_path / "s", "zarr")
    want = via_cache(store)
    for group in (store / "trajectories").iterdir():
        if group.is_dir():
            unconsolidate(group)
    assert (store / "trajectories" / "1" / "rewards" / "zarr.json").is_file()
    for got in (via_cache(store), via_storage(store, "zarr")):
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), key
    # plain zarr, by a path from the store's root, as before
    root = zarr.open_group(store, mode="r")
    rewards = root["trajectories/1/rewards"]
    assert isinstance(rewards, zarr.Array) and rewards.shape[1] == 3
    dataset = open_buffer(store).xarray_dataset(1)
    want = make_trajectory(4, 3, 100, epochs=2).curr_obs["state"]
    assert np.array_equal(dataset["curr_obs/state"].values, want.numpy())


@pytest.mark.parametrize("fmt", ["zarr", "pt", "pkl"])
@pytest.mark.parametrize("name", ["metadata.json", "trajectory_index.json"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "not-an-object", "missing"])
def test_document_damage_is_a_named_error(tmp_path, fmt, name, damage):
    store = build(tmp_path / "s", fmt)
    target = store / name
    if damage == "missing":
        target.unlink()
    else:
        replacement = {"garbage": b"\x8f\x00garbage", "not-an-object": b"[1, 2]"}
        rewrite(target, lambda b: replacement.get(damage, b[: len(b) // 2]))
    with pytest.raises(NAMED, match=name):
        via_cache(store)
    with pytest.raises(NAMED, match=name):
        TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=store, trajectory_format=fmt
        ).load_checkpoint(store)


def trajectory_file(store: Path, fmt: str) -> Path:
    (path,) = store.glob(f"trajectory_1_*.{fmt}")
    return path


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_file_damage_is_a_named_error(tmp_path, fmt, damage):
    store = build(tmp_path / "s", fmt)
    target = trajectory_file(store, fmt)
    transform = {
        "truncated": lambda b: b[: len(b) // 2],
        "garbage": lambda b: bytes(255 - x for x in b),
        "empty": lambda b: b"",
    }[damage]
    rewrite(target, transform)
    assert_refused(store, fmt, target.name)


@pytest.mark.parametrize("fmt", ["zarr", "pt", "pkl"])
def test_missing_trajectory_data_is_checkpoint_not_found(tmp_path, fmt):
    store = build(tmp_path / "s", fmt)
    if fmt == "zarr":
        shutil.rmtree(store / "trajectories" / "1")
    else:
        trajectory_file(store, fmt).unlink()
    for read in (lambda: via_cache(store), lambda: via_storage(store, fmt)):
        with pytest.raises(CheckpointNotFoundError, match=r"\[1\]"):
            read()


def test_missing_zarr_array_is_a_named_error(tmp_path):
    store = build(tmp_path / "s", "zarr")
    shutil.rmtree(store / "trajectories" / "1" / "curr_obs" / "state")
    assert_refused(store, "zarr", "trajectories/1")


def edit_index(store: Path, edit: Callable[[dict], None]) -> None:
    path = store / "trajectory_index.json"
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
@pytest.mark.parametrize("shape", [[8, 3], [4, 2], [2, 6]])
def test_index_shape_disagreeing_with_data_is_refused(tmp_path, fmt, shape):
    store = build(tmp_path / "s", fmt)

    def edit(document: dict) -> None:
        entry = document["trajectory_index"]["1"]
        entry["shape"], entry["num_samples"] = shape, shape[0] * shape[1]

    edit_index(store, edit)
    assert_refused(store, fmt, "1")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trajectory_id", "../1"),
        ("trajectory_id", None),
        ("shape", [4]),
        ("shape", "4x3"),
        ("num_samples", 99),
    ],
)
def test_malformed_index_entries_are_corrupt_store_errors(tmp_path, field, value):
    store = build(tmp_path / "s", "zarr")
    edit_index(store, lambda d: d["trajectory_index"]["1"].__setitem__(field, value))
    with pytest.raises(CorruptStoreError, match=r"trajectory_index|index entry"):
        via_cache(store)


def test_id_list_naming_an_unknown_or_escaping_id_is_refused(tmp_path):
    store = build(tmp_path / "s", "zarr")
    edit_index(store, lambda d: d["trajectory_id_list"].append("../../etc"))
    with pytest.raises(CorruptStoreError):
        via_cache(store)
    edit_index(store, lambda d: d["trajectory_id_list"].__setitem__(-1, 7))
    with pytest.raises(CorruptStoreError, match=r"\[7\]"):
        via_cache(store)


def test_a_failed_load_leaves_the_buffer_as_it_was(tmp_path):
    good = build(tmp_path / "good", "zarr")
    bad = build(tmp_path / "bad", "zarr")
    CHUNK_DAMAGE["truncated"](chunk(bad))
    buffer = TrajectoryReplayBuffer(sample_window_size=0, seed=5)
    buffer.load_checkpoint(good)
    stats = buffer.get_stats()
    with pytest.raises(RbzarrError):
        buffer.load_checkpoint(bad)
    assert buffer.get_stats() == stats
    assert_rows_consistent(buffer.sample(16))
