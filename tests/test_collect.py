"""``rbzarr gc``: what a collection deletes, what it never deletes, and how it fails.

The model: after ``gc --keep-last N`` the store lists its last N trajectories plus every
one a live checkpoint pins, each with its data; everything else is gone, the id counter
never goes back, and ``verify`` is clean (after ``--repair`` where a crash left work).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import assert_checkpoint_loads, make_trajectory
from faults import Faults
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import CheckpointConflictError, StorageUnavailableError, TrajectoryReplayBuffer
from rbzarr.analysis.collect import collect_store
from rbzarr.analysis.verify import verify_store
from rbzarr.cli.main import main
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location

ROOT = Path(__file__).resolve().parents[1]


def traj(i: int):
    return make_trajectory(2, 2, 100 * i)


def listed(store: Path) -> list[int]:
    documents = read_store_documents(Location.from_url(store))
    return list(documents.trajectory_index["trajectory_id_list"])


def stored(store: Path) -> set[int]:
    return {int(p.name) for p in (store / "trajectories").iterdir() if p.name.isdigit()}


def build(store: Path, count: int, checkpoints: dict[int, int], root: Path) -> dict[Path, list]:
    """``count`` trajectories; after add ``k`` a manifest of the window ``checkpoints[k]``."""
    saved = {}
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, sample_window_size=0) as b:
        for i in range(count):
            b.add_trajectories([traj(i)])
            if i in checkpoints:
                b.sample_window_size = checkpoints[i]
                path = root / f"ckpt-{i}"
                b.save_checkpoint(path)
                saved[path] = b.trajectory_ids[-checkpoints[i] :]
                b.sample_window_size = 0
    return saved


def assert_collected(store: Path, count: int, keep: int, saved: dict[Path, list]) -> None:
    pinned = {i for ids in saved.values() for i in ids}
    want = [i for i in range(count) if i >= count - keep or i in pinned]
    assert listed(store) == want
    assert stored(store) == set(want)
    assert verify_store(str(store)).ok
    for path, ids in saved.items():
        assert_checkpoint_loads(path, ids, traj)
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as again:
        assert again.trajectory_counter == count  # ids are never reused


@settings(max_examples=6, deadline=None)
@given(
    count=st.integers(1, 7),
    keep=st.integers(0, 8),
    checkpoints=st.dictionaries(st.integers(0, 6), st.integers(1, 3), max_size=2),
)
def test_gc_keeps_the_last_and_the_pinned(tmp_path_factory, count, keep, checkpoints):
    root = tmp_path_factory.mktemp("gc")
    saved = build(root / "store", count, checkpoints, root)
    dry = collect_store(str(root / "store"), keep, dry_run=True)
    assert listed(root / "store") == list(range(count))  # a dry run changes nothing
    plan = collect_store(str(root / "store"), keep)
    assert (plan.deleted, plan.pinned) == (dry.deleted, dry.pinned)
    assert_collected(root / "store", count, keep, saved)


def test_gc_refuses_while_a_buffer_writes(tmp_path):
    store = tmp_path / "store"
    build(store, 3, {}, tmp_path)
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as writer:
        writer.add_trajectories([traj(3)])
        writer.flush()
        with pytest.raises(CheckpointConflictError, match="a buffer writes writer slot 0"):
            collect_store(str(store), 1)
    assert listed(store) == [0, 1, 2, 3]


def test_gc_refuses_a_pt_store_and_bad_arguments(tmp_path):
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "pt", trajectory_format="pt"
    ) as buffer:
        buffer.add_trajectories([traj(0)])
    with pytest.raises(CheckpointConflictError, match="zarr stores only"):
        collect_store(str(tmp_path / "pt"), 0)
    with pytest.raises(ValueError, match="keep_last must be a whole number >= 0, got -1"):
        collect_store(str(tmp_path / "pt"), -1)
    result = CliRunner().invoke(main, ["gc", str(tmp_path / "nowhere"), "--keep-last", "1"])
    assert result.exit_code != 0 and "no folder" in result.output


def test_gc_command(tmp_path):
    saved = build(tmp_path / "store", 6, {3: 2}, tmp_path)
    args = ["gc", str(tmp_path / "store"), "--keep-last", "1"]
    result = CliRunner().invoke(main, [*args, "--dry-run", "--json"])
    plan = json.loads(result.output)
    assert (plan["deleted"], plan["pinned"], plan["kept"]) == ([0, 1, 4], [2, 3], 3)
    result = CliRunner().invoke(main, args)
    assert "deleted 3 trajectories (0-1,4); kept 3, of which 2 pinned" in result.output
    assert_collected(tmp_path / "store", 6, 1, saved)


def test_gc_of_a_store_with_two_writers(tmp_path):
    """The last N of the union readers list, whichever slot wrote them; both logs rewritten."""
    store = tmp_path / "store"
    options = {"auto_save": True, "auto_save_path": store, "sample_window_size": 0}
    with TrajectoryReplayBuffer(**options) as first, TrajectoryReplayBuffer(**options) as second:
        for k in range(3):
            for buffer in (first, second):
                buffer.add_trajectories([traj(len(buffer) + 10 * k)])
                buffer.flush()
        union = listed(store)
    assert len(union) == 6 and len({i // 10**9 for i in union}) == 2  # two slots' ids
    plan = collect_store(str(store), 3)
    assert plan.deleted == union[:3]
    assert listed(store) == union[3:]
    assert stored(store) == set(union[3:])
    assert verify_store(str(store)).ok


@pytest.mark.s3
def test_gc_on_s3(s3_bucket, s3_options):
    url = f"s3://{s3_bucket}/store"
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, sample_window_size=1, storage_options=s3_options
    ) as buffer:
        buffer.add_trajectories([traj(i) for i in range(4)])
        buffer.save_checkpoint(f"s3://{s3_bucket}/ckpt")  # pins 3
        buffer.add_trajectories([traj(4)])
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_options
    ) as writer:
        writer.add_trajectories([traj(5)])
        writer.flush()
        with pytest.raises(CheckpointConflictError, match="a buffer writes writer slot"):
            collect_store(url, 1, s3_options)
    plan = collect_store(url, 1, s3_options)
    assert (plan.deleted, plan.pinned) == ([0, 1, 2, 4], [3])
    documents = read_store_documents(Location.from_url(url, s3_options))
    assert documents.trajectory_index["trajectory_id_list"] == [3, 5]
    assert verify_store(url, s3_options).ok
    loaded = TrajectoryReplayBuffer(storage_options=s3_options)
    loaded.load_checkpoint(f"s3://{s3_bucket}/ckpt")
    assert torch.equal(loaded.trajectory(3).rewards, traj(3).rewards)


# -- every storage call failing, then recovering -------------------------------------------------
@pytest.mark.parametrize("every", [pytest.param(True, marks=pytest.mark.slow), False])
def test_every_storage_call_of_a_collection_fails_in_turn(tmp_path, monkeypatch, every):
    """Every call fails before and after its work (``every``), or only the writes fail."""
    faults = Faults(monkeypatch)
    counter = itertools.count()

    def run(k: int | None, kind: str) -> list[str]:
        root = tmp_path / f"case-{next(counter)}"
        saved = build(root / "store", 5, {1: 1}, root)
        if k is None:
            faults.count()
        else:
            faults.arm(k, kind)
        try:
            collect_store(str(root / "store"), 2)
        except (StorageUnavailableError, OSError):
            pass
        finally:
            faults.disarm()
        calls = list(faults.calls)
        # Nothing kept is lost meanwhile; the same call again finishes the job.
        assert {1, 3, 4} <= set(listed(root / "store")) <= stored(root / "store")
        collect_store(str(root / "store"), 2)
        report = verify_store(str(root / "store"))
        if not report.ok:
            assert verify_store(str(root / "store"), repair=True).ok
        assert_collected(root / "store", 5, 2, saved)
        return calls

    calls = run(None, "fail")
    assert "write_bytes" in calls and "delete" in calls
    cases = [
        (k, kind)
        for k, name in enumerate(calls)
        for kind in ("fail", "lost")
        if every or (name == "write_bytes" and kind == "fail")
    ]
    for k, kind in cases:
        try:
            run(k, kind)
        except AssertionError as exc:
            raise AssertionError(f"call {k} ({calls[k]}), {kind}: {exc}") from exc


# -- kill -9 at every step -----------------------------------------------------------------------
_KILLER = """
import os, signal, sys
from rbzarr.analysis.collect import collect_store
from rbzarr.storage.io.location import Location

