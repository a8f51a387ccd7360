"""``retention=``: a writer collects its slot as it appends, and never loses what it keeps.

The model: after every flush a store written with ``Retention(last=N)`` lists the last ``N``
trajectories its writer added (up to the batch a collection waits for) plus every one a
checkpoint pins, each with its data; the buffer's index lists the same; ids never go back;
``verify`` is clean (after ``--repair`` where a crash left work).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
from conftest import assert_checkpoint_loads, assert_same_trajectory, make_trajectory
from faults import Faults
from hypothesis import given, settings
from hypothesis import strategies as st
from test_collect import ROOT, listed, stored

from rbzarr import (
    DamagedTrajectoryWarning,
    Retention,
    StorageUnavailableError,
    TrajectoryReplayBuffer,
    WriterFailedError,
    open_buffer,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index.claims import CLAIM_FILE
from rbzarr.storage.index.gc_records import FOLDER as RECORDS
from rbzarr.storage.index.gc_records import open_records
from rbzarr.storage.index.slots import WRITERS
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location


def traj(i: int):
    return make_trajectory(2, 2, 100 * i)


def writer(store: Path, retention, window: int = 1, **options) -> TrajectoryReplayBuffer:
    return TrajectoryReplayBuffer(
        seed=3,
        auto_save=True,
        auto_save_path=store,
        sample_window_size=window,
        retention=retention,
        **options,
    )


def follower(store: Path, **options) -> TrajectoryReplayBuffer:
    """A buffer of another process that samples the store in place (no cache)."""
    buffer = writer(store, None, 0, cache_size=0, **options)
    buffer.load_checkpoint(store)
    return buffer


def add(buffer: TrajectoryReplayBuffer, count: int = 1) -> list[int]:
    first = buffer.trajectory_counter
    buffer.add_trajectories([traj(first + k) for k in range(count)])
    buffer.flush()
    return list(range(first, first + count))


def assert_kept(store: Path, added: int, last: int, pinned: set[int], slack: int = 1) -> None:
    """The last ``last`` (up to ``slack`` more) and the pinned are listed, with their data."""
    ids = listed(store)
    assert set(range(added)[-last:]) | pinned <= set(ids)
    assert set(ids) <= set(range(added)[-(last + slack) :]) | pinned
    assert set(ids) <= stored(store)


@settings(max_examples=8, deadline=None)
@given(
    last=st.integers(1, 4),
    window=st.integers(0, 4),
    steps=st.lists(
        st.one_of(st.tuples(st.just("add"), st.integers(1, 3)), st.just(("checkpoint", 0))),
        min_size=1,
        max_size=8,
    ),
)
def test_retention_keeps_the_last_and_the_pinned(tmp_path_factory, last, window, steps):
    root = tmp_path_factory.mktemp("retention")
    store = root / "store"
    window = min(window, last)
    saved: dict[Path, list[int]] = {}
    added = 0
    steps = [("add", 1), *steps]
    with writer(store, Retention(last=last, grace=0), window) as buffer:
        for k, (step, n) in enumerate(steps):
            if step == "add":
                added += len(add(buffer, n))
            elif added:
                saved[root / f"ckpt-{k}"] = buffer.trajectory_ids[-window:]
                buffer.save_checkpoint(root / f"ckpt-{k}")
            pinned = {i for ids in saved.values() for i in ids}
            assert_kept(store, added, last, pinned)
            assert stored(store) == set(listed(store))  # grace 0: the data went at once
            assert buffer.trajectory_ids == listed(store)  # the buffer drops them too
            assert buffer.size == len(listed(store)) and buffer.trajectory_counter == added
    assert verify_store(str(store)).ok
    assert not open_records(Location.from_url(store))
    for path, ids in saved.items():
        assert_checkpoint_loads(path, ids, traj)
    with writer(store, None, 0) as again:
        assert again.trajectory_counter == added  # ids are never reused


def test_retention_by_bytes(tmp_path):
    store = tmp_path / "store"
    with writer(store, None) as probe:
        add(probe)
    size = Location.from_url(store).tree_bytes("trajectories", "0")
    assert size > 0
    with writer(store, Retention(max_bytes=3 * size + size // 2, grace=0)) as buffer:
        for _ in range(8):
            add(buffer)
    assert len(listed(store)) in {3, 4} and listed(store)[-1] == 8
    assert stored(store) == set(listed(store))


def test_a_grace_period_keeps_the_data_for_readers(tmp_path):
    """Readers holding removed ids read them until the grace period ends; the next writer of
    the slot (or ``rbzarr gc``) finishes the collection."""
    store = tmp_path / "store"
    with writer(store, Retention(last=2, grace=3600)) as buffer:
        add(buffer, 2)
        reader = follower(store)
        view = open_buffer(str(store))
        add(buffer, 3)  # one burst of five: 0-2 collected
        assert listed(store) == [3, 4] and buffer.trajectory_ids == [3, 4]
        assert stored(store) == set(range(5))  # removed, not yet deleted
        reader.sample(8)  # the reader's ids 0 and 1 are still there
        reader.close()
        view.sample(8)
        view.refresh()  # a reader that re-reads the index drops them
        assert view.ids == [3, 4]
    (record,) = open_records(Location.from_url(store))
    assert (record.ids, record.slot) == ([0, 1, 2], 0)
    with writer(store, Retention(last=2, grace=0)) as buffer:
        add(buffer)
    assert listed(store) == [3, 4, 5] and stored(store) == {3, 4, 5}
    assert not list((store / RECORDS).iterdir())
    again = TrajectoryReplayBuffer(sample_window_size=0)
    again.load_checkpoint(store)
    assert again.trajectory_ids == [3, 4, 5]


def test_a_reader_that_skips_never_fails(tmp_path):
    """Without a grace period, a reader drawing with ``on_damaged="skip"`` draws again."""
    store = tmp_path / "store"
    with writer(store, Retention(last=2, grace=0)) as buffer:
        add(buffer, 3)
        reader = follower(store, on_damaged="skip")
        add(buffer)  # collects 0 and 1
        add(buffer)
    assert stored(store) == {2, 3, 4}
    with pytest.warns(DamagedTrajectoryWarning):
        for _ in range(4):
            reader.sample(8)
    assert reader.trajectory_ids == [2]
    reader.close()


def test_writers_collect_their_own_slots(tmp_path):
    store = tmp_path / "store"
    with (
        writer(store, Retention(last=2, grace=0)) as first,
        writer(store, Retention(last=3, grace=0)) as second,
    ):
        for _ in range(6):
            for buffer in (first, second):
                add(buffer)
        mine = [i for i in listed(store) if i < 10**9]
        theirs = [i for i in listed(store) if i >= 10**9]
        assert mine == first.trajectory_ids and theirs == second.trajectory_ids
        assert mine[-2:] == [4, 5] and len(mine) <= 3
        assert theirs[-3:] == [10**9 + k for k in (3, 4, 5)] and len(theirs) <= 4
        assert stored(store) == set(listed(store))
    assert verify_store(str(store)).ok


@pytest.mark.s3
def test_retention_on_s3(s3_bucket, s3_options):
    url = f"s3://{s3_bucket}/store"
    options = {"storage_options": s3_options}
    with TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        sample_window_size=1,
        retention=Retention(last=2, grace=0),
        **options,
    ) as buffer:
        for i in range(5):
            buffer.add_trajectories([traj(i)])
            buffer.flush()
        assert buffer.trajectory_ids == [2, 3, 4]
    location = Location.from_url(url, s3_options)
    assert location.list_names("trajectories") == ["2", "3", "4", "zarr.json"]
    assert verify_store(url, s3_options).ok


def test_bad_retention_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs last=N trajectories, max_bytes=N, or both"):
        Retention()
    with pytest.raises(ValueError, match="last must be a whole number >= 1, got 0"):
        Retention(last=0)
    with pytest.raises(ValueError, match="grace must be seconds >= 0, got -1"):
        Retention(last=1, grace=-1)
    with pytest.raises(ValueError, match="retention must be None, a whole number"):
        writer(tmp_path / "a", "10")
    with pytest.raises(ValueError, match="retention needs auto_save=True"):
        TrajectoryReplayBuffer(retention=5)
    with pytest.raises(ValueError, match="fewer than sample_window_size=10"):
        writer(tmp_path / "b", 5, window=10)
    with pytest.raises(ValueError, match="retention needs a zarr store"):
        writer(tmp_path / "c", 5, trajectory_format="pt")
    assert not any(tmp_path.iterdir())  # nothing was written


# -- every storage call of a collection failing, then recovering ----------------------------------
def _collection_case(root: Path, faults: Faults, k: int | None, kind: str) -> list[str]:
    """Three trajectories and a checkpoint pinning the last; the fourth's burst collects
    (call ``k`` faulted); then storage heals and one more burst follows."""
    store = root / "store"
    buffer = writer(store, Retention(last=2, grace=0))
    add(buffer, 3)
    buffer.save_checkpoint(root / "ckpt")  # pins 2
    if k is None:
        faults.count()
    else:
        faults.arm(k, kind)
    try:
        buffer.add_trajectories([traj(3)])
        buffer.flush(timeout=10)
    except (StorageUnavailableError, WriterFailedError):
        pass  # storage is failing: the next flush retries
    finally:
        faults.disarm()
    calls = list(faults.calls)
    assert {2, 3} <= set(listed(store)) <= stored(store)  # nothing kept lost meanwhile
    add(buffer)
    buffer.close()
    if not verify_store(str(store)).ok:
        assert verify_store(str(store), repair=True).ok
    assert_kept(store, 5, 2, {2})
    assert_checkpoint_loads(root / "ckpt", [2], traj)
    return calls


@pytest.mark.parametrize("every", [pytest.param(True, marks=pytest.mark.slow), False])
def test_every_storage_call_of_a_collection_fails_in_turn(tmp_path, monkeypatch, every):
    """Every call of the burst that collects (``every``: each kind in turn), or only the
    collection's own calls, last in the burst (its record, the log, the deletes), failed."""
    faults = Faults(monkeypatch)
    counter = itertools.count()
    calls = _collection_case(tmp_path / "count", faults, None, "fail")
    tail = range(max(0, len(calls) - 12), len(calls))
    assert "delete" in [calls[k] for k in tail]
    kinds = ("fail", "lost", "outage")
    cases = [(k, kinds[k % 3]) for k in range(len(calls))] if every else [(k, "fail") for k in tail]
    for k, kind in cases:
        try:
            _collection_case(tmp_path / f"case-{next(counter)}", faults, k, kind)
        except AssertionError as exc:
            raise AssertionError(f"call {k} ({calls[k]}), {kind}: {exc}") from exc


