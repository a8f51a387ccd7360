"""The index log: commits that cost their own entries, opens that cost the window, repairs."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import make_trajectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbzarr import (
    CheckpointNotFoundError,
    CorruptStoreError,
    TrajectoryReplayBuffer,
    open_buffer,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location

ENTRY = {"uuid": "u", "num_samples": 8, "shape": [4, 2], "max_episode_length": 0}


def entry(trajectory_id: int) -> dict:
    return {**ENTRY, "trajectory_id": trajectory_id, "model_weights_id": ""}


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 8 entries, compaction every 3 records: every path runs on small stores."""
    monkeypatch.setattr(index_log, "SEGMENT_SIZE", 8)
    monkeypatch.setattr(index_log, "COMPACT_RECORDS", 3)


# small_blocks sets the same values for every example: the fixture's scope is harmless.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bursts=st.lists(st.integers(0, 6), max_size=40), window=st.integers(0, 80))
def test_reads_return_the_last_entries_whatever_was_compacted(
    tmp_path_factory, small_blocks, bursts, window
):
    location = Location.from_url(tmp_path_factory.mktemp("log"))
    log = index_log.IndexLog(location)
    ids: list[int] = []
    for count in bursts:
        new = list(range(len(ids), len(ids) + count))
        log.append([entry(i) for i in new], counter=len(ids) + count)
        ids += new
    state = index_log.read_slot_index(location, last=window)
    want = ids[max(0, len(ids) - window) :] if window else []
    assert [e["trajectory_id"] for e, _ in state.entries] == want
    assert (state.size, state.total_samples, state.trajectory_counter) == (
        len(ids),
        8 * len(ids),
        len(ids),
    )
    everything = index_log.read_slot_index(location)
    assert [e["trajectory_id"] for e, _ in everything.entries] == ids
    # A writer that opens the log again continues it.
    again = index_log.IndexLog(location)
    again.append([entry(len(ids))], counter=len(ids) + 1)
    assert index_log.read_slot_index(location).size == len(ids) + 1


def test_the_sizes_are_the_sources_after_the_tests_that_shrink_them():
    """Tests that shrink the blocks put the source's sizes back (later tests use them)."""
    source = ast.parse(Path(index_log.__file__).read_text())
    literal = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in source.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("SEGMENT_SIZE", "COMPACT_RECORDS")
    }
    assert literal == {
        "SEGMENT_SIZE": index_log.SEGMENT_SIZE,
        "COMPACT_RECORDS": index_log.COMPACT_RECORDS,
    }


def test_a_commit_writes_its_own_entries_not_the_store(tmp_path, small_blocks):
    """The bytes one tiny commit writes do not grow with the store."""
    store = tmp_path / "s"

    def written_by_one_commit(buffer) -> int:
        before = {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()}
        buffer.add_trajectories([make_trajectory(4, 2, 0)])
        buffer.flush()
        return sum(
            p.stat().st_size
            for p in store.rglob("*")
            if p.is_file()
            and "trajectories" not in p.parts
            and before.get(p) != p.stat().st_mtime_ns
        )

    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        early = [written_by_one_commit(buffer) for _ in range(12)]
        for _ in range(100):  # one record each, as the measured commits
            buffer.add_trajectories([make_trajectory(4, 2, 0)])
            buffer.flush()
        late = [written_by_one_commit(buffer) for _ in range(12)]
    # No whole-document rewrite: the largest commit late is about the largest early
    # (a record, sometimes a block of at most 2 * SEGMENT_SIZE entries and the head).
    assert max(late) <= max(early) * 2 + 2000
    mirror = json.loads((store / "trajectory_index.json").read_text())  # written at close
    assert len(mirror["trajectory_id_list"]) == 124


def test_open_reads_the_window_not_the_store(tmp_path, small_blocks, monkeypatch):
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        for i in range(60):
            buffer.add_trajectories([make_trajectory(4, 2, i)])
    read: list[str] = []
    original = Location.read_bytes

    def counting(self, *names):
        read.append("/".join(names))
        return original(self, *names)

    monkeypatch.setattr(Location, "read_bytes", counting)
    state = index_log.read_slot_index(Location.from_url(store), last=5)
    assert [e["trajectory_id"] for e, _ in state.entries] == list(range(55, 60))
    assert state.size == 60
    blocks = [name for name in read if name.startswith("index/blocks/")]
    assert len(blocks) <= 2, read  # the window's blocks only, of 8 blocks


