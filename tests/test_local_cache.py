"""The local shard cache of remote stores: write-through, integrity, eviction, sharing, faults.

S3 is moto behind the test proxy, which logs every request the client makes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory, storage_buffer, store_reader

from benchmarks.s3_server import S3Proxy
from rbzarr import StorageUnavailableError, TrajectoryReplayBuffer
from rbzarr.storage.io.backends import S3_DEFAULTS, S3_RETRIES
from rbzarr.storage.zarr import remote, shard_cache, shard_index
from rbzarr.storage.zarr.shard_cache import ShardCache
from rbzarr.storage.zarr.spec import ArraySpec

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]

SIZES = [(6, 4), (4, 4), (8, 4), (6, 4)]


@pytest.fixture(autouse=True)
def _every_shard_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards here are tiny: keep them out of the group documents, so they are cached."""
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)


def fill(url: str, options: dict[str, Any], cache: Path | None = None) -> list[int]:
    """A store of ``SIZES``; returns the row numbers each trajectory starts at."""
    bases, base = [], 0
    with TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=options,
        local_cache_dir=cache,
    ) as buffer:
        for T, B in SIZES:
            buffer.add_trajectories([make_trajectory(T, B, base)])
            bases.append(base)
            base += T * B
    return bases


def reader(
    url: str, options: dict[str, Any], cache: Path | None, **kw: Any
) -> TrajectoryReplayBuffer:
    return store_reader(url, options, seed=5, local_cache_dir=cache, **kw)


def draws(buffer: TrajectoryReplayBuffer, calls: list[int], first: int = 0) -> list[torch.Tensor]:
    """Row numbers of ``calls`` samples, call ``i`` drawn with generator seed ``first + i``."""
    return [
        assert_rows_consistent(buffer.sample(n, generator=torch.Generator().manual_seed(i)))
        for i, n in enumerate(calls, start=first)
    ]


def gets(proxy: S3Proxy) -> list[str]:
    """Keys of the GETs of trajectory data since the last reset (index documents left out)."""
    return [r.key for r in proxy.requests if r.method == "GET" and "/trajectories/" in r.key]


def shard_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("shard") if p.is_file())


