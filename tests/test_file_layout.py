"""The pt/pkl layouts: RLinf's file-per-trajectory directories, read and written safely."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_same_trajectory, save_as_rlinf

from rbzarr.errors import (
    CheckpointNotFoundError,
    CorruptStoreError,
    InvalidTrajectoryError,
    UnsafePathError,
    UnsafePickleError,
)
from rbzarr.storage.index.schema import check_schema
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.file_layout import FileLayout, PklLayout, PtLayout
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, validate

LAYOUTS = [PtLayout, PklLayout]


def make_trajectory(T: int = 4, B: int = 3, E: int = 2, mwid: str = "w0") -> Trajectory:
    """A trajectory using every field and the awkward dtypes; dones has T + E rows."""
    g = torch.Generator().manual_seed(T * 100 + B * 10 + E)
    return Trajectory(
        max_episode_length=17,
        model_weights_id=mwid,
        actions=torch.randn(T, B, 2, generator=g).to(torch.bfloat16),
        intervene_flags=torch.rand(T, B, generator=g) > 0.5,
        rewards=torch.randn(T, B, generator=g).to(torch.float16),
        terminations=torch.rand(T + E, B, generator=g) > 0.5,
        truncations=torch.zeros(T + E, B, dtype=torch.bool),
        dones=torch.rand(T + E, B, 1, generator=g) > 0.5,
        prev_logprobs=torch.randn(T, B, 2, generator=g),
        prev_values=torch.randn(T, B, 1, generator=g).double(),
        versions=torch.randint(0, 2**40, (T, B), generator=g, dtype=torch.int64),
        forward_inputs={"action_tokens": torch.randint(0, 9, (T, B, 5), generator=g)},
        curr_obs={
            "image": torch.randint(0, 256, (T, B, 2, 2), generator=g, dtype=torch.uint8),
            "state": {"joints": torch.randn(T, B, 3, generator=g)},
        },
        next_obs={"image": torch.randint(0, 256, (T, B, 2, 2), generator=g, dtype=torch.uint8)},
    )


def entry_for(trajectory: Trajectory, trajectory_id: int) -> dict[str, Any]:
    spec = validate(trajectory)
    return {
        "uuid": f"uuid-{trajectory_id}",
        "trajectory_id": trajectory_id,
        "num_samples": spec.num_samples,
        "shape": list(spec.shape),
        "max_episode_length": trajectory.max_episode_length,
        "model_weights_id": trajectory.model_weights_id,
    }


def written(
    layout: FileLayout, trajectory_id: int
) -> tuple[FileLayout, Trajectory, dict[str, Any]]:
    """``layout`` with a :func:`make_trajectory` written as ``trajectory_id``: the layout,
    the trajectory and its entry."""
    want = make_trajectory()
    entry = entry_for(want, trajectory_id)
    layout.write(entry, want)
    return layout, want, entry


@pytest.mark.parametrize("cls", LAYOUTS)
def test_round_trip_every_field_and_dtype(tmp_path: Path, cls: type[FileLayout]) -> None:
    layout, want, entry = written(cls(Location.from_url(tmp_path)), 3)
    assert os.listdir(tmp_path) == [f"trajectory_3_w0.{cls.suffix}"]
    got = layout.read(entry)
    assert_same_trajectory(got, want)
    assert got.dones is not None and got.dones.shape == (6, 3, 1)
    assert layout.list_ids() == [3]


@pytest.mark.parametrize("cls", LAYOUTS)
def test_round_trip_on_memory_filesystem(memory_url: str, cls: type[FileLayout]) -> None:
    layout = cls(Location.from_url(memory_url))
    want = make_trajectory(T=2, B=2, E=1, mwid="m")
    layout.write(entry_for(want, 0), want)
    assert_same_trajectory(layout.read(entry_for(want, 0)), want)
    assert layout.list_ids() == [0]
    layout.delete(entry_for(want, 0))
    assert layout.list_ids() == []


@pytest.mark.parametrize("cls", LAYOUTS)
def test_contains_and_copy_to(tmp_path: Path, cls: type[FileLayout]) -> None:
    source = cls(Location.from_url(tmp_path / "a"))
    target = cls(Location.from_url(tmp_path / "b"))
    want = make_trajectory()
    entry = entry_for(want, 5)
    assert source.trajectory_path(entry) == (f"trajectory_5_w0.{cls.suffix}",)
    assert not source.audit().contains(entry)
    source.write(entry, want)
    assert source.audit().contains(entry)
    source.copy_to(target, entry)
    assert target.audit().contains(entry)
    assert_same_trajectory(target.read(entry), want)
    other = PklLayout if cls is PtLayout else PtLayout
    converted = other(Location.from_url(tmp_path / "c"))
    source.copy_to(converted, entry)
    assert_same_trajectory(converted.read(entry), want)


@pytest.mark.parametrize("cls", LAYOUTS)
def test_read_selected_keys(tmp_path: Path, cls: type[FileLayout]) -> None:
    layout, want, entry = written(cls(Location.from_url(tmp_path)), 0)
    got = layout.read(entry, ["rewards", "curr_obs/state/joints", "dones"])
    assert list(got.tensors()) == ["rewards", "dones", "curr_obs/state/joints"]
    assert torch.equal(got.curr_obs["state"]["joints"], want.curr_obs["state"]["joints"])
    with pytest.raises(CorruptStoreError, match=r"fields \['curr_obs/depth'\] missing"):
        layout.read(entry, ["curr_obs/depth"])


@pytest.mark.parametrize("cls", LAYOUTS)
def test_read_rows_default_matches_flat_view(tmp_path: Path, cls: type[FileLayout]) -> None:
    layout, want, entry = written(cls(Location.from_url(tmp_path)), 0)
    rows = torch.tensor([11, 0, 5, 5], dtype=torch.int64)
    keys = ["dones", "actions", "next_obs/image"]
    got = layout.read_rows(entry, rows.numpy(), keys)
    flat = flatten_trajectory(want, validate(want))
    for key in keys:
        assert got[key].dtype == to_numpy(flat[key]).dtype, key
        np.testing.assert_array_equal(got[key], to_numpy(flat[key][rows]), err_msg=key)


@pytest.mark.parametrize("cls", LAYOUTS)
def test_a_schema_check_decodes_the_file_once(
    tmp_path: Path, cls: type[FileLayout], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, want, entry = written(cls(Location.from_url(tmp_path)), 0)
    keys = ["dones", "actions", "next_obs/image"]
    decoded: list[str] = []
    real_loads = cls._loads

    def counted(self: FileLayout, data: bytes, source: str) -> Any:
        decoded.append(source)
        return real_loads(self, data, source)

    monkeypatch.setattr(cls, "_loads", counted)
    rows, names = layout.first_row(entry, keys)
    assert len(decoded) == 1
    assert names == layout.fields(entry)
    apart = layout.read_rows(entry, np.zeros(1, dtype=np.int64), keys)
    for key in keys:
        assert rows[key].dtype == apart[key].dtype, key
        np.testing.assert_array_equal(rows[key], apart[key], err_msg=key)
    decoded.clear()
    check_schema(validate(want).schema, layout, entry)
    assert len(decoded) == 1


@pytest.mark.parametrize("cls", LAYOUTS)
def test_views_are_written_compactly(tmp_path: Path, cls: type[FileLayout]) -> None:
    big = torch.arange(1000 * 2 * 64, dtype=torch.float32).reshape(1000, 2, 64)
    small = Trajectory(rewards=big[10:12, :, 0], model_weights_id="v")
    layout = cls(Location.from_url(tmp_path))
    layout.write(entry_for(small, 0), small)
    assert (tmp_path / f"trajectory_0_v.{cls.suffix}").stat().st_size < 4096
    rewards = layout.read(entry_for(small, 0)).rewards
    assert rewards is not None
    assert torch.equal(rewards, torch.tensor([[1280.0, 1344.0], [1408.0, 1472.0]]))


@pytest.mark.parametrize("cls", LAYOUTS)
@pytest.mark.parametrize("mwid", ["../../etc/x", "a/b", "x\x00y", "..\\up"])
def test_unsafe_model_weights_id_is_refused_before_writing(
    tmp_path: Path, cls: type[FileLayout], mwid: str
) -> None:
    root = tmp_path / "store"
    layout = cls(Location.from_url(root))
    trajectory = make_trajectory(mwid=mwid)
    with pytest.raises(UnsafePathError, match="unsafe name"):
        layout.write(entry_for(trajectory, 0), trajectory)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == []
    with pytest.raises(UnsafePathError):
        layout.read(entry_for(trajectory, 0))


@pytest.mark.parametrize("cls", LAYOUTS)
def test_invalid_trajectory_is_refused_before_writing(
    tmp_path: Path, cls: type[FileLayout]
) -> None:
    bad = Trajectory(rewards=torch.zeros(4, 2), curr_obs={"image": torch.zeros(3, 2)})
    entry = {"trajectory_id": 0, "model_weights_id": "w"}
    with pytest.raises(InvalidTrajectoryError, match=r"field 'curr_obs/image'.*\(3, 2\)"):
        cls(Location.from_url(tmp_path)).write(entry, bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cls", LAYOUTS)
def test_list_ids_parses_names_and_ignores_others(tmp_path: Path, cls: type[FileLayout]) -> None:
    ext = cls.suffix
    other = "pkl" if ext == "pt" else "pt"
    for name in [
        f"trajectory_10_a_b.{ext}",
        f"trajectory_2_.{ext}",
        f"trajectory_2_again.{ext}",
        f"trajectory_x_w.{ext}",
        f"trajectory_3_w.{other}",
        f"trajectory_4_w.{ext}.tmp-0123abcd",
        "metadata.json",
        "trajectory_index.json",
    ]:
        (tmp_path / name).write_bytes(b"")
    assert cls(Location.from_url(tmp_path)).list_ids() == [2, 10]
    assert cls(Location.from_url(tmp_path / "missing")).list_ids() == []


@pytest.mark.parametrize("cls", LAYOUTS)
def test_missing_file_raises_checkpoint_not_found(tmp_path: Path, cls: type[FileLayout]) -> None:
    layout = cls(Location.from_url(tmp_path))
    entry = entry_for(make_trajectory(), 7)
    with pytest.raises(CheckpointNotFoundError, match=rf"trajectory_7_w0\.{cls.suffix} not found"):
        layout.read(entry)
    layout.delete(entry)  # missing is not an error


def _write_raw(path: Path, cls: type[FileLayout], obj: object) -> None:
    if cls is PtLayout:
        torch.save(obj, path)
    else:
        path.write_bytes(pickle.dumps(obj))


@pytest.mark.parametrize("cls", LAYOUTS)
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([torch.zeros(2, 2)], "expected a dict of trajectory fields, got list"),
        ({"rewards": [1, 2]}, "field 'rewards': expected a torch.Tensor, got list"),
        ({"rewards": torch.zeros(2, 2), "bonus": torch.ones(2, 2)}, "unknown trajectory fields"),
        ({"rewards": torch.zeros(2, 2), "max_episode_length": "7"}, "int max_episode_length"),
    ],
)
def test_bad_contents_raise_corrupt_store_error(
    tmp_path: Path, cls: type[FileLayout], content: object, message: str
) -> None:
    _write_raw(tmp_path / f"trajectory_0_w0.{cls.suffix}", cls, content)
    with pytest.raises(CorruptStoreError, match=message) as info:
        cls(Location.from_url(tmp_path)).read(entry_for(make_trajectory(), 0))
    assert f"trajectory_0_w0.{cls.suffix}" in str(info.value)


@pytest.mark.parametrize("cls", LAYOUTS)
def test_truncated_file_raises_corrupt_store_error(tmp_path: Path, cls: type[FileLayout]) -> None:
    layout = cls(Location.from_url(tmp_path))
    want = make_trajectory()
    layout.write(entry_for(want, 0), want)
    path = tmp_path / f"trajectory_0_w0.{cls.suffix}"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CorruptStoreError, match=re.escape(str(path))):
        layout.read(entry_for(want, 0))


def test_a_pt_needing_an_unknown_zip_version_is_corrupt(tmp_path: Path) -> None:
    """The fuzz suite's find: a flipped "version needed" byte in a record of the zip's
    central directory (zipfile raises ``NotImplementedError``)."""
    layout = PtLayout(Location.from_url(tmp_path))
    want = make_trajectory()
    layout.write(entry_for(want, 0), want)
    path = tmp_path / "trajectory_0_w0.pt"
    data = bytearray(path.read_bytes())
    record = data.index(b"PK\x01\x02")  # the central directory's first record
    data[record + 6] = 64  # needs zip version 6.4
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=rf"{re.escape(str(path))}: .*zip file version"):
        layout.read(entry_for(want, 0))
    assert path.read_bytes() == data


class _SystemCall:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


@pytest.mark.parametrize("cls", LAYOUTS)
def test_malicious_file_is_refused_without_running(tmp_path: Path, cls: type[FileLayout]) -> None:
    marker = tmp_path / "pwned"
    evil = {"rewards": torch.zeros(2, 2), "extra": _SystemCall(f"touch {marker}")}
    _write_raw(tmp_path / f"trajectory_0_w0.{cls.suffix}", cls, evil)
    with pytest.raises(UnsafePickleError, match=r"posix\.system|Unsupported global"):
        cls(Location.from_url(tmp_path)).read(entry_for(make_trajectory(), 0))
    assert not marker.exists()


def test_pkl_allow_unsafe_pickle_opts_into_plain_pickle(tmp_path: Path) -> None:
    record = {"rewards": torch.ones(2, 2), "curr_obs": {"p": torch.zeros(2, 2)}}
    buffer = io.BytesIO()
    pickle.dump(record, buffer)
    (tmp_path / "trajectory_0_w.pkl").write_bytes(buffer.getvalue())
    layout = PklLayout(Location.from_url(tmp_path), allow_unsafe_pickle=True)
    entry = {"trajectory_id": 0, "model_weights_id": "w", "max_episode_length": 3}
    got = layout.read(entry)
    assert got.max_episode_length == 3 and got.model_weights_id == "w"
    assert torch.equal(got.curr_obs["p"], torch.zeros(2, 2))


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_reads_an_rlinf_written_directory(tmp_path: Path, fmt: str) -> None:
    """A directory as RLinf writes it: plain torch.save / pickle.dump and json.dump."""
    trajectories = [make_trajectory(T=4, B=2, E=1, mwid=f"weights-{i}") for i in range(3)]
    index: dict[str, Any] = {}
    for tid, trajectory in enumerate(trajectories):
        save_as_rlinf(trajectory, tmp_path, tid, fmt, next_obs={})  # RLinf saves empty dicts too
        index[str(tid)] = {
            "num_samples": 8,
            "trajectory_id": tid,
            "max_episode_length": trajectory.max_episode_length,
            "shape": [4, 2, 2],
            "model_weights_id": trajectory.model_weights_id,
            "uuid": f"u{tid}",
        }
    metadata = {
        "trajectory_format": fmt,
        "size": 3,
        "total_samples": 24,
        "trajectory_counter": 3,
        "seed": 1234,
    }
    with open(tmp_path / "metadata.json", "w") as handle:
        json.dump(metadata, handle)
    with open(tmp_path / "trajectory_index.json", "w") as handle:
        json.dump({"trajectory_index": index, "trajectory_id_list": [0, 1, 2]}, handle)

    layout = layout_class(fmt)(Location.from_url(tmp_path))
    documents = StoreIndex.assumed(layout.location).read()
    assert documents.metadata == metadata
    assert layout.list_ids() == [0, 1, 2]
    for tid in documents.trajectory_index["trajectory_id_list"]:
        got = layout.read(documents.trajectory_index["trajectory_index"][str(tid)])
        want = trajectories[tid]
        want.next_obs = {}
        assert_same_trajectory(got, want)


@pytest.mark.parametrize("cls", LAYOUTS)
def test_written_files_load_the_way_rlinf_loads_them(tmp_path: Path, cls: type[FileLayout]) -> None:
    """RLinf reads a file with plain torch.load / pickle.load and sets every key."""
    want = make_trajectory()
    want.next_obs = {}
    cls(Location.from_url(tmp_path)).write(entry_for(want, 0), want)
    path = tmp_path / f"trajectory_0_w0.{cls.suffix}"
    if cls is PtLayout:
        record = torch.load(path, map_location="cpu", weights_only=False)
    else:
        with open(path, "rb") as handle:
            record = pickle.load(handle)
    assert list(record) == [
        name for name in want.__dataclass_fields__ if getattr(want, name) is not None
    ]
    assert record["next_obs"] == {}
    rebuilt = Trajectory(max_episode_length=record["max_episode_length"])
    for name, value in record.items():
        setattr(rebuilt, name, value)
    assert_same_trajectory(rebuilt, want)


def test_formats_are_registered() -> None:
    assert layout_class("pt") is PtLayout
    assert layout_class("pkl") is PklLayout
    assert (PtLayout.format, PklLayout.format) == ("pt", "pkl")
    # Files are read whole: rows come from the decoded trajectory (the ABC's read_rows).
    assert PtLayout.read_rows is PklLayout.read_rows is TrajectoryLayout.read_rows


@pytest.mark.parametrize("layout_type", LAYOUTS)
def test_durable_writes_sync_the_file_before_renaming_it(
    tmp_path: Path, sync_events: list[tuple[str, str]], layout_type: type[FileLayout]
) -> None:
    """On a durable location a trajectory file's bytes are synced before the rename that
    makes it appear, and its directory after (and a directory made for it, in its parent);
    a plain location syncs nothing."""
    events = sync_events
    traj = make_trajectory()
    entry = entry_for(traj, 3)
    for durable in (False, True):
        events.clear()
        root = tmp_path / str(durable)
        layout = layout_type(Location.from_url(root).with_durable(durable))
        layout.write(entry, traj)
        path = str(root / layout.file_name(entry))
        assert_same_trajectory(layout.read(entry), traj)
        if not durable:
            assert events == [("replace", path)]
            continue
        assert [kind for kind, _ in events] == ["fsync", "fsync", "replace", "fsync"]
        assert events[0] == ("fsync", str(tmp_path))  # the store's folder was made: its name
        assert events[1][1].startswith(f"{path}.tmp-")  # the bytes, before they appear
        assert events[2:] == [("replace", path), ("fsync", str(root))]  # then the new name
