"""The buffer on S3, against moto's real HTTP server (see ``s3_fixtures.py``).

Every request goes through the test's ``S3Proxy`` (benchmarks/s3_server.py), so the tests count what
actually crosses the wire and can cut the connection mid-write.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import s3fs
import torch
from conftest import (
    assert_rows_consistent,
    assert_same_trajectory,
    make_trajectory,
    storage_buffer,
)
from rlinf_oracle import expected_numbers

from benchmarks.s3_server import Request, S3Proxy
from rbzarr import (
    CheckpointNotFoundError,
    StorageUnavailableError,
    Trajectory,
    TrajectoryReplayBuffer,
    WriterFailedError,
)
from rbzarr.analysis.export import export_store
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.zarr import remote

pytestmark = pytest.mark.s3

SIZES = [(12, 4), (8, 4), (10, 4), (6, 4)]
# Requests per batch of layout 2 (one shard per array) are tested in test_shards_s3.py.


def fill(buffer: TrajectoryReplayBuffer, sizes: list[tuple[int, int]]) -> list[Trajectory]:
    """Add one trajectory per size (ids 0, 1, ...); return them for comparison."""
    added, base = [], 0
    for T, B in sizes:
        trajectory = make_trajectory(T, B, base)
        buffer.add_trajectories([trajectory])
        added.append(trajectory)
        base += T * B
    return added


def locate(number: int, sizes: list[tuple[int, int]]) -> tuple[int, int]:
    """The (trajectory id, flat row) that sample number ``number`` came from."""
    base = 0
    for trajectory_id, (T, B) in enumerate(sizes):
        if number < base + T * B:
            return trajectory_id, number - base
        base += T * B
    raise AssertionError(f"number {number} is beyond every trajectory")


def chunk_of(request: Request, bucket: str) -> tuple[int, str, int] | None:
    """(trajectory, key, chunk along time) if ``request`` reads a chunk, else None."""
    match = re.fullmatch(rf"/{bucket}/store/trajectories/(\d+)/(.+)/c/(\d+)(?:/0)*", request.key)
    return None if match is None else (int(match[1]), match[2], int(match[3]))


def after(count: int, predicate: Callable[[Request], bool]) -> Callable[[Request], bool]:
    """A proxy trigger that fires on the ``count``-th request ``predicate`` accepts."""
    seen = itertools.count(1)
    return lambda request: predicate(request) and next(seen) >= count


def read_index(url: str, options: dict[str, Any]) -> dict[str, Any]:
    return read_store_documents(Location.from_url(url, options)).trajectory_index


def one_row_cached(
    url: str, options: dict[str, Any], seed: int, window: int
) -> TrajectoryReplayBuffer:
    """A buffer saving to the S3 store ``url`` with one trajectory in its row cache."""
    return storage_buffer(
        url, options, seed, enable_cache=True, cache_size=1, sample_window_size=window
    )


# -- lifecycle --------------------------------------------------------------------------
def test_lifecycle_on_s3(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # the shards are fetched, and seen
    url, ckpt = f"s3://{s3_bucket}/store", f"s3://{s3_bucket}/ckpt"
    with one_row_cached(url, s3_options, seed=7, window=100) as buffer:
        added = fill(buffer, SIZES)
        buffer.flush()
        assert read_index(url, s3_options)["trajectory_id_list"] == list(range(len(SIZES)))

        # Only the last trajectory is cached: the rest of each batch is read from S3 (these
        # shards are small: each is fetched whole when its trajectory first misses).
        calls = [17, 64, 5]
        first_misses: set[int] = set()
        for n, want in zip(calls, expected_numbers(7, SIZES, 100, calls), strict=True):
            s3_proxy.reset_log()
            assert torch.equal(assert_rows_consistent(buffer.sample(n)), want)
            served = {chunk_of(r, s3_bucket) for r in s3_proxy.requests} - {None}
            missed = {locate(int(x), SIZES)[0] for x in want.tolist()} - {len(SIZES) - 1}
            assert {tid for tid, _, _ in served} == missed - first_misses
            first_misses |= missed

        buffer.save_checkpoint(ckpt)  # a manifest: the trajectories stay in the store
        next_draw = assert_rows_consistent(buffer.sample(50))

    # Full load: same index and counter, and the generator continues where it was saved.
    restored = TrajectoryReplayBuffer(seed=0, storage_options=s3_options)
    restored.load_checkpoint(ckpt)
    assert len(restored) == len(SIZES) and restored.trajectory_counter == len(SIZES)
    assert restored.total_samples == sum(T * B for T, B in SIZES)
    assert torch.equal(assert_rows_consistent(restored.sample(50)), next_draw)
    assert Location.from_url(ckpt, s3_options).list_names() == ["checkpoint.json"]
    layout, _ = open_store(url, s3_options)
    for trajectory_id, trajectory in enumerate(added):
        entry = restored.index_entries[trajectory_id]
        assert_same_trajectory(layout.read(entry), trajectory)

    # Sharded loads: disjoint, complete, RLinf's split.
    shares = []
    for rank in range(3):
        shard = TrajectoryReplayBuffer(storage_options=s3_options)
        shard.load_checkpoint(ckpt, is_distributed=True, local_rank=rank, world_size=3)
        shares.append(shard.trajectory_ids)
        numbers = assert_rows_consistent(shard.sample(30))
        assert {locate(int(x), SIZES)[0] for x in numbers.tolist()} <= set(shares[-1])
    assert shares == [[0, 1], [2], [3]]


def test_export_between_s3_and_local(
    tmp_path: Path, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    source, back = f"s3://{s3_bucket}/store", f"s3://{s3_bucket}/from-local"
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=source, storage_options=s3_options
    ) as buffer:
        added = fill(buffer, SIZES[:3])
    export_store(source, tmp_path / "pt", "pt", storage_options=s3_options)
    export_store(tmp_path / "pt", back, "zarr", destination_options=s3_options, last=2)
    for url, options, ids in (
        (str(tmp_path / "pt"), None, [0, 1, 2]),
        (back, s3_options, [1, 2]),
    ):
        layout, documents = open_store(url, options)
        assert documents.trajectory_index["trajectory_id_list"] == ids
        assert documents.metadata["trajectory_counter"] == 3
        for tid in ids:
            entry = documents.trajectory_index["trajectory_index"][str(tid)]
            assert_same_trajectory(layout.read(entry), added[tid])


# -- outages ----------------------------------------------------------------------------
@pytest.fixture
def fast_s3_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """s3fs retries a failed call 5 times with backoff (~2 s, nested for reads); 2 here."""
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)


@pytest.mark.usefixtures("fast_s3_retries")
def test_outage_mid_write_is_reported_and_recovered(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict
):
    url = f"s3://{s3_bucket}/store"
    buffer = storage_buffer(url, s3_options, seed=3)
    added = fill(buffer, [(4, 4)])
    buffer.flush()
    # The connection dies after two chunks of trajectory 1 reached the server.
    s3_proxy.go_down(
        when=after(
            3, lambda r: r.method == "PUT" and "/trajectories/1/" in r.key and "/c/" in r.key
        )
    )
    added += [make_trajectory(4, 4, 16), make_trajectory(2, 4, 32)]
    buffer.add_trajectories(added[1:])

    with pytest.raises(WriterFailedError, match=re.escape(url)) as failure:
        buffer.flush(timeout=5)
    cause = failure.value.__cause__
    assert isinstance(cause, StorageUnavailableError) and url in str(cause)
    assert s3_proxy.is_down and s3_proxy.dropped

    # The server holds part of trajectory 1 but not its group document (the commit marker,
    # written last), and no index lists it.
    direct = Location.from_url(url, s3_direct_options)
    assert direct.list_names("trajectories", "1")
    assert not direct.exists("trajectories", "1", "zarr.json")
    assert read_index(url, s3_direct_options)["trajectory_id_list"] == [0]
    reader = TrajectoryReplayBuffer(storage_options=s3_direct_options)
    reader.load_checkpoint(url)
    assert reader.trajectory_ids == [0]

    # Reads during the outage fail loudly; they never return zeros or "not found".
    with pytest.raises(StorageUnavailableError, match=re.escape(url)):
        buffer.sample(16)
    # An add during the outage is kept (queued) and committed once the store is back.
    added.append(make_trajectory(2, 2, 1000))
    buffer.add_trajectories(added[-1:])
    assert len(buffer) == 4

    s3_proxy.go_up()
    buffer.flush()
    buffer.close()
    assert read_index(url, s3_direct_options)["trajectory_id_list"] == [0, 1, 2, 3]
    layout, documents = open_store(url, s3_direct_options)
    for tid, trajectory in enumerate(added):
        entry = documents.trajectory_index["trajectory_index"][str(tid)]
        assert_same_trajectory(layout.read(entry), trajectory)


@pytest.mark.usefixtures("fast_s3_retries")
def test_unreachable_store_is_unavailable_not_missing(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any]
):
    url = f"s3://{s3_bucket}/ckpt"
    buffer = TrajectoryReplayBuffer(storage_options=s3_options)
    fill(buffer, [(2, 2), (2, 2)])
    buffer.save_checkpoint(url)
    s3_proxy.go_down()
    for action in (
        lambda: TrajectoryReplayBuffer(storage_options=s3_options).load_checkpoint(url),
        lambda: TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url + "-new", storage_options=s3_options
        ).add_trajectories([make_trajectory(2, 2, 0)]),
    ):
        with pytest.raises(StorageUnavailableError, match=re.escape(url)) as info:
            action()
        assert not isinstance(info.value, CheckpointNotFoundError)
        assert isinstance(info.value, OSError)  # docs/behaviour.md: what `except OSError` catches
    s3_proxy.go_up()
    restored = TrajectoryReplayBuffer(storage_options=s3_options)
    restored.load_checkpoint(url)
    assert restored.trajectory_ids == [0, 1]


@pytest.mark.usefixtures("fast_s3_retries")
def test_server_errors_mid_write_and_mid_sample_then_recovery(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict
):
    url = f"s3://{s3_bucket}/store"
    buffer = one_row_cached(url, s3_options, seed=5, window=0)
    added = fill(buffer, [(4, 2), (2, 3)])
    buffer.flush()
    s3_proxy.fail_with(503)
    added += fill_from(buffer, 14, [(3, 2)])
    with pytest.raises(WriterFailedError, match=re.escape(url)) as failure:
        buffer.flush(timeout=5)
    assert isinstance(failure.value.__cause__, StorageUnavailableError)
    assert read_index(url, s3_direct_options)["trajectory_id_list"] == [0, 1]
    with pytest.raises(StorageUnavailableError, match=re.escape(url)):
        for _ in range(20):  # trajectory 0 is no longer cached: some draw must miss
            buffer.sample(8)
    s3_proxy.fail_with(None)
    buffer.flush()
    assert read_index(url, s3_direct_options)["trajectory_id_list"] == [0, 1, 2]
    s3_proxy.slow_down(0.05)  # slow but within the client's timeouts: still exact
    assert_rows_consistent(buffer.sample(32))
    buffer.close()
    layout, documents = open_store(url, s3_direct_options)
    for tid, trajectory in enumerate(added):
        entry = documents.trajectory_index["trajectory_index"][str(tid)]
        assert_same_trajectory(layout.read(entry), trajectory)


def fill_from(
    buffer: TrajectoryReplayBuffer, base: int, sizes: list[tuple[int, int]]
) -> list[Trajectory]:
    added = []
    for T, B in sizes:
        added.append(make_trajectory(T, B, base))
        buffer.add_trajectories([added[-1]])
        base += T * B
    return added
