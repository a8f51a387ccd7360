"""Layout 2 on S3 (moto behind the test proxy): byte ranges per batch, and damaged shards."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory, store_reader
from test_shards import DAMAGE, ZSTD, bits, fill_trajectory, undecodable
from zarr.codecs import ZstdCodec

from benchmarks.accounting import CountingByteSource
from benchmarks.s3_server import S3Proxy
from rbzarr import CorruptStoreError, TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import remote
from rbzarr.storage.zarr.rows import reset_row_elements

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

INLINE_DEFAULT = remote.INLINE_SHARD_BYTES


@pytest.fixture(autouse=True)
def _every_shard_read_from_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards here are tiny: keep them out of the group documents, so the damage done
    to shard objects is met (the tests of the copies set their own bound)."""
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)


SIZES = [(6, 4), (4, 4), (8, 4)]
# Flat keys and the bytes of one row of each (make_trajectory's fields).
ROW_BYTES = {
    "actions": 16,
    "rewards": 8,
    "dones": 8,
    "prev_logprobs": 8,
    "forward_inputs/tokens": 8,
    "curr_obs/state": 24,
    "next_obs/state": 24,
}


def fill(url: str, options: dict[str, Any], layout: dict[str, Any] | None = None) -> None:
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=options, layout_options=layout
    ) as buffer:
        base = 0
        for T, B in SIZES:
            buffer.add_trajectories([make_trajectory(T, B, base)])
            base += T * B


def reader(
    url: str, options: dict[str, Any], stats: CountingByteSource, **layout: Any
) -> TrajectoryReplayBuffer:
    return store_reader(url, options, seed=3, layout_options={"byte_source": stats, **layout})


def coalesced_ranges(numbers: np.ndarray) -> tuple[int, int]:
    """Distinct byte ranges (touching rows of one shard merged) and their bytes."""
    pieces: set[tuple[int, str, int]] = set()
    for number in numbers.tolist():
        base = 0
        for tid, (T, B) in enumerate(SIZES):
            if number < base + T * B:
                row = np.array([number - base])
                for key in ROW_BYTES:
                    epochs = 1 if key == "dones" else 0
                    pieces.add((tid, key, int(reset_row_elements(row, T, B, epochs)[0])))
                break
            base += T * B
    ordered = sorted(pieces)
    runs = sum(
        1
        for i, piece in enumerate(ordered)
        if i == 0 or piece[:2] != ordered[i - 1][:2] or piece[2] != ordered[i - 1][2] + 1
    )
    return runs, sum(ROW_BYTES[key] for _, key, _ in ordered)


def test_a_batch_is_one_round_of_coalesced_ranges(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: Any
) -> None:
    monkeypatch.setattr(remote, "WHOLE_SHARD_BYTES", 0)  # every shard read by ranges
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # and no shard inline
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    stats = CountingByteSource()
    buffer = reader(url, s3_options, stats, range_gap=0)
    buffer.sample(8)  # opens every trajectory: its group document and shard indexes
    for n in (1, 17, 60):
        s3_proxy.reset_log()
        stats.requests = stats.bytes = 0
        numbers = assert_rows_consistent(buffer.sample(n)).numpy()
        requests, nbytes = coalesced_ranges(numbers)
        logged = s3_proxy.requests
        assert {r.method for r in logged} == {"GET"}  # no HEAD, no listing
        assert all("/c/0" in r.key for r in logged)  # shard bytes only: indexes are cached
        assert len(logged) == requests == stats.requests
        assert stats.bytes == nbytes  # exactly the sampled rows' bytes
    buffer.close()


