"""Crash safety: a writer SIGKILLed at random points never leaves a listed, unreadable entry.

``crash_writer.py`` runs as a fork server (one per format, both at once), so each of the
many kills costs a fork, not a fresh interpreter.  Each child continues the same store with
``load_checkpoint`` and appends until it is killed; after every kill the store is checked
through the JSON index, a fresh buffer, plain zarr and ``verify``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import zarr
from conftest import assert_rows_consistent
from crash_writer import expected_trajectory

from rbzarr import TrajectoryReplayBuffer, UncommittedWritesWarning
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class

WORKER = Path(__file__).with_name("crash_writer.py")
KILLS_PER_FORMAT = 26
# Kill delays span the child's life: opening and loading the store, then ~90 ms (zarr) or
# ~10 ms (pt) per trajectory written and committed.
DELAYS = {"zarr": (0.02, 0.6), "pt": (0.01, 0.3)}


@dataclass
class Run:
    """One format's store, its worker and what earlier checks saw."""

    fmt: str
    store: Path
    reports: Path
    worker: subprocess.Popen[str]
    log: Path
    listed: list[int] = field(default_factory=list)
    verified: set[int] = field(default_factory=set)
    fingerprints: dict[int, tuple] = field(default_factory=dict)
    kills: int = 0


def start(tmp_path: Path, fmt: str) -> Run:
    log = tmp_path / f"{fmt}-worker.log"
    reports = tmp_path / f"{fmt}-reports"
    reports.mkdir()
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=WORKER.parent,
        )
    return Run(fmt, tmp_path / f"{fmt}-store", reports, worker, log)


def report_path(run: Run) -> Path:
    """Where the child of the current kill reports the ids it committed."""
    return run.reports / f"{run.kills}.txt"


def committed_ids(path: Path) -> set[int]:
    return {int(line) for line in path.read_text().split()} if path.exists() else set()


def stop(run: Run) -> None:
    for stream in (run.worker.stdin, run.worker.stdout):
        if stream is not None:
            stream.close()
    run.worker.wait(timeout=30)


def assert_same(trajectory, trajectory_id: int, where: str) -> None:
    want = expected_trajectory(trajectory_id)
    got_fields, want_fields = trajectory.tensors(), want.tensors()
    assert list(got_fields) == list(want_fields), where
    for key, value in want_fields.items():
        assert got_fields[key].dtype == value.dtype, (where, key)
        assert torch.equal(got_fields[key], value), (where, key)
    assert trajectory.model_weights_id == want.model_weights_id, where


def check_index(run: Run) -> list[int]:
    """The index after a kill (the log, or RLinf's documents): grows monotonically, holds
    every reported commit."""
    committed = committed_ids(report_path(run))
    reused = committed & set(run.listed)
    assert not reused, f"kill {run.kills}: the resumed writer reused committed ids {reused}"
    location = Location.from_url(run.store)
    if not StoreIndex.open(location).exists:
        assert not run.listed and not committed, "committed data lost its index"
        return []
    index = read_store_documents(location).trajectory_index
    ids = [int(i) for i in index["trajectory_id_list"]]
    assert len(ids) == len(set(ids)), f"duplicate ids in the index: {ids}"
    assert ids == sorted(ids)
    assert set(run.listed) <= set(ids), "a committed trajectory vanished from the index"
    assert committed <= set(ids), "a flushed trajectory is not in the index"
    return ids


def fingerprint(run: Run, entry: dict) -> tuple:
    """Identity of every file holding one trajectory: a rewrite changes it."""
    if run.fmt == "zarr":
        paths = sorted((run.store / "trajectories" / str(entry["trajectory_id"])).rglob("*"))
    else:
        paths = [run.store / f"trajectory_{entry['trajectory_id']}_{entry['model_weights_id']}.pt"]
    stats = [(str(path), path.stat()) for path in paths if path.is_file()]
    return tuple((name, st.st_ino, st.st_mtime_ns, st.st_size) for name, st in stats)


def check_layout_reads(run: Run, ids: list[int]) -> None:
    """Every listed trajectory reads back exactly as written, through the layout.

    Each is read in full once; later kills check that its files were not rewritten.
    """
    layout = layout_class(run.fmt)(Location.from_url(run.store))
    entries = StoreIndex.assumed(layout.location).read().trajectory_index["trajectory_index"]
    for trajectory_id in ids:
        entry = entries[str(trajectory_id)]
        known = run.fingerprints.get(trajectory_id)
        if known is not None:
            assert fingerprint(run, entry) == known, f"committed {trajectory_id} was rewritten"
            continue
        assert_same(layout.read(entry), trajectory_id, f"{run.fmt} kill {run.kills}")
        run.fingerprints[trajectory_id] = fingerprint(run, entry)


