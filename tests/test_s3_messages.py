"""A missing bucket and a misspelled storage option read the same on every path (moto)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trajectory

from benchmarks.s3_server import unique_bucket_name
from rbzarr import (
    CheckpointNotFoundError,
    StorageOptionError,
    StoreNotWritableError,
    TrajectoryReplayBuffer,
    open_buffer,
)
from rbzarr.analysis.export import export_store
from rbzarr.analysis.merge_split import merge_stores
from rbzarr.analysis.recode import recode_store
from rbzarr.storage.io.backends import missing_bucket_message

pytestmark = pytest.mark.s3


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A local zarr store of one trajectory."""
    path = tmp_path / "source"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.close()
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _checkpoint(url: str, options: dict[str, Any], source: Path) -> None:
    buffer = TrajectoryReplayBuffer(storage_options=options)
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.save_checkpoint(url)


def _auto_save(url: str, options: dict[str, Any], source: Path) -> None:
    TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=options)


WRITES: dict[str, Callable[[str, dict[str, Any], Path], Any]] = {
    "save_checkpoint": _checkpoint,
    "auto_save": _auto_save,
    "recode": lambda url, options, source: recode_store(
        source, url, {"default": "zstd"}, destination_options=options
    ),
    "export": lambda url, options, source: export_store(
        source, url, "pt", destination_options=options
    ),
    "merge": lambda url, options, source: merge_stores(url, [source], storage_options=options),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_every_write_into_a_missing_bucket_says_what_open_buffer_says(
    write: str, source: Path, s3_options: dict[str, Any]
):
    bucket = unique_bucket_name()
    url = f"s3://{bucket}/run"
    before = _files(source)
    with pytest.raises(StoreNotWritableError) as caught:
        WRITES[write](url, s3_options, source)
    with pytest.raises(CheckpointNotFoundError) as opened:
        open_buffer(url, s3_options)
    wanted = missing_bucket_message(bucket)
    assert wanted in str(caught.value) and wanted in str(opened.value)
    assert url in str(caught.value)
    assert _files(source) == before


@pytest.mark.parametrize("opener", ["open_buffer", "buffer"])
def test_a_misspelled_storage_option_is_named_with_the_options_s3fs_takes(
    opener: str, s3_options: dict[str, Any], s3_bucket: str
):
    options = {**s3_options, "endpont_url": s3_options["endpoint_url"]}
    url = f"s3://{s3_bucket}/run"
    with pytest.raises(StorageOptionError) as caught:
        if opener == "open_buffer":
            open_buffer(url, options)
        else:
            TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=options)
    message = str(caught.value)
    assert re.search(
        r"unknown storage option 'endpont_url' \(did you mean 'endpoint_url'\?\)", message
    )
    assert "s3fs takes" in message and "client_kwargs" in message and "profile" in message
    assert isinstance(caught.value, TypeError)
    with pytest.raises(CheckpointNotFoundError):
        open_buffer(url, s3_options)  # nothing was written
