"""Checkpoints that copy nothing: a zarr store's manifest, its pin, and what loads from it.

A manifest must draw exactly what a copied checkpoint of the same moment draws (full and
rank-sharded loads), copy no trajectory, keep a pin in the store while it exists, and fail
with a named error when its store or trajectories are gone or changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import assert_checkpoint_loads, assert_same_trajectory, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import (
    CheckpointNotFoundError,
    CheckpointReferenceError,
    CorruptStoreError,
    PrioritizedReplay,
    StoreExistsError,
    TrajectoryReplayBuffer,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.buffer.manifest import MANIFEST_FILE, read_manifest
from rbzarr.cli.main import main
from rbzarr.storage.index.pins import FOLDER, Pin, StorePins
from rbzarr.storage.io.location import Location
from rbzarr.trajectory import tree

ROOT = Path(__file__).resolve().parents[1]


def traj(i: int):
    return make_trajectory(2, 3, 100 * i, mwid=f"w{i}")


def assert_batches_equal(got: dict, want: dict) -> None:
    got_flat, want_flat = tree.flatten(got), tree.flatten(want)
    assert list(got_flat) == list(want_flat)
    for key, value in want_flat.items():
        assert torch.equal(got_flat[key], value), key


def state(buffer: TrajectoryReplayBuffer) -> tuple:
    return (buffer.trajectory_ids, len(buffer), buffer.total_samples, buffer.trajectory_counter)


def files_below(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def writer(store: Path, window: int, **options) -> TrajectoryReplayBuffer:
    return TrajectoryReplayBuffer(
        seed=7, sample_window_size=window, auto_save=True, auto_save_path=store, **options
    )


def pins(store: Path) -> list[Pin]:
    return StorePins(Location.from_url(store)).all()


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code != 0
    return result.output


# -- what loads from a manifest --------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(
    adds=st.integers(1, 6),
    window=st.integers(0, 4),
    drawn=st.integers(0, 2),
    world_size=st.integers(1, 3),
)
def test_a_manifest_draws_what_a_copy_draws(tmp_path_factory, adds, window, drawn, world_size):
    root = tmp_path_factory.mktemp("draws")
    with writer(root / "store", window, cache_size=1) as buffer:
        buffer.add_trajectories([traj(i) for i in range(adds)])
        for _ in range(drawn):
            buffer.sample(5)
        buffer.save_checkpoint(root / "manifest")
        buffer.save_checkpoint(root / "copy", copy=True)
    assert sorted(files_below(root / "manifest")) == [MANIFEST_FILE]
    shares = [None] + [(rank, world_size) for rank in range(world_size)]
    for share in shares:
        shard = {} if share is None else dict(zip(("local_rank", "world_size"), share, strict=True))
        loaded = []
        for path in (root / "manifest", root / "copy"):
            other = TrajectoryReplayBuffer(seed=1, sample_window_size=window)
            other.load_checkpoint(path, is_distributed=share is not None, **shard)
            loaded.append(other)
        by_reference, copied = loaded
        assert state(by_reference) == state(copied)
        if len(copied) == 0:
            continue
        for n in (3, 11):
            assert_batches_equal(by_reference.sample(n), copied.sample(n))
        assert_batches_equal(by_reference.sample_sequences(2, 2), copied.sample_sequences(2, 2))


def test_the_manifest_is_small_and_pins_the_window(tmp_path):
    with writer(tmp_path / "store", 3) as buffer:
        buffer.add_trajectories([traj(i) for i in range(5)])
        buffer.save_checkpoint(tmp_path / "ckpt")
        uuids = [buffer.index_entries[i]["uuid"] for i in (2, 3, 4)]
    document = json.loads((tmp_path / "ckpt" / MANIFEST_FILE).read_bytes())
    assert document["store"] == str(tmp_path / "store")
    assert document["trajectory_index"]["trajectory_id_list"] == [2, 3, 4]
    assert document["metadata"]["trajectory_counter"] == 5
    (pin,) = pins(tmp_path / "store")
    assert (pin.pin_id, pin.checkpoint) == (document["pin"], str(tmp_path / "ckpt"))
    assert (list(pin.ids), list(pin.uuids)) == ([2, 3, 4], uuids)
    assert verify_store(str(tmp_path / "store")).ok


def test_continue_in_place_from_a_manifest(tmp_path):
    """A manifest loaded by a buffer of its own store resumes there, copying nothing."""
    store = tmp_path / "store"
    with writer(store, 0) as buffer:
        buffer.add_trajectories([traj(i) for i in range(3)])
        buffer.sample(4)
        buffer.save_checkpoint(tmp_path / "ckpt")
        want = buffer.sample(9)
        buffer.add_trajectories([traj(3)])  # after the checkpoint: not in it
    before = files_below(store / "trajectories")
    with writer(store, 0) as resumed:
        resumed.load_checkpoint(tmp_path / "ckpt")
        assert resumed.trajectory_ids == [0, 1, 2]
        assert_batches_equal(resumed.sample(9), want)
        resumed.add_trajectories([traj(4)])
        assert resumed.trajectory_ids == [0, 1, 2, 4]  # never id 3 again
    assert files_below(store / "trajectories").items() >= before.items()


def test_priorities_are_saved_beside_the_manifest(tmp_path):
    """The store's priority files change as training goes on: a manifest keeps its own."""
    options = {"prioritized": PrioritizedReplay(alpha=0.6, beta=0.4, eps=1e-6)}
    with writer(tmp_path / "store", 0, **options) as buffer:
        buffer.add_trajectories([traj(i) for i in range(3)])
        _, info = buffer.sample(8, return_info=True)
        buffer.update_priority(info["index"], torch.arange(8, dtype=torch.float32) + 1)
        buffer.save_checkpoint(tmp_path / "ckpt")
        buffer.save_checkpoint(tmp_path / "copy", copy=True)
        buffer.update_priority(info["index"], torch.full((8,), 50.0))
        buffer.flush()  # the store's priority files now differ from the checkpoint's
    loaded = []
    for path in ("ckpt", "copy"):
        other = TrajectoryReplayBuffer(seed=1, sample_window_size=0, **options)
        other.load_checkpoint(tmp_path / path)
        loaded.append(other)
    index = torch.arange(18)
    got, want = (buffer.get_priority(index) for buffer in loaded)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert not (got == 50.0).any()
    assert_batches_equal(loaded[0].sample(12), loaded[1].sample(12))


