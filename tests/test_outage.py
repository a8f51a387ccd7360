"""Data safety under real faults: nothing accepted is dropped, nothing of the user's touched.

Faults are injected for real: a user's file exactly where the next trajectory would be
written (a failure even root cannot bypass), and the S3 test proxy going down and up.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import s3fs
import torch
from conftest import assert_rows_consistent, assert_same_trajectory, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.s3_server import S3Proxy
from rbzarr import BufferClosedError, Trajectory, TrajectoryReplayBuffer, WriterFailedError
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class


def block(store: Path, trajectory_id: int) -> Path:
    """A user's file where zarr trajectory ``trajectory_id`` goes: its write fails."""
    path = store / "trajectories" / str(trajectory_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a user's file, in the way")
    return path


def committed_one_then_blocked(
    store: Path, count: int, **options: Any
) -> tuple[TrajectoryReplayBuffer, list[Trajectory], Path]:
    """A saving buffer with trajectory 0 of ``count`` made committed, and trajectory 1 blocked."""
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, **options)
    added = [make_trajectory(2, 2, 4 * k) for k in range(count)]
    buffer.add_trajectories(added[:1])
    buffer.flush()
    return buffer, added, block(store, 1)


def stored(url: str, options: dict[str, Any] | None = None) -> tuple[list[int], dict]:
    documents = read_store_documents(Location.from_url(url, options))
    return documents.trajectory_index["trajectory_id_list"], documents.trajectory_index


def assert_stored(url: str, added: list[Trajectory], options: dict | None = None) -> None:
    """The store lists ids 0..n-1, no holes, each holding exactly what was added."""
    ids, index = stored(url, options)
    assert ids == list(range(len(added)))
    layout = layout_class("zarr")(Location.from_url(url, options))
    for trajectory_id, trajectory in enumerate(added):
        assert_same_trajectory(
            layout.read(index["trajectory_index"][str(trajectory_id)]), trajectory
        )


def test_clear_keeps_the_users_files_and_the_store(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "train.log").write_text("epoch 1\n")
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=folder, sample_window_size=0)
    added = [make_trajectory(2, 2, 4 * k) for k in range(3)]
    buffer.add_trajectories(added[:2])
    buffer.clear()
    assert (len(buffer), buffer.total_samples, buffer.get_stats()["cache_size"]) == (0, 0, 0)
    buffer.add_trajectories(added[2:])  # a later add never reuses a stored id
    assert buffer.trajectory_counter == 3
    assert_rows_consistent(buffer.sample(8))
    buffer.close()
    assert (folder / "train.log").read_text() == "epoch 1\n"
    assert_stored(str(folder), added)


def test_a_failed_write_is_retried_until_the_store_is_back(tmp_path):
    store = tmp_path / "s"
    buffer, added, obstacle = committed_one_then_blocked(store, 4, cache_size=1)
    buffer.add_trajectories(added[1:3])  # accepted: the queue has room
    assert len(buffer) == 3
    with pytest.raises(WriterFailedError, match=r"2 write\(s\) to .*/s not committed"):
        buffer.flush(timeout=0.3)
    assert "delete_dir" in str(buffer.get_stats()["write_error"])
    # Sampling still sees every accepted trajectory (the uncommitted ones from memory).
    seen: set[int] = set()
    for _ in range(30):
        seen |= set(assert_rows_consistent(buffer.sample(12)).tolist())
    assert seen == set(range(12))
    # close() and flush() wait a bounded time and report the same, every time.
    for call in (buffer.close, buffer.close, buffer.flush):
        with pytest.raises(WriterFailedError, match=r"2 write\(s\)"):
            call(timeout=0.1)
    with pytest.raises(BufferClosedError):
        buffer.add_trajectories(added[3:])
    assert obstacle.read_text() == "a user's file, in the way"  # never deleted by rbzarr
    obstacle.unlink()
    buffer.close()
    assert_stored(str(store), added[:3])


def test_adds_work_again_by_themselves_after_an_outage(tmp_path):
    store = tmp_path / "s"
    buffer, added, obstacle = committed_one_then_blocked(store, 5, max_pending_writes=2)
    buffer.add_trajectories(added[1:3])
    before = (len(buffer), buffer.total_samples, buffer.trajectory_counter)
    # The queue is full and the store failing: refused (after one more retry), nothing changed.
    with pytest.raises(WriterFailedError, match="nothing changed"):
        buffer.add_trajectories(added[3:4])
    assert (len(buffer), buffer.total_samples, buffer.trajectory_counter) == before
    obstacle.unlink()
    # The writer's own retry commits the queue; flush() only waits for it (an attempt that
    # began before the unlink may still fail once).  Then adds are accepted again.
    buffer.flush()
    buffer.add_trajectories(added[3:4])
    buffer.add_trajectories(added[4:])
    buffer.close()
    assert_stored(str(store), added)


