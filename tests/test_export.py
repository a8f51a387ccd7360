"""export_store: any layout to any other, whole or a subset, ids and uuids kept."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr.analysis.export import export_store
from rbzarr.errors import StoreExistsError
from rbzarr.storage.index.format_records import write_documents
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class, open_store
from rbzarr.trajectory.model import TENSOR_FIELDS, Trajectory, validate

DTYPES = [torch.bool, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.float32]


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype in (torch.int64, torch.uint8):
        high = 256 if dtype == torch.uint8 else 2**40
        return torch.randint(0, high, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype)


def make_trajectory(seed: int, T: int = 4, B: int = 2, E: int = 2) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    return Trajectory(
        max_episode_length=seed % 50,
        model_weights_id=f"mw{seed % 3}",
        actions=_tensor((T, B, 3), torch.bfloat16, g),
        rewards=_tensor((T, B), torch.float16, g),
        dones=_tensor((T + E, B), torch.bool, g),
        prev_logprobs=_tensor((T, B, 3), torch.float32, g),
        versions=_tensor((T, B), torch.int64, g),
        curr_obs={"image": _tensor((T, B, 2, 2), torch.uint8, g)},
        forward_inputs={"tokens": _tensor((T, B, 4), torch.int64, g)},
    )


def make_store(
    url: str | Path, fmt: str, trajectories: list[Trajectory], **metadata: Any
) -> TrajectoryIndex:
    """Write a committed store the way the buffer does: data first, documents last."""
    layout = layout_class(fmt)(Location.from_url(url))
    index = TrajectoryIndex()
    for trajectory in trajectories:
        spec = validate(trajectory)
        entry = index.new_entry(
            spec.shape, trajectory.max_episode_length, trajectory.model_weights_id
        )
        layout.write(entry, trajectory)
    write_documents(layout, index.to_documents(fmt, extra={"seed": 7, **metadata}))
    return index


def read_all(url: str | Path) -> tuple[dict[str, Any], dict[str, Any], dict[int, Trajectory]]:
    layout, documents = open_store(url)
    index = documents.trajectory_index
    data = {i: layout.read(index["trajectory_index"][str(i)]) for i in index["trajectory_id_list"]}
    return documents.metadata, index, data


@pytest.mark.parametrize(
    ("source_fmt", "target_fmt"),
    [("pt", "pkl"), ("pkl", "pt"), ("pt", "zarr"), ("zarr", "pkl"), ("zarr", "zarr")],
)
def test_export_whole_store(tmp_path: Path, source_fmt: str, target_fmt: str) -> None:
    trajectories = [make_trajectory(seed) for seed in range(3)]
    index = make_store(tmp_path / "src", source_fmt, trajectories, note="kept")
    documents = export_store(tmp_path / "src", tmp_path / "dst", target_fmt)

    metadata, got_index, data = read_all(tmp_path / "dst")
    assert metadata == documents.metadata
    assert got_index == documents.trajectory_index
    assert metadata["trajectory_format"] == target_fmt
    assert (metadata["size"], metadata["total_samples"], metadata["trajectory_counter"]) == (
        3,
        24,
        3,
    )
    assert (metadata["seed"], metadata["note"]) == (7, "kept")
    assert got_index["trajectory_id_list"] == [0, 1, 2]
    assert got_index["trajectory_index"] == {str(i): index.entries[i] for i in range(3)}
    for i, trajectory in enumerate(trajectories):
        assert_same_trajectory(data[i], trajectory)
    assert layout_class(target_fmt)(Location.from_url(tmp_path / "dst")).list_ids() == [0, 1, 2]


@pytest.mark.parametrize(
    ("selection", "expected"),
    [({"ids": [3, 1]}, [1, 3]), ({"last": 2}, [3, 4]), ({"last": 0}, []), ({"ids": []}, [])],
)
def test_export_subset_recounts_and_keeps_counter(
    tmp_path: Path, selection: dict[str, Any], expected: list[int]
) -> None:
    trajectories = [make_trajectory(seed, T=2 + seed % 2 * 2) for seed in range(5)]
    index = make_store(tmp_path / "src", "pt", trajectories)
    export_store(tmp_path / "src", tmp_path / "dst", "pkl", **selection)

    metadata, got_index, data = read_all(tmp_path / "dst")
    assert got_index["trajectory_id_list"] == expected
    assert sorted(data) == expected
    assert metadata["size"] == len(expected)
    assert metadata["total_samples"] == sum(index.entries[i]["num_samples"] for i in expected)
    assert metadata["trajectory_counter"] == 5
    for i in expected:
        assert got_index["trajectory_index"][str(i)]["uuid"] == index.entries[i]["uuid"]
        assert_same_trajectory(data[i], trajectories[i])


def test_unknown_ids_are_refused_before_writing(tmp_path: Path) -> None:
    make_store(tmp_path / "src", "pt", [make_trajectory(0)])
    with pytest.raises(ValueError, match=r"ids \[5, 9\] are not in the store"):
        export_store(tmp_path / "src", tmp_path / "dst", "pkl", ids=[0, 9, 5])
    assert not (tmp_path / "dst").exists()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    make_store(tmp_path / "src", "pt", [make_trajectory(0)])
    with pytest.raises(ValueError, match="either ids or last"):
        export_store(tmp_path / "src", tmp_path / "dst", "pkl", ids=[0], last=1)
    with pytest.raises(ValueError, match="last must be >= 0, got -1"):
        export_store(tmp_path / "src", tmp_path / "dst", "pkl", last=-1)
    with pytest.raises(ValueError, match="unknown trajectory_format 'hdf5'"):
        export_store(tmp_path / "src", tmp_path / "dst", "hdf5")
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("existing", ["metadata.json", "trajectory_0_x.pkl"])
def test_existing_destination_is_refused(tmp_path: Path, existing: str) -> None:
    make_store(tmp_path / "src", "pt", [make_trajectory(0)])
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / existing).write_bytes(b"{}")
    with pytest.raises(StoreExistsError, match="already holds a store"):
        export_store(tmp_path / "src", tmp_path / "dst", "pkl")
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == [existing]
    with pytest.raises(StoreExistsError):
        export_store(tmp_path / "src", tmp_path / "src", "pt")


def test_rlinf_store_without_format_key_is_read_as_pt(tmp_path: Path) -> None:
    trajectory = make_trajectory(1)
    make_store(tmp_path / "src", "pt", [trajectory])
    metadata_path = tmp_path / "src" / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    del metadata["trajectory_format"], metadata["rbzarr_format_version"]
    metadata_path.write_text(json.dumps(metadata))

    export_store(tmp_path / "src", tmp_path / "dst", "zarr", progress=True)
    got_metadata, _, data = read_all(tmp_path / "dst")
    assert got_metadata["trajectory_format"] == "zarr"
    assert_same_trajectory(data[0], trajectory)


def test_export_between_local_and_memory(tmp_path: Path, memory_url: str) -> None:
    trajectories = [make_trajectory(seed) for seed in range(2)]
    make_store(tmp_path / "src", "pkl", trajectories)
    export_store(tmp_path / "src", memory_url, "pt")
    export_store(memory_url, tmp_path / "back", "pkl")
    _, index, data = read_all(tmp_path / "back")
    assert index == read_all(tmp_path / "src")[1]
    for i, trajectory in enumerate(trajectories):
        assert_same_trajectory(data[i], trajectory)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    T = draw(st.integers(1, 4))
    B = draw(st.integers(1, 3))
    E = draw(st.sampled_from([0] + [e for e in range(1, T + 1) if T % e == 0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    present = draw(st.sets(st.sampled_from(TENSOR_FIELDS)))
    fields: dict[str, Any] = {}
    for name in sorted(present | {"rewards"}, key=TENSOR_FIELDS.index):
        rows = T + E if name in ("dones", "terminations", "truncations") else T
        trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        fields[name] = _tensor((rows, B, *trailing), draw(st.sampled_from(DTYPES)), g)
    keys = draw(st.lists(st.sampled_from(["image", "state", "proprio"]), max_size=2, unique=True))
    obs = {k: _tensor((T, B, 2), draw(st.sampled_from(DTYPES)), g) for k in keys}
    return Trajectory(
        max_episode_length=draw(st.integers(0, 1000)),
        model_weights_id=draw(st.text("abc-_.0189", max_size=8)),
        curr_obs=obs,
        next_obs={k: v.clone() for k, v in obs.items()},
        **fields,
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(trajectories(), min_size=1, max_size=3))
def test_round_trip_across_layouts(batch: list[Trajectory]) -> None:
    """pt -> pkl -> zarr -> pt keeps data, ids and uuids."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        index = make_store(root / "0", "pt", batch)
        for step, fmt in enumerate(["pkl", "zarr", "pt"], start=1):
            export_store(root / str(step - 1), root / str(step), fmt)
        metadata, got_index, data = read_all(root / "3")
        assert metadata["trajectory_format"] == "pt"
        assert got_index["trajectory_id_list"] == index.id_list
        assert [got_index["trajectory_index"][str(i)]["uuid"] for i in index.id_list] == [
            index.entries[i]["uuid"] for i in index.id_list
        ]
        for i, trajectory in zip(index.id_list, batch, strict=True):
            assert_same_trajectory(data[i], trajectory)