# -- the default, and what is refused ----------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "copies"),
    [
        ({}, True),  # without auto_save the cache holds the only copy
        ({"auto_save": True, "trajectory_format": "pt"}, True),  # RLinf's checkpoint
        ({"auto_save": True, "trajectory_format": "pkl"}, True),
        ({"auto_save": True}, False),  # a zarr store: a manifest
    ],
)
def test_the_default_copies_only_without_a_zarr_store(tmp_path, options, copies):
    if options:
        options = {**options, "auto_save_path": tmp_path / "store"}
    with TrajectoryReplayBuffer(sample_window_size=2, **options) as buffer:
        buffer.add_trajectories([traj(i) for i in range(3)])
        buffer.save_checkpoint(tmp_path / "ckpt")
        if not copies:
            buffer.save_checkpoint(tmp_path / "copy", copy=True)
    saved = files_below(tmp_path / "ckpt")
    assert (MANIFEST_FILE not in saved) == copies
    assert ("metadata.json" in saved) == copies
    if not copies:
        assert "metadata.json" in files_below(tmp_path / "copy")


@pytest.mark.parametrize("options", [{}, {"auto_save": True, "trajectory_format": "pt"}])
def test_no_manifest_without_a_zarr_store(tmp_path, options):
    if options:
        options = {**options, "auto_save_path": tmp_path / "store"}
    with TrajectoryReplayBuffer(**options) as buffer:
        buffer.add_trajectories([traj(0)])
        with pytest.raises(ValueError, match=r"copy=False.*zarr auto_save store"):
            buffer.save_checkpoint(tmp_path / "ckpt", copy=False)
    assert not (tmp_path / "ckpt").exists()


