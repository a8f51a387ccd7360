"""Damaged stores: named errors with the repair command, ``ls`` marks, repair then verify."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trajectory

from rbzarr import CorruptStoreError, TrajectoryReplayBuffer
from rbzarr.analysis import open_buffer
from rbzarr.analysis.listing import StoreListing
from rbzarr.analysis.report_text import info_lines, ls_lines
from rbzarr.analysis.summary import describe_store, list_trajectories
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.io.location import Location


def build(url: str, options: dict[str, Any] | None = None) -> None:
    """Three trajectories, each in its own group (no pack: the damage is one trajectory's)."""
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=options,
        layout_options={"pack_bytes": 0},
    )
    buffer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(3)])
    buffer.close()


@pytest.fixture
def store_missing_one(tmp_path: Path) -> Path:
    """A store whose index lists trajectory 1, whose data is gone."""
    store = tmp_path / "s"
    build(str(store))
    shutil.rmtree(store / "trajectories" / "1")
    return store


def test_info_of_an_index_listing_missing_data_names_the_trajectory_and_the_repair(
    store_missing_one: Path,
):
    with pytest.raises(CorruptStoreError) as caught:
        describe_store(StoreListing(store_missing_one))
    message = str(caught.value)
    assert message.startswith("trajectory 1: ")
    assert f"`rbzarr verify --repair --drop-damaged {store_missing_one}`" in message


def test_ls_marks_trajectories_whose_data_is_missing(store_missing_one: Path):
    rows = list_trajectories(StoreListing(store_missing_one))
    assert [(row["trajectory_id"], row["missing"]) for row in rows] == [
        (0, False),
        (1, True),
        (2, False),
    ]
    lines = ls_lines(rows)
    assert [line.endswith("MISSING DATA (see `rbzarr verify`)") for line in lines] == [
        False,
        False,
        True,
        False,
    ]


def test_info_gives_every_ratio_as_stored_over_raw(tmp_path: Path):
    build(str(tmp_path / "s"))
    report = describe_store(StoreListing(tmp_path / "s"))
    ratio = report["bytes_on_disk"] / report["raw_bytes"]
    lines = info_lines(report)
    assert f"stored/raw={ratio:.3f}" in lines[2]
    assert not any("compression" in line or "raw / on disk" in line for line in lines)
    for key, item in report["keys"].items():
        line = next(line for line in lines if line.strip().startswith(key))
        assert f"stored/raw={item['bytes_on_disk'] / item['raw_bytes']:.3f}" in line


def damage_one_chunk(url: str, options: dict[str, Any] | None = None) -> None:
    location = Location.from_url(url, options)
    files = location.list_files("trajectories", "1")
    chunk = next(f for f in files if f.startswith(("actions/c/", "actions/c.")))
    location.delete("trajectories", "1", *chunk.split("/"))


def assert_repair_then_verify_is_clean(url: str, options: dict[str, Any] | None = None) -> None:
    repaired = verify_store(url, options, repair=True, drop_damaged=True)
    assert repaired.ok and repaired.dropped_ids == [1]
    # As `rbzarr verify` run next would: a new process, without s3fs's cached listings.
    location = Location.from_url(url, options)
    for fs in (location.fs, getattr(location.zarr_store(), "fs", location.fs)):
        fs.invalidate_cache()
    after = verify_store(url, options)
    assert after.ok and after.problems == []
    assert open_buffer(url, options).ids == [0, 2]


def test_repair_then_verify_is_clean_locally(tmp_path: Path):
    url = str(tmp_path / "s")
    build(url)
    damage_one_chunk(url)
    assert_repair_then_verify_is_clean(url)
    assert not (tmp_path / "s" / "trajectories" / "1").exists()


@pytest.mark.s3
def test_repair_then_verify_is_clean_on_s3(s3_bucket: str, s3_direct_options: dict[str, Any]):
    url = f"s3://{s3_bucket}/s"
    build(url, s3_direct_options)
    damage_one_chunk(url, s3_direct_options)
    assert_repair_then_verify_is_clean(url, s3_direct_options)