def test_reads_through_the_cache_equal_direct_reads_and_cost_no_request_once_warm(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    calls = [200, 64, 33, 100]  # the first touches every trajectory
    with reader(url, s3_options, None) as direct:
        expected = draws(direct, calls)
    s3_proxy.reset_log()
    cached = reader(url, s3_options, tmp_path / "cache")
    with cached:
        first = draws(cached, calls[:1])
        fetched = gets(s3_proxy)  # loading opened one trajectory: the rest open here
        s3_proxy.reset_log()
        rest = draws(cached, calls[1:], first=1)
        assert gets(s3_proxy) == []
    assert all(torch.equal(a, b) for a, b in zip(first + rest, expected, strict=True))
    # One group document and one GET of each whole shard, per trajectory: nothing else.
    assert len(fetched) == len(set(fetched))
    assert sum(key.endswith("/zarr.json") for key in fetched) == len(SIZES)
    assert len(shard_files(tmp_path / "cache")) == len(fetched) - len(SIZES)


def test_a_writing_buffer_keeps_what_it_wrote_and_makes_no_get_for_its_misses(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/store"
    with storage_buffer(url, s3_options, seed=2, local_cache_dir=tmp_path / "cache") as buffer:
        base = 0
        for T, B in SIZES:
            buffer.add_trajectories([make_trajectory(T, B, base)])
            base += T * B
        buffer.flush()
        s3_proxy.reset_log()
        numbers = torch.cat(draws(buffer, [50, 50, 50]))
        assert [r for r in s3_proxy.requests if r.method == "GET"] == []
    assert sorted(set(numbers.tolist())) == sorted(set(numbers.tolist()) & set(range(base)))


def test_a_truncated_edited_or_unfinished_copy_is_never_served(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url, cache = f"s3://{s3_bucket}/store", tmp_path / "cache"
    fill(url, s3_options)
    first, second = reader(url, s3_options, cache), reader(url, s3_options, cache)
    with first:
        expected = draws(first, [200])
    copies = shard_files(cache)
    truncated, edited, unrecorded = copies[0], copies[1], copies[2]
    for path in copies[:3]:
        path.chmod(0o644)
    truncated.write_bytes(truncated.read_bytes()[:-3])
    blob = bytearray(edited.read_bytes())
    blob[0] ^= 0xFF  # same size, other bytes
    time.sleep(0.01)
    edited.write_bytes(bytes(blob))
    Path(f"{unrecorded}.ok").unlink()  # as if the process died between rename and record
    (unrecorded.parent / f"shard{shard_cache.TEMP_SUFFIX}{'0' * 32}").write_bytes(b"partial")
    s3_proxy.reset_log()
    with second:  # its handles open now, from the damaged cache
        again = draws(second, [200])
    refetched = sorted(key.split("/trajectories/")[1].split("/c/")[0] for key in gets(s3_proxy))
    damaged = sorted(_store_key(cache, p) for p in copies[:3])
    assert refetched == damaged  # only the three damaged copies, each fetched once
    assert all(torch.equal(a, b) for a, b in zip(again, expected, strict=True))


def _store_key(cache: Path, copy: Path) -> str:
    """``<id>/<key>`` of a cached shard file ``<digest>/<id>-<uuid>/<key>/shard``."""
    parts = copy.relative_to(cache).parts
    return "/".join([parts[1].split("-")[0], *parts[2:-1]])


def test_two_stores_in_one_directory_never_mix(
    s3_proxy: S3Proxy, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    from benchmarks.s3_server import create_bucket, unique_bucket_name  # noqa: PLC0415

    cache = tmp_path / "cache"
    urls = []
    for offset in (0, 10_000):
        bucket = unique_bucket_name()
        create_bucket(s3_options["endpoint_url"], bucket)
        url = f"s3://{bucket}/store"
        with TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url, storage_options=s3_options
        ) as buffer:
            buffer.add_trajectories([make_trajectory(6, 4, offset)])
        urls.append(url)
    for url, offset in zip(urls, (0, 10_000), strict=True):
        with reader(url, s3_options, cache) as buffer:
            numbers = draws(buffer, [40])[0]
        assert int(numbers.min()) >= offset and int(numbers.max()) < offset + 24
    stores = sorted(p.parent.name for p in cache.glob("*/store.json"))
    assert len(stores) == 2


def test_eviction_goes_outside_the_window_first_then_least_recently_used(tmp_path: Path) -> None:
    description = {"kind": "mapped", "shape": [4, 4], "dtype": "<f4", "inner": [4, 4]}
    description["shard_bytes"] = 64 + shard_index.index_size(1)
    spec = ArraySpec.parse("rewards", description, "test")
    blob = _shard_blob(spec)
    cache = ShardCache(tmp_path, capacity=4 * spec.shard_bytes, url="s3://b/s")
    keys = [(i, f"{i:08x}-0000") for i in range(4)]
    for position, key in enumerate(keys):
        assert cache.put_shard(key, "rewards", spec, blob, "t") is not None
        cache.used([key])
        time.sleep(0.02)
        assert len(shard_files(tmp_path)) == position + 1
    cache.used([keys[0]])  # 0 is now the most recent: 1 is the least recently used
    cache.retain([keys[1], keys[2]])  # ... but in the window; 3 is not
    cache.put_shard((9, "00000009-0000"), "rewards", spec, blob, "t")
    left = {p.relative_to(tmp_path).parts[1] for p in shard_files(tmp_path)}
    assert left == {"0-00000000-0000", "1-00000001-0000", "2-00000002-0000", "9-00000009-0000"}
    cache.retain([])  # none in the window: the least recently used goes (1)
    cache.put_shard((10, "0000000a-0000"), "rewards", spec, blob, "t")
    left = {p.relative_to(tmp_path).parts[1] for p in shard_files(tmp_path)}
    assert left == {"0-00000000-0000", "2-00000002-0000", "9-00000009-0000", "10-0000000a-0000"}


def _shard_blob(spec: ArraySpec) -> bytes:
    data = np.arange(16, dtype="<f4").tobytes()
    index = shard_index.encode_index(np.array([0]), np.array([len(data)]))
    assert len(data) + len(index) == spec.shard_bytes
    return data + index


CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[4])
    import torch
    from conftest import assert_rows_consistent
    from rbzarr import TrajectoryReplayBuffer

    url, options, cache = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    buffer = TrajectoryReplayBuffer(
        seed=11, enable_cache=False, cache_size=0, sample_window_size=0, auto_save=True,
        auto_save_path=url, storage_options=options, local_cache_dir=cache,
        local_cache_bytes=1 << 20,
    )
    buffer.load_checkpoint(url)
    out = [
        assert_rows_consistent(buffer.sample(64, generator=torch.Generator().manual_seed(i)))
        .tolist() for i in range(20)
    ]
    buffer.close()
    print(json.dumps(out))
    """
)


def test_two_processes_share_one_cache_directory(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url, cache = f"s3://{s3_bucket}/store", tmp_path / "cache"
    fill(url, s3_options)
    args = [url, json.dumps(s3_options), str(cache), str(Path(__file__).parent)]
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [json.loads(child.communicate(timeout=120)[0]) for child in children]
    assert all(child.returncode == 0 for child in children)
    assert outputs[0] == outputs[1]  # same seed, same rows, whoever fetched what
    copies = shard_files(cache)
    assert len(copies) == len({p.relative_to(cache) for p in copies}) > 0
    assert all(Path(f"{p}.ok").is_file() for p in copies)


def test_an_outage_with_a_warm_cache_serves_what_it_holds(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    with reader(url, s3_options, tmp_path / "cache") as buffer:
        draws(buffer, [200])  # every trajectory is now in the cache
        s3_proxy.go_down()
        assert len(draws(buffer, [64, 64])) == 2
        assert s3_proxy.dropped == []
        # A trajectory the cache does not hold (its copy evicted) needs the store: named error.
        for folder in (tmp_path / "cache").glob("*/0-*"):
            for path in folder.rglob("*"):
                if path.is_file():
                    path.chmod(0o644)
        shard_files(tmp_path / "cache")[0].unlink()
    with reader_after_outage(url, s3_options, tmp_path / "cache", s3_proxy) as error:
        assert isinstance(error, StorageUnavailableError)
        assert url in str(error)
        # It gave up after a bounded number of tries of the one shard the cache lacks
        # (s3fs's S3_RETRIES, each of botocore's attempts), not when a clock ran out.
        tried = [request.key for request in s3_proxy.dropped]
        attempts = S3_RETRIES * S3_DEFAULTS["retries"]["max_attempts"]
        assert len(set(tried)) == 1 and 0 < len(tried) <= attempts, tried


class reader_after_outage:
    """A new reader (loaded while the store is up) sampling once the store is down; the
    proxy's log holds only the sampling's requests."""

    def __init__(self, url: str, options: dict[str, Any], cache: Path, proxy: S3Proxy) -> None:
        proxy.go_up()
        self.buffer = reader(url, options, cache)
        proxy.go_down()
        proxy.reset_log()

    def __enter__(self) -> BaseException | None:
        try:
            draws(self.buffer, [200])
        except StorageUnavailableError as exc:
            return exc
        return None

    def __exit__(self, *exc_info: object) -> None:
        self.buffer.close(wait=False)


# zarr's s3fs sessions, which nothing closes, may be collected mid-test here (see
# s3_fixtures._drop_filesystems): their warning is not this test's concern.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_steps_the_cache_aside_and_training_goes_on(
    s3_proxy: S3Proxy,
    s3_bucket: str,
    s3_options: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, cache = f"s3://{s3_bucket}/store", tmp_path / "cache"
    fill(url, s3_options)
    direct, buffer = reader(url, s3_options, None), reader(url, s3_options, cache)
    with direct:
        expected = draws(direct, [64, 64, 64])
    real_write = os.write
    refused: list[int] = []

    def write(fd: int, data: Any) -> int:
        if str(cache) in os.readlink(f"/proc/self/fd/{fd}"):
            refused.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with buffer:
        got = draws(buffer, [64, 64, 64])
    assert refused
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert shard_files(cache) == []


def test_a_bound_smaller_than_one_trajectory_is_refused(
    s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/store"
    fill(url, s3_options)
    with pytest.raises(ValueError, match="smaller than one trajectory"):
        TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=url,
            storage_options=s3_options,
            local_cache_dir=tmp_path,
            local_cache_bytes=100,
        )
    with pytest.raises(ValueError, match="positive"):
        TrajectoryReplayBuffer(local_cache_dir=tmp_path, local_cache_bytes=0)
    other = f"s3://{s3_bucket}/other"
    with TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=other,
        storage_options=s3_options,
        local_cache_dir=tmp_path,
        local_cache_bytes=100,
    ) as buffer:
        with pytest.raises(ValueError, match="smaller than one trajectory"):
            buffer.add_trajectories([make_trajectory(6, 4, 0)])
        assert len(buffer) == 0