def test_a_torn_record_is_a_named_error_and_repair_keeps_every_complete_trajectory(tmp_path):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.flush()
    buffer.add_trajectories([make_trajectory(4, 2, 8)])
    buffer.flush()
    records = sorted((store / "index" / "log").iterdir())
    saved = store.parent / "saved"
    shutil.copytree(store, saved)  # the store as a kill -9 leaves it
    buffer.close()
    shutil.rmtree(store)
    saved.rename(store)
    records = sorted((store / "index" / "log").iterdir())
    records[-1].write_bytes(records[-1].read_bytes()[:20])  # torn, as a non-atomic disk may
    with pytest.raises(CorruptStoreError, match=r"log/000000000002\.json is not valid JSON"):
        open_buffer(str(store))
    report = verify_store(store)
    assert [p.kind for p in report.problems] == ["damaged_log"]
    assert "verify --repair" in report.problems[0].message
    repaired = verify_store(store, repair=True)
    assert repaired.ok, repaired.problems
    # The trajectory the torn record listed is complete: its group's attributes hold its
    # entry, so the repair lists it again.
    assert open_buffer(str(store)).ids == [0, 1]
    assert verify_store(store).ok


def test_a_damaged_block_is_salvaged_from_the_trajectory_groups(tmp_path, small_blocks):
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        for i in range(20):
            buffer.add_trajectories([make_trajectory(4, 2, i)])
    blocks = sorted((store / "index" / "blocks").iterdir())
    blocks[0].write_text("{}")
    with pytest.raises(CorruptStoreError, match="malformed index block"):
        index_log.read_slot_index(Location.from_url(store))
    assert verify_store(store, repair=True).ok
    assert open_buffer(str(store), sample_window_size=0).ids == list(range(20))


def test_a_store_of_an_earlier_rbzarr_opens_and_appends_without_rewriting_data(tmp_path):
    """An index in documents only (no log): it reads, and the first writer upgrades it."""
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, i) for i in range(3)])
    shutil.rmtree(store / "index")  # what rbzarr wrote before the log: the documents alone
    data = {p: p.read_bytes() for p in (store / "trajectories").rglob("*") if p.is_file()}
    assert open_buffer(str(store)).ids == [0, 1, 2]
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.load_checkpoint(store)
        assert buffer.trajectory_ids == [0, 1, 2]
        buffer.add_trajectories([make_trajectory(4, 2, 9)])
    assert open_buffer(str(store)).ids == [0, 1, 2, 3]
    assert (store / "index" / "head.json").exists()
    for path, content in data.items():
        assert path.read_bytes() == content, path
    assert verify_store(store).ok