def test_a_manifest_never_overwrites(tmp_path):
    with writer(tmp_path / "store", 0) as buffer:
        buffer.add_trajectories([traj(0)])
        buffer.save_checkpoint(tmp_path / "ckpt")
        before = files_below(tmp_path / "ckpt")
        for copy in (None, True):
            with pytest.raises(StoreExistsError, match="store or a checkpoint"):
                buffer.save_checkpoint(tmp_path / "ckpt", copy=copy)
        buffer.save_checkpoint(tmp_path / "copy", copy=True)
        with pytest.raises(StoreExistsError, match=r"metadata\.json"):
            buffer.save_checkpoint(tmp_path / "copy")
    assert files_below(tmp_path / "ckpt") == before
    assert len(pins(tmp_path / "store")) == 1


# -- a store or trajectory gone or changed -------------------------------------------------------
@pytest.fixture
def saved(tmp_path) -> Path:
    with writer(tmp_path / "store", 0) as buffer:
        buffer.add_trajectories([traj(i) for i in range(4)])
        buffer.save_checkpoint(tmp_path / "ckpt")
    return tmp_path


def test_a_gone_store_is_named(saved):
    shutil.rmtree(saved / "store")
    with pytest.raises(CheckpointReferenceError, match=r"store .*store is gone") as info:
        TrajectoryReplayBuffer().load_checkpoint(saved / "ckpt")
    assert info.value.store == str(saved / "store")
    assert isinstance(info.value, CheckpointNotFoundError)


def test_gone_and_changed_trajectories_are_named(saved):
    shutil.rmtree(saved / "store" / "trajectories" / "1")
    # Another run's trajectory 3 where the checkpoint's was.
    with writer(saved / "other", 0) as other:
        other.add_trajectories([traj(i) for i in range(4)])
    shutil.rmtree(saved / "store" / "trajectories" / "3")
    shutil.copytree(saved / "other" / "trajectories" / "3", saved / "store" / "trajectories" / "3")
    target = TrajectoryReplayBuffer(sample_window_size=0)
    target.add_trajectories([traj(9)])
    with pytest.raises(CheckpointReferenceError, match=r"missing \[1\] and changed \[3\]") as info:
        target.load_checkpoint(saved / "ckpt")
    assert (info.value.missing, info.value.changed) == ((1,), (3,))
    assert target.trajectory_ids == [0]  # nothing changed
    # A rank whose share is intact loads: rank 0 of 4 owns trajectory 0 only.
    target.load_checkpoint(saved / "ckpt", is_distributed=True, local_rank=0, world_size=4)
    assert target.trajectory_ids == [0]
    message = fails("checkpoint", "materialize", str(saved / "ckpt"), str(saved / "out"))
    assert "missing [1] and changed [3]" in message
    assert not (saved / "out").exists()


# -- the command line ------------------------------------------------------------------------------
def test_list_materialize_and_drop(saved):
    store, ckpt = str(saved / "store"), str(saved / "ckpt")
    listed = json.loads(run_cli("checkpoints", "--json", store))
    (row,) = listed
    assert (row["checkpoint"], row["ids"]) == (ckpt, [0, 1, 2, 3])
    folders = [saved / "store" / "trajectories" / str(i) for i in range(4)]
    assert row["bytes"] == sum(len(data) for f in folders for data in files_below(f).values())
    assert "4 trajectories (0-3)" in run_cli("checkpoints", store)

    run_cli("checkpoint", "materialize", ckpt, str(saved / "copy"))
    with writer(saved / "store", 0) as buffer:
        buffer.load_checkpoint(ckpt)
        buffer.save_checkpoint(saved / "direct", copy=True)
    assert files_below(saved / "copy") == files_below(saved / "direct")
    assert "already holds" in fails("checkpoint", "materialize", ckpt, str(saved / "copy"))

    assert "dropped the checkpoint" in run_cli("checkpoint", "drop", ckpt)
    assert not (saved / "ckpt" / MANIFEST_FILE).exists()
    assert json.loads(run_cli("checkpoints", "--json", store)) == []
    assert "no checkpoint manifest" in fails("checkpoint", "drop", ckpt)
    assert "no checkpoint pins" in run_cli("checkpoints", store)
    assert "no folder" in fails("checkpoints", str(saved / "nowhere"))


