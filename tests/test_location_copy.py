"""Copying a trajectory's objects between locations: fsspec moves the bytes, nothing is replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import assert_same_trajectory, make_trajectory

from rbzarr import StoreExistsError
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class

TREE = {"zarr.json": b"{}", "rewards/zarr.json": b"{1}", "rewards/c/0/0": b"\x00\x01"}


def fill(location: Location) -> None:
    for name, data in TREE.items():
        location.write_bytes(data, *name.split("/"))


def contents(location: Location) -> dict[str, bytes]:
    root = location.path.rstrip("/") + "/"
    return {
        str(path)[len(root) :]: bytes(location.fs.cat_file(path))
        for path in location.fs.find(location.path)
    }


def places(tmp_path: Path, memory_url: str) -> dict[str, Location]:
    return {
        "local": Location.from_url(tmp_path / "local"),
        "memory": Location.from_url(memory_url),
    }


@pytest.mark.parametrize(
    ("source", "destination"),
    [("local", "local"), ("local", "memory"), ("memory", "local"), ("memory", "memory")],
)
def test_a_tree_and_a_file_copy_exactly(tmp_path, memory_url, source, destination):
    where = places(tmp_path, memory_url)
    src = where[source].child("src", "3")
    fill(src)
    dst = where[destination].child("dst", "trajectories", "3")
    src.copy_into(dst)
    assert contents(dst) == TREE
    single = where[destination].child("dst", "one.bin")
    src.child("rewards", "c", "0", "0").copy_into(single)
    assert single.read_bytes() == TREE["rewards/c/0/0"]


def test_a_copy_never_replaces_what_is_there(tmp_path, memory_url):
    where = places(tmp_path, memory_url)
    src = where["memory"].child("src")
    fill(src)
    dst = where["local"].child("dst")
    dst.write_bytes(b"the user's", "zarr.json")
    with pytest.raises(StoreExistsError, match="never overwrites"):
        src.copy_into(dst)
    assert contents(dst) == {"zarr.json": b"the user's"}


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_layout_copy_between_filesystems(tmp_path, memory_url, fmt):
    source = layout_class(fmt)(Location.from_url(tmp_path / "store"))
    target = layout_class(fmt)(Location.from_url(memory_url))
    trajectory = make_trajectory(4, 2, 0, epochs=2)
    entry = {"trajectory_id": 0, "uuid": "u", "shape": [4, 2], "num_samples": 8}
    entry.update(max_episode_length=trajectory.max_episode_length, model_weights_id="w")
    source.write(entry, trajectory)
    source.copy_to(target, entry)
    assert_same_trajectory(target.read(entry), trajectory)
    with pytest.raises(StoreExistsError):
        source.copy_to(target, entry)  # the copy is there: never written over


@pytest.mark.s3
def test_copy_between_two_remote_filesystems(
    memory_url, s3_bucket: str, s3_options: dict[str, Any]
):
    src = Location.from_url(memory_url).child("src")
    fill(src)
    dst = Location.from_url(f"s3://{s3_bucket}/dst", s3_options)
    src.copy_into(dst)
    assert contents(dst) == TREE
