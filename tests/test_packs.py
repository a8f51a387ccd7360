"""Packs: small trajectories queued together are one group on disk and read as their own.

A packed store and the same trajectories written one group each (``pack_bytes=0``) must read
the same, whole and by rows, and sample the same for a seed; a pack goes with its last
member; ``verify`` checks packs; a member naming a pack that does not list it is refused.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import assert_same_trajectory, index_entry, make_trajectory
from faults import KINDS, Faults
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import (
    CorruptStoreError,
    StorageUnavailableError,
    TrajectoryReplayBuffer,
    WriterFailedError,
    open_buffer,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.storage.index.retention import Retention
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import packs
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory import tree

SEED = 11


def write_store(
    path: Path, trajectories: list, pack_bytes: int | None = None, adds: int = 1
) -> None:
    """Write ``trajectories`` to a new zarr store at ``path`` in ``adds`` calls of
    ``add_trajectories``, every write queued before the writer runs."""
    options = {} if pack_bytes is None else {"layout_options": {"pack_bytes": pack_bytes}}
    with TrajectoryReplayBuffer(
        seed=SEED,
        auto_save=True,
        auto_save_path=str(path),
        trajectory_format="zarr",
        max_pending_writes=len(trajectories) + 1,
        **options,
    ) as buffer:
        step = -(-len(trajectories) // adds)
        for first in range(0, len(trajectories), step):
            buffer.add_trajectories(trajectories[first : first + step])
        buffer.flush()


def entries(path: Path) -> dict[str, dict]:
    return json.loads((path / "trajectory_index.json").read_text())["trajectory_index"]


def listed(path: Path) -> list[int]:
    """The ids a new reader lists."""
    documents = read_store_documents(Location.from_url(str(path)))
    return list(documents.trajectory_index["trajectory_id_list"])


def pack_names(path: Path) -> list[str]:
    folder = path / packs.PACKS
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def assert_same_batch(got: dict, want: dict) -> None:
    flat_got, flat_want = tree.flatten(got), tree.flatten(want)
    assert list(flat_got) == list(flat_want)
    for key, value in flat_want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(flat_got[key], value), key
        else:
            assert flat_got[key] == value, key


@settings(max_examples=12, deadline=None)
@given(
    T=st.integers(1, 6),
    B=st.integers(1, 3),
    epochs=st.sampled_from([1, 2]),
    count=st.integers(2, 9),
    adds=st.integers(1, 3),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=8),
)
def test_packed_trajectories_read_and_sample_as_those_written_one_group_each(
    T, B, epochs, count, adds, picks
):
    if T % epochs:
        epochs = 1
    trajectories = [make_trajectory(T, B, 1000 * k, epochs) for k in range(count)]
    with tempfile.TemporaryDirectory() as folder:
        packed, plain = Path(folder) / "packed", Path(folder) / "plain"
        write_store(packed, trajectories, adds=adds)
        write_store(plain, trajectories, pack_bytes=0)
        assert not pack_names(plain)
        assert pack_names(packed) or adds > 1  # queued in one add: packed for sure
        members = 0
        for name in pack_names(packed):
            group = zarr.open_group(packed / packs.PACKS / name, mode="r")
            listed = group.attrs[packs.PACK_ATTR]["members"]
            members += len(listed)
            first = listed[0][0]
            # Plain zarr reads the pack's rows, the members' end to end.
            want = torch.cat([trajectories[tid].rewards for tid, _ in listed])
            assert np.array_equal(group["rewards"][...], want.numpy())
            assert first == int(name.split("-")[0])
        for tid in range(count):
            files = os.listdir(packed / "trajectories" / str(tid))
            assert files == ["zarr.json"] or tid not in _packed_ids(packed)
        assert members == len(_packed_ids(packed))
        here, there = (ZarrLayout(Location.from_url(str(p))) for p in (packed, plain))
        index = entries(packed)
        assert index.keys() == entries(plain).keys()
        rows = np.array(picks) % (T * B)
        for key, entry in index.items():
            assert_same_trajectory(here.read(entry), trajectories[int(key)])
            keys = list(here.fields(entry))
            sampled = [k for k in keys if len(here.read_arrays(entry, [k])[k].shape) >= 2]
            got, want = here.read_rows(entry, rows, sampled), there.read_rows(entry, rows, sampled)
            for k in sampled:
                assert np.array_equal(got[k], want[k]), k
        for view in ("sample", "sample_sequences"):
            a, b = open_buffer(packed, seed=3), open_buffer(plain, seed=3)
            for _ in range(3):
                if view == "sample":
                    assert_same_batch(a.sample(16), b.sample(16))
                else:
                    assert_same_batch(a.sample_sequences(4, 1), b.sample_sequences(4, 1))


def _packed_ids(path: Path) -> set[int]:
    found: set[int] = set()
    for name in pack_names(path):
        group = zarr.open_group(path / packs.PACKS / name, mode="r")
        found.update(tid for tid, _ in group.attrs[packs.PACK_ATTR]["members"])
    return found


def test_a_burst_of_small_trajectories_is_one_pack_of_few_files(tmp_path):
    trajectories = [make_trajectory(4, 2, 100 * k) for k in range(16)]
    write_store(tmp_path / "s", trajectories)
    assert len(pack_names(tmp_path / "s")) == 1
    files = sum(len(names) for _, _, names in os.walk(tmp_path / "s" / "trajectories"))
    assert files == 16 + 1  # a marker per member, the folder's own group document
    reader = open_buffer(tmp_path / "s")
    assert reader.ids == list(range(16))


def test_large_or_differently_shaped_trajectories_are_not_packed(tmp_path):
    shapes = [make_trajectory(4, 2, 0), make_trajectory(3, 2, 100), make_trajectory(4, 2, 200)]
    write_store(tmp_path / "mixed", shapes)
    assert pack_names(tmp_path / "mixed") == []  # no two neighbours share a schema
    write_store(tmp_path / "large", [make_trajectory(4, 2, 100 * k) for k in range(3)], 64)
    assert pack_names(tmp_path / "large") == []
    with pytest.raises(ValueError, match="pack_bytes"):
        ZarrLayout(Location.from_url(str(tmp_path / "x")), pack_bytes=-1)


def test_a_pack_goes_with_its_last_member(tmp_path):
    trajectories = [make_trajectory(2, 2, 100 * k) for k in range(5)]
    store = tmp_path / "s"
    write_store(store, trajectories)
    (name,) = pack_names(store)
    layout = ZarrLayout(Location.from_url(str(store)))
    index = entries(store)
    for tid in (3, 0, 4, 1):
        layout.delete(index[str(tid)])
        assert pack_names(store) == [name]
        assert_same_trajectory(layout.read(index["2"]), trajectories[2])
    layout.delete(index["2"])
    assert pack_names(store) == []


def test_retention_collects_packs_as_it_drops_their_members(tmp_path):
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(
        seed=SEED,
        auto_save=True,
        auto_save_path=str(store),
        max_pending_writes=64,
        sample_window_size=4,
        retention=Retention(last=6, grace=0),
    ) as buffer:
        for burst in range(5):
            trajectories = [make_trajectory(2, 2, 100 * (4 * burst + k)) for k in range(4)]
            buffer.add_trajectories(trajectories)
            buffer.flush()
            kept = listed(store)
            assert kept[-4:] == list(range(4 * burst, 4 * burst + 4))
            # A pack stays while one of its members is listed, and no longer.
            assert {tid // 4 for tid in kept} == {
                int(n.split("-")[0]) // 4 for n in pack_names(store)
            }
    assert verify_store(store).ok


def test_retention_by_bytes_counts_a_members_share_of_its_pack(tmp_path):
    store = tmp_path / "s"
    write_store(store, [make_trajectory(2, 2, 100 * k) for k in range(4)])
    layout = ZarrLayout(Location.from_url(str(store)))
    index = entries(store)
    location = Location.from_url(str(store))
    (name,) = pack_names(store)
    pack = location.tree_bytes(packs.PACKS, name)
    for key, entry in index.items():
        own = location.tree_bytes("trajectories", key)
        assert layout.stored_bytes(entry) == own + pack // 4


def test_verify_checks_packs_and_repair_drops_the_members_of_a_lost_pack(tmp_path):
    store = tmp_path / "s"
    first = [make_trajectory(2, 2, 100 * k) for k in range(3)]
    write_store(store, first)
    with TrajectoryReplayBuffer(seed=SEED, auto_save=True, auto_save_path=str(store)) as buffer:
        buffer.add_trajectories([make_trajectory(3, 2, 900)])  # alone: its own group
    assert verify_store(store).ok
    (name,) = pack_names(store)
    location = Location.from_url(str(store))
    location.delete(packs.PACKS, name)
    report = verify_store(store)
    assert not report.ok
    assert {problem.trajectory_id for problem in report.problems} == {0, 1, 2}
    with pytest.raises(CorruptStoreError, match="pack"):
        ZarrLayout(location).read(entries(store)["1"])
    repaired = verify_store(store, repair=True, drop_damaged=True)
    assert verify_store(store).ok, repaired.problems
    assert list(entries(store)) == ["3"]


def test_a_member_its_pack_does_not_list_is_refused(tmp_path):
    store = tmp_path / "s"
    write_store(store, [make_trajectory(2, 2, 100 * k) for k in range(3)])
    (name,) = pack_names(store)
    marker = store / packs.PACKS / name / "zarr.json"
    document = json.loads(marker.read_text())
    members = document["attributes"][packs.PACK_ATTR]["members"]
    members[0], members[1] = members[1], members[0]
    marker.write_text(json.dumps(document))
    layout = ZarrLayout(Location.from_url(str(store)))
    with pytest.raises(CorruptStoreError, match="is not member 0"):
        layout.read(entries(store)["0"])
    group = store / "trajectories" / "2" / "zarr.json"
    document = json.loads(group.read_text())
    document["attributes"]["rbzarr_layout"]["pack"]["group"] = "../../outside"
    group.write_text(json.dumps(document))
    with pytest.raises(CorruptStoreError, match="pack reference"):
        layout.read(entries(store)["2"])


def test_dask_and_xarray_read_a_members_rows_of_its_pack(tmp_path):
    trajectories = [make_trajectory(4, 2, 100 * k, epochs=2) for k in range(3)]
    store = tmp_path / "s"
    write_store(store, trajectories)
    view = open_buffer(store)
    arrays = view.dask_arrays("dones")
    for tid, want in enumerate(trajectories):
        assert np.array_equal(arrays[tid].compute(), want.dones.numpy())
        dataset = view.xarray_dataset(tid)
        assert np.array_equal(dataset["curr_obs/state"].values, want.curr_obs["state"].numpy())
        assert np.array_equal(dataset["dones"].values, want.dones.numpy())
    assert list(view.zarr_group(1).attrs["rbzarr_layout"]["pack"]) == ["group", "member", "members"]


def test_verify_repair_removes_a_pack_no_listed_trajectory_is_a_member_of(tmp_path):
    store = tmp_path / "s"
    write_store(store, [make_trajectory(2, 2, 100 * k) for k in range(2)])
    layout = ZarrLayout(Location.from_url(str(store)))
    # An interrupted commit: a pack and its members' groups written, no record listing them.
    items = [(index_entry(tid, 2, 2), make_trajectory(2, 2, 100 * tid)) for tid in (5, 6, 7)]
    assert layout.write_many(items) == 3
    assert len(pack_names(store)) == 2
    report = verify_store(store)
    orphans = sorted(p.path for p in report.problems if p.kind == "orphan")
    unneeded = [f"{packs.PACKS}/{n}" for n in pack_names(store) if n.startswith("5-")]
    assert orphans == sorted(["trajectories/5", "trajectories/6", "trajectories/7", *unneeded])
    verify_store(store, repair=True)
    assert verify_store(store).ok
    assert [n.split("-")[0] for n in pack_names(store)] == ["0"]
    assert listed(store) == [0, 1]


@pytest.mark.s3
@pytest.mark.timeout(180)
def test_a_packed_store_copied_to_s3_reads_as_it_did_with_and_without_the_local_cache(
    s3_bucket, s3_direct_options, s3_options, tmp_path
):
    import fsspec  # noqa: PLC0415

    trajectories = [make_trajectory(3, 2, 100 * k, epochs=3) for k in range(6)]
    packed, plain = tmp_path / "packed", tmp_path / "plain"
    write_store(packed, trajectories, adds=2)
    write_store(plain, trajectories, pack_bytes=0)
    assert pack_names(packed)  # one pack or two: the second add may join the first
    fs = fsspec.filesystem("s3", **s3_direct_options)
    fs.put(f"{packed}/", f"{s3_bucket}/store", recursive=True)
    url = f"s3://{s3_bucket}/store"
    for cache in (None, tmp_path / "cache"):
        remote, local = (
            open_buffer(url, s3_options, seed=4, local_cache_dir=cache),
            open_buffer(plain, seed=4),
        )
        for _ in range(3):
            assert_same_batch(remote.sample(20), local.sample(20))
        for tid, want in enumerate(trajectories):
            assert_same_trajectory(remote.trajectory(tid), want)


def test_repair_dropping_a_damaged_packs_members_removes_the_pack_in_the_same_pass(tmp_path):
    store = tmp_path / "s"
    write_store(store, [make_trajectory(2, 2, 100 * k) for k in range(3)])
    (name,) = pack_names(store)
    shard = next(
        p for p in (store / packs.PACKS / name / "rewards").iterdir() if p.name != "zarr.json"
    )
    shard.write_bytes(shard.read_bytes()[:5])
    report = verify_store(store)
    assert {p.trajectory_id for p in report.problems} == {0, 1, 2}
    verify_store(store, repair=True, drop_damaged=True)
    assert verify_store(store).ok
    assert pack_names(store) == [] and listed(store) == []


def test_every_storage_call_of_a_pack_commit_and_its_collection_fails_in_turn(
    tmp_path, monkeypatch
):
    """A burst of 4 (one pack) whose commit collects the burst before it (its pack with its
    last member): each storage call fails once, stays down a while, loses its reply or
    hangs, then storage heals and ``flush()`` runs again.  Nothing flushed is lost or listed
    twice, a reader reads every listed trajectory whole at every fault and its listing
    never shrinks but by the collection, and no pack outlives its members."""
    faults = Faults(monkeypatch)
    made = {tid: make_trajectory(2, 2, 100 * tid) for tid in range(8)}

    def case(path: Path, k: int | None, kind: str) -> list[str]:
        def observe() -> None:
            documents = read_store_documents(Location.from_url(str(path)))
            ids = list(documents.trajectory_index["trajectory_id_list"])
            assert len(ids) == len(set(ids)) and set(range(4, 8)) & set(seen) <= set(ids)
            layout = ZarrLayout(Location.from_url(str(path)))
            for tid in ids:
                entry = documents.trajectory_index["trajectory_index"][str(tid)]
                assert_same_trajectory(layout.read(entry), made[tid])
            seen[:] = ids

        seen: list[int] = []
        buffer = TrajectoryReplayBuffer(
            seed=SEED,
            auto_save=True,
            auto_save_path=str(path),
            sample_window_size=4,
            retention=Retention(last=4, grace=0),
            max_pending_writes=8,
        )
        buffer.add_trajectories([made[tid] for tid in range(4)])
        buffer.flush()
        faults.on_fault = observe
        faults.count() if k is None else faults.arm(k, kind)
        try:
            buffer.add_trajectories([made[tid] for tid in range(4, 8)])
            buffer.flush(timeout=10)
        except (StorageUnavailableError, WriterFailedError, OSError):
            pass
        finally:
            faults.disarm()
            faults.on_fault = None
        calls = list(faults.calls)
        for attempt in range(4):
            try:
                buffer.flush()
                buffer.close()
                break
            except (StorageUnavailableError, WriterFailedError, OSError):
                assert attempt < 3
        observe()
        assert set(range(4, 8)) <= set(seen) <= set(range(8))
        if not verify_store(path).ok:
            assert verify_store(path, repair=True).ok or verify_store(path).ok
        assert verify_store(path).ok
        observe()
        assert set(range(4, 8)) <= set(seen)
        needed = {
            n for n in pack_names(path) if set(seen) & {int(n.split("-")[0]) + i for i in range(4)}
        }
        assert set(pack_names(path)) == needed
        return calls

    calls = case(tmp_path / "count", None, "fail")
    assert "commit_file" in calls and "delete" in calls, calls
    for k, kind in itertools.product(range(len(calls)), KINDS):
        try:
            case(tmp_path / f"s{k}-{kind}", k, kind)
        except AssertionError as exc:
            raise AssertionError(f"call {k} ({calls[k]}), {kind}: {exc}") from exc