# -- kill -9 at every step of a collection -------------------------------------------------------
_KILLER = """
import json, os, signal, sys
from rbzarr import Retention, TrajectoryReplayBuffer
from rbzarr.storage.index.collector import SlotCollector
from rbzarr.storage.io.location import Location
sys.path.insert(0, sys.argv[1])
from conftest import make_trajectory

step, store, options = int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
calls, collecting = [0], [False]
for name in ("write_bytes", "delete"):
    original = getattr(Location, name)

    def dying(*args, _original=original, **kwargs):
        if collecting[0]:
            if calls[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            calls[0] += 1
        return _original(*args, **kwargs)

    setattr(Location, name, dying)
for name in ("collect", "delete_expired"):
    original = getattr(SlotCollector, name)

    def marked(*args, _original=original, **kwargs):
        collecting[0] = True
        try:
            return _original(*args, **kwargs)
        finally:
            collecting[0] = False

    setattr(SlotCollector, name, marked)
buffer = TrajectoryReplayBuffer(
    auto_save=True, auto_save_path=store, sample_window_size=1,
    retention=Retention(last=2, grace=0), storage_options=options,
)
buffer.add_trajectories([make_trajectory(2, 2, 100 * 3)])
buffer.close()
print(calls[0])
"""


def _append_until(buffers: list[TrajectoryReplayBuffer], stop: threading.Event) -> None:
    """Each of ``buffers`` adds one trajectory (flushed) in turn, until ``stop`` (at most
    ``ROUNDS`` times: the stores stay small)."""
    for _ in range(ROUNDS):
        for buffer in buffers:
            add(buffer)
        if stop.is_set():
            return


