"""Many writers, one store: four processes append at once, one is SIGKILLed.

Each writer reports the ids it has flushed; afterwards the store (read as every reader
reads it) lists all of them, once each, with the content their writer gave them.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from many_writers_worker import expected, write

from rbzarr import StoreExistsError, TrajectoryReplayBuffer, open_buffer
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index.slots import ID_STRIDE

WRITERS = 4
PER_WRITER = 20
VICTIM = 1  # the writer killed once it has flushed KILL_AFTER trajectories
KILL_AFTER = 5


def reported(path: Path) -> dict[int, str]:
    lines = path.read_text().split("\n") if path.exists() else []
    return {int(i): name for i, name in (line.split() for line in lines if line.strip())}


def run_writers(tmp_path: Path, store: str, options: dict[str, Any]) -> dict[int, str]:
    """Start the writers, SIGKILL the victim mid-way, wait for the rest; what they flushed."""
    # Not "fork": a child of a process whose zarr event loop runs would hang in it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["many_writers_worker"])
    reports = [tmp_path / f"writer-{w}.txt" for w in range(WRITERS)]
    processes = [
        context.Process(target=write, args=(store, options, w, PER_WRITER, str(reports[w])))
        for w in range(WRITERS)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 60
    while len(reported(reports[VICTIM])) < KILL_AFTER and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(processes[VICTIM].pid, signal.SIGKILL)  # type: ignore[arg-type]
    for process in processes:
        process.join(60)
    codes = [process.exitcode for process in processes]
    assert codes[VICTIM] == -signal.SIGKILL
    assert [c for w, c in enumerate(codes) if w != VICTIM] == [0] * (WRITERS - 1)
    flushed: dict[int, str] = {}
    for report in reports:
        got = reported(report)
        assert not set(got) & set(flushed), "two writers reported the same id"
        flushed.update(got)
    assert len(flushed) >= (WRITERS - 1) * PER_WRITER + KILL_AFTER
    return flushed


def check_store(
    store: str, options: dict[str, Any], flushed: dict[int, str], read_all: bool = True
) -> None:
    """Every flushed id listed once with its writer's entry and data; on S3 (slow reads)
    the data of one trajectory per writer is compared, the others' presence checked."""
    view = open_buffer(store, options)
    listed = view.ids
    assert len(listed) == len(set(listed))
    assert set(flushed) <= set(listed)
    # The victim committed at most one trajectory it did not live to report.
    assert len(listed) - len(flushed) in (0, 1)
    compared: set[int] = set()
    for trajectory_id in listed:
        name = view.entries[trajectory_id]["model_weights_id"]
        writer, k = (int(part) for part in name[1:].split("k"))
        assert trajectory_id not in flushed or flushed[trajectory_id] == name
        assert view.layout.audit().contains(view.entries[trajectory_id])
        if read_all or writer not in compared:
            compared.add(writer)
            got = view.trajectory(trajectory_id)
            assert torch.equal(got.rewards, expected(writer, k).rewards)
    if not read_all:
        return
    # A buffer loading the store sees the same union; verify finds at most the killed
    # writer's unfinished trajectory (data no index lists).
    buffer = TrajectoryReplayBuffer(sample_window_size=0)
    buffer.load_checkpoint(store)
    assert buffer.trajectory_ids == listed
    problems = verify_store(store).problems
    assert [p.kind for p in problems] in ([], ["orphan"])


def test_four_local_writers_and_a_kill_lose_nothing_flushed(tmp_path):
    store = str(tmp_path / "store")
    flushed = run_writers(tmp_path, store, {})
    check_store(store, {}, flushed)
    # The killed writer's slot is free again at once (its lock died with it): a new
    # writer takes the lowest slot and continues after its ids.
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as resumed:
        assert resumed.trajectory_counter // ID_STRIDE == 0


@pytest.mark.s3
@pytest.mark.slow
def test_four_s3_writers_and_a_kill_lose_nothing_flushed(tmp_path, s3_bucket, s3_direct_options):
    store = f"s3://{s3_bucket}/shared"
    flushed = run_writers(tmp_path, store, s3_direct_options)
    check_store(store, s3_direct_options, flushed, read_all=False)


def test_a_live_reader_sees_the_commits_at_its_next_refresh(tmp_path):
    store = str(tmp_path / "store")
    writer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    writer.add_trajectories([expected(0, 0)])
    writer.flush()
    view = open_buffer(store, refresh_interval=0.0)
    other = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)  # a second slot
    seen: list[list[int]] = []

    def watch() -> None:  # refreshes while both slots commit: only whole commits appear
        while len(view.ids) < 3:
            view.refresh()
            seen.append(list(view.ids))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    writer.add_trajectories([expected(0, 1)])
    other.add_trajectories([expected(1, 0)])
    writer.flush()
    other.flush()
    watcher.join(60)  # liveness only: the refresh after the flushes ends the loop
    assert not watcher.is_alive()
    assert seen[-1] == [0, 1, ID_STRIDE]
    assert all(ids in ([0], [0, 1], [0, ID_STRIDE], [0, 1, ID_STRIDE]) for ids in seen)
    # One refresh after the flushes is enough: a fresh view agrees.
    assert open_buffer(store).ids == view.ids == [0, 1, ID_STRIDE]
    writer.close()
    other.close()


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_rlinf_formats_refuse_a_second_concurrent_writer(tmp_path, fmt):
    store = str(tmp_path / "store")
    options = {"auto_save": True, "auto_save_path": store, "trajectory_format": fmt}
    first = TrajectoryReplayBuffer(**options)
    first.add_trajectories([expected(0, 0)])
    first.flush()
    with pytest.raises(StoreExistsError, match="one writer at a time"):
        TrajectoryReplayBuffer(**options)
    assert sorted(os.listdir(store)) == sorted(
        ["metadata.json", "trajectory_index.json", f"trajectory_0_w0k0.{fmt}"]
    )
    first.close()
    with TrajectoryReplayBuffer(**options) as second:  # free again once the first closed
        assert second.trajectory_counter == 1


def test_a_lone_writer_writes_the_store_it_always_wrote(tmp_path):
    store = tmp_path / "store"
    for k in range(2):
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store)) as buffer:
            buffer.add_trajectories([expected(0, k)])
    assert sorted(os.listdir(store)) == [
        "index",
        "metadata.json",
        "trajectories",
        "trajectory_index.json",
        "zarr.json",
    ]
    view = open_buffer(str(store))
    assert view.ids == [0, 1]


def test_a_reader_does_not_race_a_slots_first_commit(tmp_path):
    store = tmp_path / "store"
    with (
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store)) as first,
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store)) as second,
    ):
        first.add_trajectories([expected(0, 0)])
        second.add_trajectories([expected(1, 0)])
        first.flush()
        second.flush()
    slot = store / "writers" / "1"
    # The moment of a slot's first commit before its first record lands (its index folder
    # made, nothing in it yet): readers (and a writer opening the store) see the slot as
    # not committed yet.
    (slot / "index").rename(slot / "index.later")
    (slot / "index" / "log").mkdir(parents=True)
    assert open_buffer(str(store)).ids == [0]
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store)) as third:
        assert len(third) == 0  # opened: no error
    shutil.rmtree(slot / "index")
    (slot / "index.later").rename(slot / "index")
    assert open_buffer(str(store)).ids == [0, ID_STRIDE]