def check_fresh_buffer(run: Run, ids: list[int]) -> None:
    buffer = TrajectoryReplayBuffer(seed=run.kills, sample_window_size=4)
    buffer.load_checkpoint(run.store)
    assert len(buffer) == len(ids) and buffer.trajectory_counter > max(ids)
    numbers = assert_rows_consistent(buffer.sample(32))
    valid = {1000 * i + r for i in ids[-4:] for r in range(3 * (2 + i % 4))}
    assert set(numbers.tolist()) <= valid


def check_plain_zarr(run: Run, ids: list[int]) -> None:
    """Zarr alone: every listed trajectory is a complete group (its commit marker set)."""
    root = zarr.open_group(run.store, mode="r")
    for trajectory_id in ids:
        if trajectory_id in run.verified:
            continue
        group = root[f"trajectories/{trajectory_id}"]
        assert "fields" in group.attrs, f"listed trajectory {trajectory_id} is incomplete"


def two_commits(path: Path, fmt: str) -> bytes:
    """A store of trajectories 0 and 1; returns metadata.json as it was after the first."""
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, trajectory_format=fmt)
    buffer.add_trajectories([expected_trajectory(0)])
    buffer.flush()
    first = (path / "metadata.json").read_bytes()
    buffer.add_trajectories([expected_trajectory(1)])
    buffer.close()
    return first


# RLinf's documents: a zarr store commits one log record at a time (see test_index_log.py).
@pytest.mark.parametrize("fmt", ["pt"])
def test_resume_after_a_kill_between_index_and_metadata_keeps_ids_unique(tmp_path, fmt):
    store = tmp_path / "s"
    (store / "metadata.json").parent.mkdir()
    stale = two_commits(store, fmt)
    (store / "metadata.json").write_bytes(stale)  # killed after the index, before metadata
    report = verify_store(store, repair=True)
    assert report.ok, report.problems
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format=fmt)
    buffer.load_checkpoint(store)
    assert (len(buffer), buffer.trajectory_counter) == (2, 2)
    buffer.add_trajectories([expected_trajectory(2)])
    buffer.close()
    index = json.loads((store / "trajectory_index.json").read_text())
    assert index["trajectory_id_list"] == [0, 1, 2]
    layout = layout_class(fmt)(Location.from_url(store))
    for trajectory_id in (0, 1, 2):
        entry = index["trajectory_index"][str(trajectory_id)]
        assert_same(layout.read(entry), trajectory_id, f"{fmt} id {trajectory_id}")


def torn_first_write(store: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave what a kill during the first trajectory's data write leaves.

    The layout class's ``write`` is replaced for the rest of the test: the first call
    writes a torn trajectory and fails, as a process killed there would, and every later
    call on that layout (the dead process) fails at once; other layouts write normally.
    """
    layout_type = layout_class(fmt)
    original = layout_type.write
    killed: list[object] = []

    def torn(layout, entry, trajectory) -> None:
        if killed and layout is not killed[0]:
            return original(layout, entry, trajectory)
        if killed:  # a killed process writes nothing more
            raise OSError("killed")
        killed.append(layout)
        if fmt == "zarr":
            original(layout, entry, trajectory)
            marker = store / "trajectories" / "0" / "zarr.json"
            group = json.loads(marker.read_text())
            marker.write_text(json.dumps({**group, "attributes": {}}))
        else:
            (store / f"trajectory_0_w0.pt.tmp-{'0' * 32}").write_bytes(b"PK\x03\x04 torn")
        raise OSError("killed")

    monkeypatch.setattr(layout_type, "write", torn)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format=fmt)
    buffer.add_trajectories([expected_trajectory(0)])
    with pytest.raises(Exception, match="killed"):
        buffer.close(timeout=0.5)
    with pytest.warns(
        UncommittedWritesWarning, match=rf"1 write\(s\) to {re.escape(str(store))}.*killed"
    ):
        buffer.close(wait=False)  # the process is gone: no more retries


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_a_kill_during_the_first_write_leaves_a_resumable_store(tmp_path, fmt, monkeypatch):
    store = tmp_path / "s"
    torn_first_write(store, fmt, monkeypatch)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format=fmt)
    buffer.load_checkpoint(store)  # the user's way to continue a run in place
    assert len(buffer) == 0
    buffer.add_trajectories([expected_trajectory(buffer.trajectory_counter)])
    buffer.close()
    assert verify_store(store, repair=True).ok
    index = json.loads((store / "trajectory_index.json").read_text())
    assert len(index["trajectory_id_list"]) == 1
