"""The frames of an auto-saved trajectory are copied once on their way to storage.

``add_trajectories`` copies each tensor once, into a staging buffer, and the writer hands
that buffer to the file or the object store as it is: an uncompressed shard's index goes
into the buffer's spare bytes, so no join builds the shard again, and the local cache is
written from the same buffer.  The copies are counted by the resident high-water mark of a
fresh process (:mod:`copies_worker`).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from copies_worker import B, T, frames_trajectory
from faults import KINDS, Faults

from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.registry import open_store
from rbzarr.storage.zarr import publish

WORKER = Path(__file__).with_name("copies_worker.py")
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs"
)


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """Frame sizes the resident set grew by over one add and flush, per store (one worker
    process measures them all)."""
    root = tmp_path_factory.mktemp("copies")
    stores = {
        "local": str(root / "store"),
        "object": f"memory://{root.name}/store",
        "object+local cache": f"memory://{root.name}/cached,{root / 'cache'}",
    }
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    done = subprocess.run(
        [sys.executable, str(WORKER), *stores.values()],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(zip(stores, map(float, done.stdout.split()), strict=True))


def test_frames_reach_a_local_file_with_one_copy(copies: dict[str, float]) -> None:
    """Local files: the staging copy is the only one."""
    assert 0.8 < copies["local"] < 1.5, f"{copies['local']:.2f} copies of the frames"


@pytest.mark.parametrize("store", ["object", "object+local cache"])
def test_frames_reach_an_object_store_with_one_copy_before_the_put(
    copies: dict[str, float], store: str
) -> None:
    """An object store (fsspec's memory filesystem, in the worker's own process): the
    staging copy, then the stored object itself (the bytes the store keeps: the "file");
    no join of the shard's parts before the PUT, and none for the local cache's copy."""
    measured = copies[store]
    assert 1.8 < measured < 2.5, f"{measured:.2f} copies of the frames, the stored one included"


@pytest.mark.parametrize("codec", ["raw", "png"])
def test_tensors_overwritten_at_once_after_add_are_stored_as_they_were(
    tmp_path: Path, codec: str
) -> None:
    """The caller overwrites its tensors the moment ``add_trajectories`` returns: the store
    holds the values they had at the call."""
    url = str(tmp_path / "store")
    original, given = frames_trajectory(2), frames_trajectory(2)
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, layout_options={"codecs": {"default": codec}}
    ) as buffer:
        buffer.add_trajectories([given])
        for tensor in given.tensors().values():
            tensor.zero_()
        buffer.flush()
    layout, documents = open_store(url)
    stored = layout.read(documents.trajectory_index["trajectory_index"]["0"])
    for key, value in original.tensors().items():
        assert torch.equal(stored.tensors()[key], value), key


def fail_each_call_then_heal(
    faults: Faults,
    url: Callable[[int], str],
    trajectory: Callable[[int], Trajectory],
    *,
    overwrite: bool,
) -> list[str]:
    """Add and flush trajectory 0, then trajectory 1 with each of its storage calls failing
    in turn (once, for a while, hanging): both are listed once, with the values they had
    at the add (the caller overwrote trajectory 1's tensors at once if ``overwrite``).
    Returns the storage calls of the unfaulted run."""

    def run(case: int, k: int | None, kind: str) -> list[str]:
        with TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url(case), layout_options={"codecs": {"default": "raw"}}
        ) as buffer:
            buffer.add_trajectories([trajectory(0)])
            buffer.flush()
            faults.count() if k is None else faults.arm(k, kind)
            given = trajectory(1)
            buffer.add_trajectories([given])
            if overwrite:
                for tensor in given.tensors().values():
                    tensor.fill_(1)
            buffer.flush()
            calls = list(faults.calls)
            faults.disarm()
        layout, documents = open_store(url(case))
        assert documents.trajectory_index["trajectory_id_list"] == [0, 1], (k, kind)
        for tid in (0, 1):
            stored = layout.read(documents.trajectory_index["trajectory_index"][str(tid)])
            for key, value in trajectory(tid).tensors().items():
                assert torch.equal(stored.tensors()[key], value), (k, kind, tid, key)
        return calls

    calls = run(0, None, "fail")
    case = itertools.count(1)
    for k in range(len(calls)):
        for kind in KINDS:
            run(next(case), k, kind)
    return calls


@pytest.mark.parametrize("where", ["local", "object"])
def test_each_storage_call_of_a_staged_write_fails_then_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Each storage call of adding and flushing a trajectory of raw frames (its shards
    written from their staging buffers) fails once, for a while, or hangs: the flush
    commits it once, with the frames it had at the call (the caller overwrote them at
    once), and the trajectory before it stays."""
    small = (T, B, 8, 8, 3)

    def trajectory(seed: int) -> Trajectory:
        g = torch.Generator().manual_seed(seed)
        return Trajectory(
            max_episode_length=T,
            rewards=torch.randn(T, B, generator=g),
            dones=torch.eye(T, B, dtype=torch.bool),  # not all fill values: a shard is written
            curr_obs={"image": torch.randint(0, 256, small, generator=g, dtype=torch.uint8)},
        )

    def url(case: int) -> str:
        return (
            str(tmp_path / f"s{case}") if where == "local" else f"memory://{tmp_path.name}/{case}"
        )

    calls = fail_each_call_then_heal(Faults(monkeypatch), url, trajectory, overwrite=True)
    # The shards (rewards, dones, frames), the group's document, the log's record.
    assert len(calls) >= 5, calls


def test_each_file_written_side_by_side_fails_then_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's large files are written on the io pool, side by side: each storage call of
    such a write fails once, for a while, or hangs; the flush then commits the trajectory
    once, whole, and the one before it stays."""
    monkeypatch.setattr(publish, "PARALLEL_WRITE_BYTES", 256)  # each frame key is one such file
    faults = Faults(monkeypatch)
    threads: set[str] = set()
    counted = publish.write_file

    def write_file(*args: object, **kwargs: object) -> None:
        threads.add(threading.current_thread().name)
        counted(*args, **kwargs)

    monkeypatch.setattr(publish, "write_file", write_file)

    def trajectory(seed: int) -> Trajectory:
        g = torch.Generator().manual_seed(seed)
        frames = (T, B, 8, 8, 3)
        return Trajectory(
            max_episode_length=T,
            rewards=torch.randn(T, B, generator=g),
            curr_obs={
                "main": torch.randint(0, 256, frames, generator=g, dtype=torch.uint8),
                "wrist": torch.randint(0, 256, frames, generator=g, dtype=torch.uint8),
            },
        )

    calls = fail_each_call_then_heal(
        faults, lambda case: str(tmp_path / f"s{case}"), trajectory, overwrite=False
    )
    assert any(name.startswith("rbzarr-io") for name in threads), threads  # side by side
    assert calls.count("write_file") >= 3, calls  # rewards, then both frame keys at once
