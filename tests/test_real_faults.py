"""Real storage faults that heal: a full disk, a folder made read-only, S3 failing one PUT.

Beside the simulated faults of ``test_faults.py``: ENOSPC on a small tmpfs (skipped where
it cannot be mounted), ``chattr +i`` on a folder of the store mid-burst (skipped where the
filesystem refuses it), and the test proxy in front of moto answering 503, dropping the
connection or stalling at each kind of PUT a commit makes.  After each, the fault is
removed, ``flush()`` returns, and every trajectory is listed exactly once with its data.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_trajectory, make_trajectory
from zarr.codecs import BloscCodec

from benchmarks.s3_server import Request, S3Proxy
from rbzarr import Trajectory, TrajectoryReplayBuffer, WriterFailedError
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class


def assert_listed_once(
    url: str, added: list[Trajectory], options: dict | None = None, closed: bool = True
) -> None:
    """The store lists ids 0..n-1 once each, holding what was added; verify is clean once
    the writer closed (its documents' mirror is written at close)."""
    location = Location.from_url(url, options)
    index = read_store_documents(location).trajectory_index
    assert index["trajectory_id_list"] == list(range(len(added)))
    layout = layout_class("zarr")(location)
    for trajectory_id, trajectory in enumerate(added):
        got = layout.read(index["trajectory_index"][str(trajectory_id)])
        assert_same_trajectory(got, trajectory)
    assert not closed or verify_store(url, options).ok


def burst(count: int, first: int = 0) -> list[Trajectory]:
    return [make_trajectory(2, 2, 4 * (first + k)) for k in range(count)]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs, unmounted after the test (skipped where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; the filler file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_loses_nothing_once_space_is_back(small_disk):
    store = small_disk / "s"
    added = burst(9)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=3)
    buffer.add_trajectories(added[:1])
    buffer.flush()
    filler = fill(small_disk)
    buffer.add_trajectories(added[1:])
    with pytest.raises(WriterFailedError, match="No space left"):
        buffer.flush(timeout=5)
    filler.unlink()
    buffer.flush()  # the cause is gone: the queued writes and their record commit
    assert_listed_once(str(store), added, closed=False)
    buffer.close()
    assert_listed_once(str(store), added)


def image_burst(count: int, first: int = 0) -> list[Trajectory]:
    """Trajectories with a 128 px camera frame of noise (it does not compress: 96 KiB)."""
    added = []
    for k in range(first, first + count):
        trajectory = make_trajectory(2, 2, 4 * k)
        noise = torch.Generator().manual_seed(k)
        frames = torch.randint(0, 256, (2, 2, 128, 128, 3), dtype=torch.uint8, generator=noise)
        trajectory.curr_obs["image"] = frames
        added.append(trajectory)
    return added


def stored_files(store: Path) -> dict[str, bytes]:
    """Every file of the store (data, log, documents), by path, with its bytes."""
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


@pytest.mark.parametrize("codec", ["shards", "zarr"])
def test_a_write_the_disk_cannot_hold_leaves_no_partial_files(small_disk, codec):
    # "zarr": the frames go through zarr's own array writes (a zarr codec object), the
    # other write path of the layout.
    options = {"codecs": {"curr_obs/image": BloscCodec(cname="lz4")}} if codec == "zarr" else {}
    store = small_disk / "s"
    added = image_burst(3)
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, seed=3, layout_options=options
    )
    buffer.add_trajectories(added[:1])
    buffer.flush()
    committed = stored_files(store)
    # Room for a trajectory's small arrays and part of its frames: the disk fills mid-write.
    filler = fill(small_disk)
    room = 150_000
    os.truncate(filler, filler.stat().st_size - room)
    free = shutil.disk_usage(small_disk).free
    buffer.add_trajectories(added[1:])
    with pytest.raises(WriterFailedError, match=r"No space left.*not in the store yet: \[1, 2\]"):
        buffer.flush(timeout=5)
    # The failed write removed what it had written: the space is free again, and the
    # committed trajectory is untouched.
    assert shutil.disk_usage(small_disk).free == free
    assert stored_files(store) == committed
    filler.unlink()
    buffer.flush()  # the retry writes both whole
    assert_listed_once(str(store), added, closed=False)
    buffer.close()
    assert_listed_once(str(store), added)


def chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} is not supported here: {done.stderr.decode().strip()}")


@pytest.mark.skipif(shutil.which("chattr") is None, reason="no chattr on this machine")
@pytest.mark.parametrize("folder", ["index/log", "trajectories"])
def test_a_folder_made_read_only_mid_burst_loses_nothing(tmp_path, folder):
    store = tmp_path / "s"
    added = burst(9)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, seed=3)
    buffer.add_trajectories(added[:1])
    buffer.flush()
    chattr("+i", store / folder)
    try:
        buffer.add_trajectories(added[1:])
        with pytest.raises(WriterFailedError):
            buffer.flush(timeout=5)
    finally:
        chattr("-i", store / folder)
    buffer.flush()
    assert_listed_once(str(store), added, closed=False)
    buffer.close()
    assert_listed_once(str(store), added)


# Which PUT a commit makes: its trajectory data, the group's marker, the log's record,
# a compacted block, the head.
MARKER = re.compile(r"/trajectories/\d+/zarr\.json$")
PUTS = {
    "data": lambda key: "/trajectories/" in key and not MARKER.search(key),
    "marker": lambda key: bool(MARKER.search(key)),
    "record": lambda key: "/index/log/" in key,
    "block": lambda key: "/index/blocks/" in key,
    "head": lambda key: key.endswith("/index/head.json"),
}
FAULTS: dict[str, dict[str, Any]] = {
    "503": {"status": 503, "count": 3},
    "drop": {"drop": True, "count": 2},
    "stall": {"delay": 1.0, "count": 1},
}


@pytest.mark.slow
@pytest.mark.s3
# A request cut off mid-way leaves s3fs's aiohttp session to be collected unclosed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:Unclosed client session:ResourceWarning")
@pytest.mark.parametrize("put", list(PUTS))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_s3_faults_at_each_kind_of_put_lose_nothing(
    put: str, fault: str, s3_proxy: S3Proxy, s3_options, s3_bucket
):
    url = f"s3://{s3_bucket}/s"
    added = burst(4)
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_options, seed=3
    )
    buffer.add_trajectories(added[:1])
    buffer.flush()
    matches = PUTS[put]

    def when(request: Request) -> bool:
        return request.method == "PUT" and matches(request.key)

    s3_proxy.fault_requests(when, **FAULTS[fault])
    buffer.add_trajectories(added[1:3])
    buffer.flush()  # the writer's retries cover the fault: flush returns, all recorded
    assert_listed_once(url, added[:3], s3_options, closed=False)
    buffer.add_trajectories(added[3:])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        buffer.close()  # its compaction PUTs a block and a head: they may meet the fault
    if warned:  # the compaction failed: every commit stands; repair rewrites the mirror
        assert "folding the index log at close failed" in str(warned[0].message)
        assert_listed_once(url, added, s3_options, closed=False)
        assert verify_store(url, s3_options, repair=True).ok
    assert_listed_once(url, added, s3_options)