ROUNDS = 4


def _listed_at(store: str, options: dict) -> list[int]:
    """The ids the store at ``store`` lists (any backend)."""
    documents = StoreIndex.assumed(Location.from_url(store, options)).read()
    return list(documents.trajectory_index["trajectory_id_list"])


def _stored_at(store: str, options: dict) -> set[int]:
    """The ids whose data is in the store at ``store`` (any backend)."""
    names = Location.from_url(store, options).list_names("trajectories")
    return {int(name) for name in names if name.isdigit()}


def _kill_at_every_step(root: Path, base: str, options: dict) -> None:
    """A writer killed before each write and delete of its collection, while three other
    writers append to the store and a reader follows it; the next writer finishes the work.
    ``base``: a folder or URL under which each step makes its own store."""
    given = {"storage_options": options} if options else {}
    step = 0
    while True:
        store = f"{base}/step-{step}"
        checkpoint = root / f"ckpt-{step}"
        first = writer(store, Retention(last=2, grace=0), **given)
        add(first, 3)
        first.save_checkpoint(checkpoint)  # pins 2
        others = [writer(store, None, **given) for _ in range(3)]  # slots 1-3
        for other in others:
            add(other)
        reader = follower(store, on_damaged="skip", **given)  # slot 4
        first.close()  # the killed writer takes slot 0 next: its fourth burst collects
        stop = threading.Event()
        appending = threading.Thread(target=_append_until, args=(others, stop))
        appending.start()  # the other writers append while it collects
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _KILLER,
                    str(ROOT / "tests"),
                    str(step),
                    store,
                    json.dumps(options),
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=120,
                check=False,
            )
        finally:
            stop.set()
            appending.join()
        killed = done.returncode == -9
        assert killed or done.returncode == 0, done.stderr
        # the store reads, nothing lost
        assert {2, 3} <= set(_listed_at(store, options)) <= _stored_at(store, options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DamagedTrajectoryWarning)
            reader.sample(4)  # never fails: what it misses it draws again
        for other in others:
            other.close()
        reader.close()
        if not verify_store(store, options).ok:
            assert verify_store(store, options, repair=True).ok
        if killed and options:  # an object store keeps a killed writer's claim: free it as
            # docs/behaviour.md says, so the next writer takes its slot and finishes its work
            Location.from_url(store, options).delete(WRITERS, "0", CLAIM_FILE)
        with writer(store, Retention(last=2, grace=0), **given) as again:
            add(again)
        loaded = TrajectoryReplayBuffer(sample_window_size=0, **given)
        loaded.load_checkpoint(checkpoint)
        assert loaded.trajectory_ids == [2]
        assert_same_trajectory(loaded.trajectory(2), traj(2))
        assert [i for i in _listed_at(store, options) if i < 10**9] == [2, 3, 4]
        assert _stored_at(store, options) == set(_listed_at(store, options))
        assert not open_records(Location.from_url(store, options))
        assert verify_store(store, options).ok
        if not killed:
            assert int(done.stdout) >= 3  # the record, the log, the data, the record again
            break
        step += 1


@pytest.mark.slow
def test_kill_at_every_step_of_a_collection(tmp_path):
    _kill_at_every_step(tmp_path, str(tmp_path), {})


@pytest.mark.slow
@pytest.mark.s3
def test_kill_at_every_step_of_a_collection_on_s3(tmp_path, s3_bucket, s3_options):
    _kill_at_every_step(tmp_path, f"s3://{s3_bucket}/stores", s3_options)