def test_drop_a_pin_left_without_its_manifest(saved):
    store = Location.from_url(saved / "store")
    orphan = Pin.new(str(saved / "lost"), [1, 2], ["a", "b"])
    StorePins(store).add(orphan)
    assert len(pins(saved / "store")) == 2
    assert "32 hex digits" in fails("checkpoint", "drop", str(saved / "store"), "--pin", "x")
    run_cli("checkpoint", "drop", str(saved / "store"), "--pin", orphan.pin_id)
    assert [p.checkpoint for p in pins(saved / "store")] == [str(saved / "ckpt")]
    # By the pin of a manifest that exists, the manifest goes too.
    (kept,) = pins(saved / "store")
    run_cli("checkpoint", "drop", str(saved / "store"), "--pin", kept.pin_id)
    assert pins(saved / "store") == []
    assert read_manifest(Location.from_url(saved / "ckpt")) is None


@pytest.mark.parametrize(
    "broken",
    [
        b"not json",
        b"[]",
        b'{"rbzarr_checkpoint": 1}',
        b'{"rbzarr_checkpoint": 2, "store": "s", "trajectory_format": "zarr", "pin": "p", '
        b'"created": 0, "metadata": {}, "trajectory_index": {}}',
    ],
)
def test_a_malformed_manifest_or_pin_is_named(saved, broken):
    manifest = saved / "ckpt" / MANIFEST_FILE
    manifest.write_bytes(broken)
    target = TrajectoryReplayBuffer(sample_window_size=0)
    target.add_trajectories([traj(9)])
    with pytest.raises(CorruptStoreError, match=re.escape(str(manifest))):
        target.load_checkpoint(saved / "ckpt")
    assert target.trajectory_ids == [0]
    (pin,) = pins(saved / "store")
    pin_file = saved / "store" / FOLDER / f"{pin.pin_id}.json"
    pin_file.write_bytes(broken)
    assert str(pin_file) in fails("checkpoints", str(saved / "store"))


def test_a_foreign_file_among_the_pins_is_named(saved):
    (saved / "store" / FOLDER / "notes.json").write_text("{}")
    with pytest.raises(CorruptStoreError, match=r"notes\.json: not a pin record's name"):
        StorePins(Location.from_url(saved / "store")).all()


