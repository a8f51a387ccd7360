"""Resuming: RLinf's checkpoints as RLinf writes them, and the resume flows of its workers.

RLinf-layout folders are written here with plain ``torch.save`` / ``pickle.dump`` and
``json.dump``, exactly as RLinf writes them: its checkpoint index lists every id it ever
added, but only the window's trajectories have files.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from conftest import (
    assert_rows_consistent,
    assert_same_trajectory,
    make_trajectory,
    save_as_rlinf,
)

from rbzarr import CheckpointNotFoundError, Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import read_documents

T, B = 2, 3
ROWS = T * B


def traj(i: int) -> Trajectory:
    """Trajectory ``i``: its flat rows encode ``ROWS * i + row``."""
    return make_trajectory(T, B, ROWS * i, mwid=f"w{i}")


def write_rlinf_store(
    folder: Path, fmt: str, listed: list[int], saved: list[int], uuids: dict[int, str]
) -> None:
    """What RLinf's ``save_checkpoint`` (or its auto-save) leaves in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in saved:
        save_as_rlinf(traj(i), folder, i, fmt)
    index = {
        str(i): {
            "num_samples": ROWS,
            "trajectory_id": i,
            "max_episode_length": T,
            "shape": [T, B],
            "model_weights_id": f"w{i}",
            "uuid": uuids.setdefault(i, str(uuid.uuid4())),
        }
        for i in listed
    }
    metadata = {
        "trajectory_format": fmt,
        "size": len(listed),
        "total_samples": ROWS * len(listed),
        "trajectory_counter": max(listed) + 1,
        "seed": 1234,
    }
    with open(folder / "metadata.json", "w") as handle:
        json.dump(metadata, handle)
    with open(folder / "trajectory_index.json", "w") as handle:
        json.dump({"trajectory_index": index, "trajectory_id_list": listed}, handle)