def test_durable_flush_commits(tmp_path):
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, durable=True) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, 0)])
        buffer.flush()
        assert read_store_documents(Location.from_url(store)).metadata["size"] == 1


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from conftest import make_trajectory
    from rbzarr import TrajectoryReplayBuffer
    from rbzarr.storage.index import log as index_log

    index_log.SEGMENT_SIZE, index_log.COMPACT_RECORDS = 4, 2
    step = int(sys.argv[1])
    calls = [0]
    original = index_log.IndexLog._write

    def write(self, data, *names):
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), 9)  # killed just before this file of the index is written
        original(self, data, *names)

    index_log.IndexLog._write = write
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=sys.argv[2])
    for i in range(12):
        buffer.add_trajectories([make_trajectory(4, 2, i)])
        buffer.flush()
        print(i, flush=True)
    buffer.close()
    """
)


@pytest.mark.slow
def test_a_kill_at_every_step_of_commits_and_compactions_loses_nothing_flushed(tmp_path):
    """Every write of the index (records, blocks, merges, heads) killed in turn."""
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER.format(tests=str(Path(__file__).parent)))
    for step in range(1, 26):
        store = tmp_path / f"s{step}"
        done = subprocess.run(
            [sys.executable, str(script), str(step), str(store)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode in (0, -signal.SIGKILL), done.stderr
        flushed = [int(line) for line in done.stdout.split()]
        if not store.exists() or not (store / "index").exists():
            assert not flushed
            continue
        listed = open_buffer(str(store), sample_window_size=0).ids if flushed else []
        assert listed[: len(flushed)] == flushed, (step, listed, flushed)
        assert verify_store(store, repair=True).ok
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as resumed:
            resumed.add_trajectories([make_trajectory(4, 2, 99)])
        ids = open_buffer(str(store), sample_window_size=0).ids
        assert len(ids) == len(set(ids)) and ids[: len(flushed)] == flushed
    assert os.path.exists(tmp_path / "s25")


def test_four_writers_append_while_compactions_run_and_a_reader_follows(tmp_path, small_blocks):
    """Four buffers (four slots) commit and compact at once; a reader never fails, never
    loses an id it saw, and ends with every trajectory."""
    store = tmp_path / "s"
    per_writer = 30
    errors: list[BaseException] = []
    seen: list[list[int]] = []
    done = threading.Event()

    def write(k: int) -> None:
        try:
            with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
                for i in range(per_writer):
                    buffer.add_trajectories([make_trajectory(4, 2, 100 * k + i)])
                    if i % 3 == 2:
                        buffer.flush()
        except BaseException as exc:  # reported below
            errors.append(exc)

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(open_buffer(str(store), sample_window_size=0).ids)
            except CheckpointNotFoundError:
                continue  # before the first commit
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    writers = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    assert errors == []
    check_reads(seen, open_buffer(str(store), sample_window_size=0).ids, 4 * per_writer)
    assert verify_store(store).ok


def test_a_store_whose_first_record_is_being_written_opens_as_a_zarr_store(tmp_path):
    """While a writer's first record is on its way (the log's folder made, no record in it
    yet), another buffer writes a zarr slot beside it and readers read a zarr store, never
    RLinf's one-writer pt."""
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as first:
        (store / "index" / "log").mkdir(parents=True)  # what a first append makes first
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as second:
            assert second.trajectory_format == "zarr"
            second.add_trajectories([make_trajectory(4, 2, 1)])
        # Readers meanwhile read the zarr store the second writer committed to.
        reader = open_buffer(str(store), sample_window_size=0)
        assert reader.layout.format == "zarr" and len(reader.ids) == 1
        assert verify_store(store).ok
        first.add_trajectories([make_trajectory(4, 2, 2)])
    assert len(open_buffer(str(store), sample_window_size=0).ids) == 2
    assert verify_store(store).ok


def check_reads(seen: list[list[int]], final: list[int], count: int) -> None:
    """Every read lists each id once, and later reads keep what earlier ones listed."""
    assert len(final) == len(set(final)) == count
    for ids in seen:
        assert set(ids) <= set(final) and len(ids) == len(set(ids)), (sorted(final), ids)
    for earlier, later in itertools.pairwise(seen):
        assert set(earlier) <= set(later)


LOG_DAMAGE = {
    "garbage": lambda raw: b"\x8f\x00garbage",
    "truncated": lambda raw: raw[: len(raw) // 2],
    "not-an-object": lambda raw: b"[1, 2]",
    "deeply-nested": lambda raw: b"[" * 100_000 + b"]" * 100_000,
    "infinity": lambda raw: re.sub(rb'":(\d+)', b'":Infinity', raw, count=1),
    "past-int64": lambda raw: re.sub(rb'":(\d+)', b'":' + b"9" * 24, raw, count=1),
}


@pytest.mark.parametrize("damage", sorted(LOG_DAMAGE))
@pytest.mark.parametrize("part", ["head", "block", "record"])
def test_a_damaged_log_file_is_a_named_error_on_every_read(tmp_path, small_blocks, part, damage):
    store = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    # 11 flushes: the claim, the first commit (it records the codecs: compacted at once),
    # then compactions every 3 records leave one record in the log.
    for i in range(11):
        buffer.add_trajectories([make_trajectory(4, 2, i)])
        buffer.flush()
    index = store / "index"
    target = {
        "head": index / "head.json",
        "block": sorted((index / "blocks").iterdir())[-1],
        "record": sorted((index / "log").iterdir())[-1],
    }[part]
    target.write_bytes(LOG_DAMAGE[damage](target.read_bytes()))
    buffer.close(wait=False)
    for read in (
        lambda: open_buffer(str(store), sample_window_size=0),
        lambda: TrajectoryReplayBuffer().load_checkpoint(store),
    ):
        with pytest.raises(CorruptStoreError) as info:
            read()
        assert "index" in str(info.value)
    assert [p.kind for p in verify_store(store).problems] == ["damaged_log"]
    assert verify_store(store, repair=True).ok
    assert open_buffer(str(store), sample_window_size=0).ids == list(range(11))