for step, store in enumerate(sys.argv[1:]):
    pid = os.fork()
    if pid == 0:
        calls = [0]
        for name in ("write_bytes", "delete"):
            original = getattr(Location, name)

            def dying(self, *args, _original=original, **kwargs):
                if calls[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
                return _original(self, *args, **kwargs)

            setattr(Location, name, dying)
        collect_store(store, 2)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status):
        print(step)
        sys.exit(0)
sys.exit(1)
"""
STEPS = 12  # more than a collection of this store writes and deletes


@pytest.mark.slow
def test_kill_at_every_step_of_a_collection(tmp_path):
    """Killed before each write and delete of a collection (a forked child per step)."""
    stores, saved = [], []
    for step in range(STEPS):
        root = tmp_path / f"step-{step}"
        saved.append(build(root / "store", 5, {1: 1}, root))
        stores.append(str(root / "store"))
    done = subprocess.run(
        [sys.executable, "-c", _KILLER, *stores],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=True,
    )
    completed = int(done.stdout)
    assert completed >= 4  # the record, the log's files, the data, the record again
    for step in range(completed + 1):
        store = Path(stores[step])
        # The store reads; nothing kept is lost; verify --repair or the next gc finishes.
        assert {1, 3, 4} <= set(listed(store)) <= stored(store)
        if not verify_store(str(store)).ok:
            assert verify_store(str(store), repair=True).ok
        collect_store(str(store), 2)
        assert_collected(store, 5, 2, saved[step])