def sources(buffer: TrajectoryReplayBuffer, draws: int = 20) -> set[int]:
    seen: set[int] = set()
    for _ in range(draws):
        seen |= set((assert_rows_consistent(buffer.sample(64)) // ROWS).tolist())
    return seen


def listed(url) -> list[int]:
    return read_documents(Location.from_url(url)).trajectory_index["trajectory_id_list"]


def data_bytes(folder: Path) -> dict[Path, bytes]:
    """Every trajectory data file below ``folder`` (not the two documents)."""
    documents = ("metadata.json", "trajectory_index.json")
    # The index log (index/) is rbzarr's index, rewritten as it compacts.
    return {
        p: p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name not in documents and "index" not in p.relative_to(folder).parts
    }


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_an_rlinf_checkpoint_listing_unsaved_ids_loads_what_exists(tmp_path, fmt):
    ckpt = tmp_path / "ckpt"
    write_rlinf_store(ckpt, fmt, listed=list(range(7)), saved=[4, 5, 6], uuids={})
    buffer = TrajectoryReplayBuffer(seed=3, sample_window_size=0)
    with pytest.warns(UserWarning, match=r"skipped trajectories \[0, 1, 2, 3\]") as warned:
        buffer.load_checkpoint(ckpt)
    assert len(warned) == 1
    assert (len(buffer), buffer.total_samples, buffer.trajectory_counter) == (3, 3 * ROWS, 7)
    assert buffer.trajectory_ids == [4, 5, 6]
    assert sources(buffer) == {4, 5, 6}
    buffer.add_trajectories([traj(7)])
    assert buffer.trajectory_ids[-1] == 7

    strict = TrajectoryReplayBuffer(seed=3)
    with pytest.raises(CheckpointNotFoundError, match=r"\[0, 1, 2, 3\]"):
        strict.load_checkpoint(ckpt, strict=True)
    assert (len(strict), strict.trajectory_counter) == (0, 0)


def test_an_rlinf_checkpoint_is_sharded_over_what_it_lists(tmp_path):
    ckpt = tmp_path / "ckpt"
    write_rlinf_store(ckpt, "pt", listed=list(range(6)), saved=[3, 4, 5], uuids={})
    shares = []
    for rank in range(2):
        buffer = TrajectoryReplayBuffer(seed=3)
        if rank == 0:  # its whole share was never saved
            with pytest.warns(UserWarning, match=r"skipped trajectories \[0, 1, 2\]"):
                buffer.load_checkpoint(ckpt, is_distributed=True, local_rank=0, world_size=2)
        else:
            buffer.load_checkpoint(ckpt, is_distributed=True, local_rank=1, world_size=2)
        shares.append((buffer.trajectory_ids, buffer.trajectory_counter))
    # RLinf's shares are cut from the listed ids: rank 0 owns 0..2 (one saved), rank 1 3..5.
    assert shares == [([], 3), ([3, 4, 5], 6)]


def test_load_adopts_the_format_stored_at_the_path(tmp_path):
    ckpt = tmp_path / "ckpt"
    write_rlinf_store(ckpt, "pkl", listed=[0, 1], saved=[0, 1], uuids={})
    buffer = TrajectoryReplayBuffer(seed=1)
    buffer.load_checkpoint(ckpt)
    assert buffer.trajectory_format == "pkl"
    buffer.save_checkpoint(tmp_path / "again")
    again = read_documents(Location.from_url(tmp_path / "again"))
    assert again.metadata["trajectory_format"] == "pkl"
    assert sorted(p.name for p in (tmp_path / "again").glob("*.pkl")) == [
        "trajectory_0_w0.pkl",
        "trajectory_1_w1.pkl",
    ]


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_sac_resume_keeps_the_earlier_run_and_appends(tmp_path, fmt):
    """Run 1 auto-saves into its log folder and checkpoints its window; run 2 builds the
    buffer on the same log folder and loads the checkpoint (RLinf's SAC / DAgger resume)."""
    log = tmp_path / "logs"
    log.mkdir()
    (log / "train.log").write_text("run 1\n")
    options = {"sample_window_size": 3, "auto_save": True, "auto_save_path": log}
    with TrajectoryReplayBuffer(seed=1, trajectory_format=fmt, **options) as first:
        for i in range(6):
            first.add_trajectories([traj(i)])
        first.save_checkpoint(tmp_path / "ckpt")
    earlier = data_bytes(log)

    with TrajectoryReplayBuffer(seed=1, **options) as second:  # format: the store's
        assert second.trajectory_format == fmt
        second.load_checkpoint(tmp_path / "ckpt")
        assert second.trajectory_ids == [3, 4, 5]
        assert (second.total_samples, second.trajectory_counter) == (3 * ROWS, 6)
        assert sources(second) == {3, 4, 5}
        second.add_trajectories([traj(6)])
        assert second.trajectory_ids == [3, 4, 5, 6]
    assert listed(log) == list(range(7))
    for path, content in earlier.items():
        if path.name != "zarr.json" or path.parent != log:  # the root's attributes move on
            assert path.read_bytes() == content, path
    layout = layout_class(fmt)(Location.from_url(log))
    index = read_documents(Location.from_url(log)).trajectory_index["trajectory_index"]
    for i in range(7):
        assert_same_trajectory(layout.read(index[str(i)]), traj(i))


def test_sac_resume_on_an_rlinf_log_folder_and_checkpoint(tmp_path):
    """Both folders written by RLinf: the auto-save store holds every trajectory, the
    checkpoint lists them all but holds only the window."""
    uuids: dict[int, str] = {}
    write_rlinf_store(
        tmp_path / "logs", "pt", listed=list(range(5)), saved=list(range(5)), uuids=uuids
    )
    write_rlinf_store(tmp_path / "ckpt", "pt", listed=list(range(5)), saved=[3, 4], uuids=uuids)
    (tmp_path / "logs" / "train.log").write_text("run 1\n")
    earlier = data_bytes(tmp_path / "logs")
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "logs", seed=2)
    with pytest.warns(UserWarning, match=r"skipped trajectories \[0, 1, 2\]"):
        buffer.load_checkpoint(tmp_path / "ckpt")
    assert (buffer.trajectory_ids, buffer.trajectory_counter) == ([3, 4], 5)
    buffer.add_trajectories([traj(5)])
    buffer.close()
    assert listed(tmp_path / "logs") == list(range(6))
    for path, content in earlier.items():
        assert path.read_bytes() == content, path


def test_visualizer_flow_opens_an_rlinf_folder_in_place(tmp_path):
    """RLinf's visualizer: ``TrajectoryReplayBuffer(auto_save=True, auto_save_path=D)`` then
    ``load_checkpoint(D)`` on a pt folder."""
    folder = tmp_path / "D"
    write_rlinf_store(folder, "pt", listed=[0, 1, 2], saved=[0, 1, 2], uuids={})
    earlier = data_bytes(folder)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=folder)
    buffer.load_checkpoint(folder)
    assert buffer.trajectory_ids == [0, 1, 2]
    assert_same_trajectory(buffer._load_trajectory(1, "w1"), traj(1))
    buffer.close()
    assert data_bytes(folder) == earlier


def test_rerunning_a_collection_script_appends(tmp_path):
    for run in range(3):
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
            buffer.add_trajectories([traj(2 * run), traj(2 * run + 1)])
    assert listed(tmp_path / "s") == list(range(6))


def test_continuing_an_rlinf_checkpoint_in_place_lists_only_what_exists(tmp_path):
    folder = tmp_path / "ckpt"
    write_rlinf_store(folder, "pt", listed=list(range(5)), saved=[3, 4], uuids={})
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=folder)
    with pytest.warns(UserWarning, match=r"skipped trajectories \[0, 1, 2\]"):
        buffer.load_checkpoint(folder)
    buffer.add_trajectories([traj(5)])
    buffer.close()
    # Now an rbzarr store: it lists exactly what it holds, so it loads strictly.
    assert listed(folder) == [3, 4, 5]
    again = TrajectoryReplayBuffer()
    again.load_checkpoint(folder, strict=True)
    assert again.trajectory_ids == [3, 4, 5]
