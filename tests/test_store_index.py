"""The store's catalog: one probe opens a store, and a writer's memory reads as its files."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trajectory

from benchmarks.s3_server import S3Proxy
from rbzarr import TrajectoryReplayBuffer
from rbzarr.errors import CheckpointNotFoundError
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.schema import schema_to_json
from rbzarr.storage.index.slots import WHOLE_INDEX_BELOW, read_store_documents
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import INDEX_FILE
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.model import validate


def test_nothing_at_a_location_is_no_store(tmp_path: Path) -> None:
    store = StoreIndex.open(Location.from_url(tmp_path / "new"))
    assert not store.exists
    assert store.format is None
    assert store.schema is None


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_one_probe_answers_format_and_schema(tmp_path: Path, fmt: str) -> None:
    trajectory = make_trajectory(4, 2, 0)
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", trajectory_format=fmt
    ) as buffer:
        buffer.add_trajectories([trajectory])
    store = StoreIndex.open(Location.from_url(tmp_path / "s"))
    assert store.exists
    assert store.format == fmt
    assert schema_to_json(store.schema) == schema_to_json(validate(trajectory).schema)


def test_an_index_document_without_metadata_names_the_missing_document(tmp_path: Path) -> None:
    (tmp_path / INDEX_FILE).write_text('{"trajectory_index": {}, "trajectory_id_list": []}')
    store = StoreIndex.open(Location.from_url(tmp_path))
    assert store.exists
    with pytest.raises(CheckpointNotFoundError, match=r"metadata\.json"):
        _ = store.format


def _entry(trajectory_id: int) -> dict[str, Any]:
    return {
        "uuid": str(uuid.UUID(int=trajectory_id)),
        "trajectory_id": trajectory_id,
        "num_samples": 2,
        "shape": [1, 2],
        "max_episode_length": 0,
        "model_weights_id": "",
    }


@pytest.mark.parametrize("bursts", [[0], [1], [3, 5, 2], [7] * 9, [1] * 20])
def test_a_writers_memory_reads_as_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bursts: list[int]
) -> None:
    """Records, open blocks and full blocks (a segment of 8 entries here), every window."""
    monkeypatch.setattr(index_log, "SEGMENT_SIZE", 8)
    monkeypatch.setattr(index_log, "COMPACT_RECORDS", 3)
    location = Location.from_url(tmp_path / "s")
    writer = StoreIndex.open(location).writer(ZarrLayout(location))
    try:
        next_id = 0
        for size in bursts:
            entries = [_entry(i) for i in range(next_id, next_id + size)]
            next_id += size
            writer.append(entries, counter=next_id, metadata={"seed": 1})
        held = writer.held()
        for last in [None, 1, 4, 8, 9, 30, 1000]:
            assert read_store_documents(location, last, held) == read_store_documents(
                location, last
            )
    finally:
        writer.slot.release()


@pytest.mark.s3
def test_a_resume_of_a_large_store_on_s3_takes_at_most_12_requests(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    """A store larger than a whole read (its index written directly, data for the window)."""
    url = f"s3://{s3_bucket}/store"
    location = Location.from_url(url, s3_options)
    size, window = WHOLE_INDEX_BELOW + 1, 2
    layout = ZarrLayout(location)
    trajectory = make_trajectory(1, 2, 0)
    for i in range(size - window, size):
        layout.write(_entry(i), trajectory)
    metadata = {
        "trajectory_format": "zarr",
        "rbzarr_format_version": 1,
        "schema": schema_to_json(validate(trajectory).schema),
    }
    listed = [(_entry(i), 0.0) for i in range(size)]
    index_log.IndexLog(location).rewrite(listed, counter=size, metadata=metadata)
    s3_proxy.reset_log()
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=s3_options,
        cache_size=0,
        sample_window_size=window,
    )
    buffer.load_checkpoint(url)
    requests = [f"{r.method} {r.path.split('?')[0]}" for r in s3_proxy.requests]
    assert len(buffer) == size
    buffer.close()
    assert len(requests) <= 12, requests
    # The probe reads the head once, the slot's writer once; the load reads it from memory.
    assert Counter(requests)[f"GET /{s3_bucket}/store/index/head.json"] == 2, requests


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_a_buffer_probes_its_store_once_when_it_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """One StoreIndex.open when a buffer opens an existing store (and its load_checkpoint of
    that store probes nothing more); the index is read one way, StoreIndex.read."""
    url = str(tmp_path / "s")
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, trajectory_format=fmt) as b:
        b.add_trajectories([make_trajectory(2, 2, 0)])
    calls: Counter[str] = Counter()
    real_open, real_read = StoreIndex.open.__func__, StoreIndex.read  # type: ignore[attr-defined]

    def counted_open(cls: type[StoreIndex], location: Location) -> StoreIndex:
        calls["open"] += 1
        return real_open(cls, location)

    def counted_read(self: StoreIndex, *args: Any, **kwargs: Any) -> Any:
        calls["read"] += 1
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(StoreIndex, "open", classmethod(counted_open))
    monkeypatch.setattr(StoreIndex, "read", counted_read)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, trajectory_format=fmt)
    assert calls == {"open": 1}
    buffer.load_checkpoint(url)
    assert calls == {"open": 1, "read": 1} and len(buffer) == 1
    buffer.close()