def test_small_shards_come_whole_with_their_index_and_cost_no_request_after(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # no copies in the group documents
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    stats = CountingByteSource()
    buffer = reader(url, s3_options, stats)
    s3_proxy.reset_log()
    first = assert_rows_consistent(buffer.sample(8))
    # One group document per trajectory and one request per shard (whole, index included).
    opened = [r.key for r in s3_proxy.requests]
    assert len(set(opened)) == len(opened)
    documents = [key for key in opened if key.endswith("/zarr.json")]
    assert sorted(d.rsplit("/", 2)[-2] for d in documents) == ["0", "1", "2"]
    shards = {key.split("/trajectories/")[1].split("/c/")[0] for key in opened if "/c/" in key}
    arrays = {*ROW_BYTES, "versions"}  # versions: 1-d, opened but not sampled by rows
    assert shards == {f"{tid}/{key}" for tid in range(len(SIZES)) for key in arrays}
    assert len(opened) == len(SIZES) * (1 + len(arrays))
    s3_proxy.reset_log()
    again = assert_rows_consistent(buffer.sample(60))
    assert s3_proxy.requests == []
    assert len(first) == 8 and len(again) == 60
    buffer.close()


def test_tiny_shards_open_from_their_group_document_without_a_request(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{s3_bucket}/store"
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 200)  # some shards stay out
    fill(url, s3_options)
    stats = CountingByteSource()
    buffer = reader(url, s3_options, stats)
    s3_proxy.reset_log()
    inline = assert_rows_consistent(buffer.sample(40)).numpy()
    requested = _keys(s3_proxy)
    fetched = {key.split("/trajectories/")[1].split("/c/")[0] for key in requested}
    # Only the shards over 200 bytes are fetched: the rest came with the group documents.
    location = Location.from_url(url, s3_options)
    held = set()
    for tid in range(len(SIZES)):
        raw = location.read_bytes("trajectories", str(tid), "zarr.json")
        arrays = json.loads(raw)["attributes"]["rbzarr_layout"]["arrays"]
        held |= {f"{tid}/{key}" for key, d in arrays.items() if remote.INLINE in d}
    described = {f"{tid}/{key}" for tid in range(len(SIZES)) for key in [*ROW_BYTES, "versions"]}
    assert held and held != described
    assert {key for key in fetched if not key.endswith("zarr.json")} == described - held
    assert len(requested) == len(SIZES) + len(described - held)
    buffer.close()
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)
    copy = f"s3://{s3_bucket}/plain"
    fill(copy, s3_options)
    plain = reader(copy, s3_options, CountingByteSource())
    np.testing.assert_array_equal(assert_rows_consistent(plain.sample(40)).numpy(), inline)
    plain.close()


def test_a_damaged_copy_in_a_group_document_is_a_named_error(
    s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", INLINE_DEFAULT)
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)

    def damage(document: dict[str, Any]) -> dict[str, Any]:
        arrays = document["attributes"]["rbzarr_layout"]["arrays"]
        arrays["rewards"][remote.INLINE] = arrays["rewards"][remote.INLINE][:-8]
        return document

    _edit_document(url, s3_options, 1, damage)
    with (
        reader(url, s3_options, CountingByteSource()) as buffer,
        pytest.raises(CorruptStoreError, match=r"trajectories/1/rewards: its layout"),
    ):
        for _ in range(20):
            buffer.sample(40)


def _keys(proxy: S3Proxy) -> list[str]:
    return [r.key for r in proxy.requests]


def _edit_document(url: str, options: dict[str, Any], tid: int, edit: Any) -> None:
    location = Location.from_url(url, options)
    raw = location.read_bytes("trajectories", str(tid), "zarr.json")
    location.write_bytes(
        json.dumps(edit(json.loads(raw))).encode(), "trajectories", str(tid), "zarr.json"
    )


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_shard_on_s3_is_a_named_error(
    s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict[str, Any], damage: str
) -> None:
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    transform, message = DAMAGE[damage]
    _damage(url, s3_direct_options, lambda blob, _: transform(blob))
    with pytest.raises(CorruptStoreError, match=message) as info:
        reader(url, s3_options, CountingByteSource()).sample(64)
    assert "trajectories/1/curr_obs/state" in str(info.value)


def test_inner_chunk_on_s3_that_does_not_decode_is_a_named_error(
    s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict[str, Any]
) -> None:
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options, {"codecs": {**ZSTD, "rewards": ZstdCodec(level=1)}})
    _damage(url, s3_direct_options, undecodable)
    with pytest.raises(CorruptStoreError, match="does not decode") as info:
        reader(url, s3_options, CountingByteSource()).sample(64)
    assert "trajectories/1/curr_obs/state" in str(info.value)


def _damage(url: str, options: dict[str, Any], transform: Any) -> None:
    location = Location.from_url(url, options).child("trajectories", "1")
    group = json.loads(location.read_bytes("zarr.json"))
    described = group["attributes"]["rbzarr_layout"]["arrays"]["curr_obs/state"]
    names = ("curr_obs", "state", "c", "0", "0", "0")
    location.write_bytes(transform(location.read_bytes(*names), described), *names)


def test_an_array_of_fill_values_puts_no_object_and_reads_back_with_and_without_the_cache(
    s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", INLINE_DEFAULT)
    url = f"s3://{s3_bucket}/store"
    want = fill_trajectory()
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_options
    ) as buffer:
        buffer.add_trajectories([want])
    stored = Location.from_url(url, s3_options).list_files("trajectories", "0")
    assert sorted(stored) == ["actions/c/0/0/0", "rewards/c/0/0/0", "zarr.json"]
    for options in ({}, {"local_cache_dir": tmp_path / "cache"}):
        with store_reader(url, s3_options, **options) as buffer:
            got = buffer.trajectory(0).tensors()
            for key, value in want.tensors().items():
                assert torch.equal(bits(got[key]), bits(value)), key
            assert not buffer.sample(16)["dones"].any()