def test_validation_completes_before_anything_changes(tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s")
    good = make_trajectory(2, 2, 0)
    buffer.add_trajectories([good])
    buffer.flush()  # the first write settled: its stats do not move under the comparison
    before = (len(buffer), buffer.total_samples, buffer.trajectory_counter, buffer.get_stats())
    reordered = make_trajectory(2, 2, 4)
    reordered.curr_obs = {"extra": torch.zeros(2, 2), **reordered.curr_obs}
    with pytest.raises(ValueError, match="curr_obs/extra"):
        buffer.add_trajectories([make_trajectory(2, 2, 4), reordered])
    assert (
        len(buffer),
        buffer.total_samples,
        buffer.trajectory_counter,
        buffer.get_stats(),
    ) == before
    buffer.close()
    assert_stored(str(tmp_path / "s"), [good])


def with_two_keys(base: int, order: list[int]) -> Trajectory:
    trajectory = make_trajectory(2, 2, base)
    for name in ("curr_obs", "next_obs"):
        fields = getattr(trajectory, name)
        fields["second"] = fields["state"] * 2
        keys = list(fields)
        setattr(trajectory, name, {keys[i]: fields[keys[i]] for i in order})
    return trajectory


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.lists(st.permutations([0, 1]), min_size=2, max_size=5))
def test_dict_key_order_never_matters(orders):
    buffer = TrajectoryReplayBuffer(sample_window_size=0, seed=3)
    for k, order in enumerate(orders):
        buffer.add_trajectories([with_two_keys(4 * k, order)])
    batch = buffer.sample(64)
    numbers = assert_rows_consistent(batch)
    assert list(batch["curr_obs"]) == list(with_two_keys(0, orders[0]).curr_obs)
    assert torch.equal(batch["curr_obs"]["second"][:, 0], numbers.to(torch.float64) * 2)
    assert len(buffer) == len(orders) == buffer.get_stats()["cache_size"]


@pytest.fixture
def fast_s3_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)


@pytest.mark.s3
@pytest.mark.usefixtures("fast_s3_retries")
def test_every_trajectory_accepted_during_an_s3_outage_is_stored(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict
):
    url = f"s3://{s3_bucket}/run"
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=s3_options,
        cache_size=2,
        max_pending_writes=3,
    )
    accepted: list[Trajectory] = []

    def add(k: int) -> bool:
        trajectory = make_trajectory(2, 2, 4 * k)
        try:
            buffer.add_trajectories([trajectory])
        except WriterFailedError as error:
            assert re.search("nothing changed", str(error)) and url in str(error)
            return False
        accepted.append(trajectory)
        return True

    add(0)
    buffer.flush()
    s3_proxy.go_down()
    outcomes = [add(k) for k in range(1, 8)]
    # A training loop that logs errors and keeps going: some adds were queued, later ones
    # refused once the queue was full; every counted trajectory is one that was accepted.
    assert outcomes[:3] == [True, True, True] and not all(outcomes)
    assert len(buffer) == len(accepted)
    s3_proxy.go_up()
    buffer.flush()
    for k in range(8, 10):  # after recovery, adds just work
        assert add(k)
    buffer.close()
    assert_stored(url, accepted, s3_direct_options)
    metadata = json.loads(Location.from_url(url, s3_direct_options).read_bytes("metadata.json"))
    assert metadata["size"] == len(accepted)


EXIT_WITHOUT_CLOSE = """
import sys, torch
sys.path.insert(0, {tests!r})
from conftest import make_trajectory
from rbzarr import TrajectoryReplayBuffer
buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path={store!r}, max_pending_writes=16)
buffer.add_trajectories([make_trajectory(16, 8, 128 * k) for k in range(12)])
# the script ends without close(): the queued writes must still commit
"""


def test_a_script_that_exits_without_close_keeps_its_trajectories(tmp_path):
    store = tmp_path / "s"
    script = EXIT_WITHOUT_CLOSE.format(tests=str(Path(__file__).parent), store=str(store))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    assert_stored(str(store), [make_trajectory(16, 8, 128 * k) for k in range(12)])


@pytest.mark.s3
def test_clear_keeps_the_users_objects_and_the_store_on_s3(
    s3_bucket: str, s3_options: dict[str, Any], s3_direct_options: dict
):
    url = f"s3://{s3_bucket}/run"
    user_file = Location.from_url(url, s3_direct_options)
    user_file.write_bytes(b"epoch 1\n", "train.log")
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_options, sample_window_size=0
    )
    added = [make_trajectory(2, 2, 4 * k) for k in range(3)]
    buffer.add_trajectories(added[:2])
    buffer.clear()
    buffer.add_trajectories(added[2:])
    assert buffer.trajectory_counter == 3
    buffer.close()
    assert user_file.read_bytes("train.log") == b"epoch 1\n"
    assert_stored(url, added, s3_direct_options)