# -- add / checkpoint / drop / gc sequences against a model of what must remain -----------------
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 2)),
        st.tuples(st.just("checkpoint"), st.just(0)),
        st.tuples(st.just("drop"), st.integers(0, 3)),
        st.tuples(st.just("gc"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=8, deadline=None)
@given(window=st.integers(0, 3), steps=steps)
def test_sequences_keep_what_every_live_checkpoint_names(tmp_path_factory, window, steps):
    """The model: the ids the store lists, the ids the buffer holds, and the ids each live
    checkpoint names (the buffer's window at its save). After every step the store's pins
    are exactly the live checkpoints'; ``rbzarr gc --keep-last n`` (the buffer closed, then
    reopened on the store) leaves exactly the last ``n`` listed and the pinned, with their
    data; each live checkpoint loads exactly its ids, and a dropped one is gone."""
    root = tmp_path_factory.mktemp("sequences")
    store = root / "store"
    live: dict[Path, list[int]] = {}
    dropped: list[Path] = []
    listed: list[int] = []  # what the store lists
    held: list[int] = []  # what the buffer holds
    added = 0
    buffer = writer(store, window)
    try:
        for k, (step, n) in enumerate(steps):
            if step == "add":
                buffer.add_trajectories([traj(added + j) for j in range(n)])
                listed += range(added, added + n)
                held += range(added, added + n)
                added += n
            elif step == "checkpoint" and held:  # (an empty window is saved as a copy)
                path = root / f"ckpt-{k}"
                buffer.save_checkpoint(path)
                live[path] = held[-window:] if window else list(held)
            elif step == "drop" and live:
                path = sorted(live)[n % len(live)]
                run_cli("checkpoint", "drop", str(path))
                del live[path]
                dropped.append(path)
            elif step == "gc" and added:
                buffer.close()
                run_cli("gc", str(store), "--keep-last", str(n))
                pinned = {i for ids in live.values() for i in ids}
                cut = max(len(listed) - n, 0)
                listed = [i for i in listed[:cut] if i in pinned] + listed[cut:]
                stored = {int(p.name) for p in (store / "trajectories").iterdir() if p.is_dir()}
                assert stored == set(listed)
                buffer = writer(store, window)
                buffer.load_checkpoint(store)  # continues in place
                held = list(listed)
                assert buffer.trajectory_ids == held
            held_pins = {(p.checkpoint, tuple(p.ids)) for p in pins(store)} if added else set()
            assert held_pins == {(str(path), tuple(ids)) for path, ids in live.items()}
    finally:
        buffer.close()
    for path, ids in live.items():
        assert_checkpoint_loads(path, ids, traj)
    for path in dropped:
        with pytest.raises(CheckpointNotFoundError):
            TrajectoryReplayBuffer().load_checkpoint(path)


# -- kill -9 at every step of a pinning checkpoint -----------------------------------------------
_KILLER = """
import json, os, signal, sys
from rbzarr import TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location

store, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
results = []
for step in range(64):
    for after in (False, True):
        target = f"{out}/ckpt-{step}-{int(after)}"
        pid = os.fork()
        if pid == 0:
            buffer = TrajectoryReplayBuffer(
                sample_window_size=0, auto_save=True, auto_save_path=store,
                storage_options=options,
            )
            buffer.load_checkpoint(store)
            write, calls = Location.write_bytes, [0]

            def dying(self, data, *names):
                if calls[0] == step and not after:
                    os.kill(os.getpid(), signal.SIGKILL)
                write(self, data, *names)
                if calls[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1

            Location.write_bytes = dying
            buffer.save_checkpoint(target)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        results.append([target, os.WIFSIGNALED(status)])
        if not os.WIFSIGNALED(status):
            print(json.dumps(results))
            sys.exit(0)
"""


def _appending(buffers: list[TrajectoryReplayBuffer], stop: threading.Event) -> None:
    """Each of ``buffers`` adds one trajectory (flushed) in turn until ``stop``."""
    while not stop.is_set():
        for buffer in buffers:
            buffer.add_trajectories([traj(buffer.trajectory_counter % 10**9 + 10)])
            buffer.flush()


def _kill_pinning(root: Path, store: str, options: dict) -> None:
    """A checkpoint killed before and after each write of its pin and manifest, while three
    other writers append to the store and a reader follows it: the store verifies, every
    manifest written names a pin that holds, and loads what it names."""
    given = {"storage_options": options} if options else {}
    with writer(store, 0, **given) as buffer:
        buffer.add_trajectories([traj(i) for i in range(3)])
    others = [writer(store, 0, **given) for _ in range(3)]  # slots 1-3
    reader = TrajectoryReplayBuffer(sample_window_size=0, cache_size=0, **given)
    reader.load_checkpoint(store)
    stop = threading.Event()
    appending = threading.Thread(target=_appending, args=(others, stop))
    appending.start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _KILLER, store, str(root), json.dumps(options)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
            check=True,
        )
        reader.sample(4)  # a reader following the store never fails
    finally:
        stop.set()
        appending.join()
    for other in others:
        other.close()
    reader.close()
    results = json.loads(done.stdout)
    killed = [target for target, was_killed in results if was_killed]
    assert len(killed) >= 4  # the pin and the manifest, each before and after its write
    assert verify_store(store, options).ok
    held = {pin.pin_id for pin in StorePins(Location.from_url(store, options)).all()}
    for target in [*killed, results[-1][0]]:
        found = read_manifest(Location.from_url(target))
        if found is None:
            assert target != results[-1][0]  # only a killed save may leave no manifest
            continue
        assert found.pin_id in held
        loaded = TrajectoryReplayBuffer(sample_window_size=0, **given)
        loaded.load_checkpoint(target)
        assert {0, 1, 2} <= set(loaded.trajectory_ids)
        for i in range(3):
            assert_same_trajectory(loaded.trajectory(i), traj(i))


@pytest.mark.slow
def test_kill_at_every_step_of_a_pinning_checkpoint(tmp_path):
    _kill_pinning(tmp_path, str(tmp_path / "store"), {})


@pytest.mark.slow
@pytest.mark.s3
def test_kill_at_every_step_of_a_pinning_checkpoint_on_s3(tmp_path, s3_bucket, s3_options):
    _kill_pinning(tmp_path, f"s3://{s3_bucket}/store", s3_options)
