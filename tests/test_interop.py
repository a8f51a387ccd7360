"""LeRobot v3.0 and robomimic HDF5 in and out of stores (rbzarr.interop), from Python and the CLI.

Fixtures are real datasets written with pyarrow, PyAV and h5py the way LeRobot and robomimic
write them (tests/dataset_fixtures.py): 2-3 episodes sharing one parquet file and one mp4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import av
import fsspec
import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from conftest import make_trajectory
from dataset_fixtures import LeRobotSpec, write_lerobot, write_robomimic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbzarr import TrajectoryReplayBuffer
from rbzarr.cli import main
from rbzarr.errors import (
    DatasetFileNotFoundError,
    DatasetMismatchError,
    InvalidCodecError,
    StoreExistsError,
    UnsupportedDatasetError,
)
from rbzarr.interop import export_dataset, import_dataset, seed_buffer
from rbzarr.interop.episodes import write_episodes
from rbzarr.storage.registry import open_store

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:av")


def decoded(path) -> np.ndarray:
    """Every frame of an mp4 as PyAV decodes it, ``[n, H, W, 3]``."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def dataset_names(group) -> set[str]:
    """Paths of every dataset below an HDF5 group."""
    names: set[str] = set()
    group.visititems(lambda name, item: names.add(name) if isinstance(item, h5py.Dataset) else None)
    return names


def stored(store) -> list:
    """The trajectories of a store, in its order."""
    layout, documents = open_store(store)
    ids = documents.trajectory_index["trajectory_id_list"]
    entries = documents.trajectory_index["trajectory_index"]
    return [layout.read(entries[str(i)]) for i in ids]


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "dataset"
    return root, write_lerobot(root)


def copy_of(lerobot, tmp_path):
    root, spec = lerobot
    shutil.copytree(root, tmp_path / "source")
    return tmp_path / "source", spec


def test_lerobot_import_maps_every_field(lerobot, tmp_path):
    root, spec = lerobot
    documents = import_dataset(root, tmp_path / "store", "lerobot")
    assert (documents.metadata["size"], documents.metadata["total_samples"]) == (3, 16)
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    state = np.stack(data.column("observation.state").to_numpy(zero_copy_only=False))
    frames = decoded(root / "videos/observation.images.top/chunk-000/file-000.mp4")
    start = 0
    for trajectory, length in zip(stored(tmp_path / "store"), spec.lengths, strict=True):
        rows = slice(start, start + length)
        assert trajectory.curr_obs["state"].shape == (length, 1, 6)
        assert np.array_equal(trajectory.curr_obs["state"][:, 0].numpy(), state[rows])
        assert np.array_equal(trajectory.next_obs["state"][:-1, 0].numpy(), state[rows][1:])
        assert np.array_equal(trajectory.next_obs["state"][-1, 0].numpy(), state[rows][-1])
        image = trajectory.curr_obs["images.top"]
        assert (image.dtype, tuple(image.shape)) == (torch.uint8, (length, 1, 32, 32, 3))
        assert np.array_equal(image[:, 0].numpy(), frames[rows])  # exactly PyAV's decode
        assert trajectory.actions.shape == (length, 1, 4)
        assert np.array_equal(
            trajectory.rewards[:, 0].numpy(), data.column("next.reward").to_numpy()[rows]
        )
        assert trajectory.dones[:, 0].tolist() == [False] * (length - 1) + [True]
        start += length
    recorded = documents.metadata["source_dataset"]
    assert recorded["tasks"] == ["pick the cube", "place the cube"]
    assert [e["tasks"] for e in recorded["episodes"]] == [
        ["pick the cube"],
        ["place the cube"],
        ["pick the cube"],
    ]
    assert (recorded["fps"], recorded["robot_type"], recorded["synthesized"]) == (10, "so100", [])


def test_episodes_spread_over_two_data_and_video_files_import(tmp_path):
    write_lerobot(tmp_path / "split", LeRobotSpec(lengths=(4, 3, 5, 2), second_file_from=2))
    assert (tmp_path / "split/videos/observation.images.top/chunk-000/file-001.mp4").exists()
    import_dataset(tmp_path / "split", tmp_path / "store", "lerobot")
    whole = tmp_path / "whole"
    write_lerobot(whole, LeRobotSpec(lengths=(4, 3, 5, 2)))
    import_dataset(whole, tmp_path / "one_file", "lerobot")
    split, single = stored(tmp_path / "store"), stored(tmp_path / "one_file")
    assert [t.actions.shape[0] for t in split] == [4, 3, 5, 2]
    for one, two in zip(split, single, strict=True):
        first, second = one.tensors(), two.tensors()
        for key in first:
            if "images" not in key:  # the two files encode the frames apart: other losses
                assert torch.equal(first[key], second[key]), key
    decoded_second = decoded(
        tmp_path / "split/videos/observation.images.top/chunk-000/file-001.mp4"
    )
    assert np.array_equal(split[2].curr_obs["images.top"][:, 0].numpy(), decoded_second[:5])
    assert np.array_equal(split[3].curr_obs["images.top"][:, 0].numpy(), decoded_second[5:])


def test_task_index_and_timestamps_are_kept(lerobot, tmp_path):
    root, _ = lerobot
    import_dataset(root, tmp_path / "store", "lerobot")
    trajectories = stored(tmp_path / "store")
    assert [t.forward_inputs["task_index"][0, 0].item() for t in trajectories] == [0, 1, 0]
    assert trajectories[1].forward_inputs["timestamp"][:, 0].tolist() == pytest.approx(
        [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    )


def test_lerobot_round_trip_is_bit_exact_outside_the_video(lerobot, tmp_path):
    root, spec = lerobot
    import_dataset(root, tmp_path / "store", "lerobot")
    assert export_dataset(tmp_path / "store", tmp_path / "out", "lerobot").episodes == 3
    source = pq.read_table(root / "data/chunk-000/file-000.parquet")
    written = pq.read_table(tmp_path / "out/data/chunk-000/file-000.parquet")
    assert sorted(written.column_names) == sorted(source.column_names)
    for name in source.column_names:
        assert written.column(name).to_pylist() == source.column(name).to_pylist(), name
    assert pq.ParquetFile(tmp_path / "out/data/chunk-000/file-000.parquet").num_row_groups == 3
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    source_info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["fps"]) == (3, 16, 10)
    assert info["features"].keys() == source_info["features"].keys()
    assert info["features"]["observation.images.top"]["info"]["video.codec"] == "av1"
    episodes = pq.read_table(tmp_path / "out/meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("length").to_pylist() == [5, 7, 4]
    assert episodes.column("dataset_from_index").to_pylist() == [0, 5, 12]
    assert episodes.column("videos/observation.images.top/from_timestamp").to_pylist() == [
        0.0,
        0.5,
        1.2,
    ]
    pandas = pytest.importorskip("pandas")
    tasks = pandas.read_parquet(tmp_path / "out/meta/tasks.parquet")
    assert tasks.index.name == "task"
    assert tasks.loc["place the cube"].task_index == 1
    # The re-encoded frames differ from the imported ones by less than one encode of the
    # original frames differs from them (the codec's own round-trip error).
    first = decoded(root / "videos/observation.images.top/chunk-000/file-000.mp4").astype(int)
    again = decoded(tmp_path / "out/videos/observation.images.top/chunk-000/file-000.mp4")
    original = spec.frames["observation.images.top"].astype(int)
    assert again.shape == first.shape
    assert np.abs(again - first).mean() <= np.abs(first - original).mean() + 0.5


def test_the_exported_dataset_imports_to_the_same_store(lerobot, tmp_path):
    root, _ = lerobot
    import_dataset(root, tmp_path / "a", "lerobot")
    export_dataset(tmp_path / "a", tmp_path / "out", "lerobot", codec="libx264")
    import_dataset(tmp_path / "out", tmp_path / "b", "lerobot")
    for one, two in zip(stored(tmp_path / "a"), stored(tmp_path / "b"), strict=True):
        first, second = one.tensors(), two.tensors()
        assert first.keys() == second.keys()
        for key in first:
            if "images" not in key:
                assert torch.equal(first[key], second[key]), key


def test_a_dataset_without_rewards_gets_zero_rewards_that_export_leaves_out(tmp_path):
    root = tmp_path / "dataset"
    write_lerobot(root, LeRobotSpec(lengths=(3, 2), with_reward=False, cameras=()))
    documents = import_dataset(root, tmp_path / "store", "lerobot")
    assert documents.metadata["source_dataset"]["synthesized"] == ["rewards"]
    trajectories = stored(tmp_path / "store")
    assert [t.rewards[:, 0].tolist() for t in trajectories] == [[0.0] * 3, [0.0] * 2]
    assert trajectories[0].terminations is None
    export_dataset(tmp_path / "store", tmp_path / "out", "lerobot")
    columns = pq.read_table(tmp_path / "out/data/chunk-000/file-000.parquet").column_names
    assert "next.reward" not in columns
    assert "next.done" not in columns


def test_a_buffer_store_exports_one_episode_per_env_column(tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "store")
    trajectory = make_trajectory(4, 2, base=0)
    # Each column's episode ends at its last step (the reset row leads).
    trajectory.dones = torch.tensor([-1, 0, 0, 0, 1] * 2).reshape(2, 5, 1).transpose(0, 1)
    trajectory.curr_obs["image"] = (
        torch.arange(4 * 2 * 16 * 16 * 3, dtype=torch.int64)
        .reshape(4, 2, 16, 16, 3)
        .remainder(251)
        .to(torch.uint8)
    )
    buffer.add_trajectories([trajectory])
    buffer.close()
    written = export_dataset(tmp_path / "store", tmp_path / "out", "lerobot", fps=5, task="push")
    assert (written.episodes, written.left_out) == (2, 0)
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["features"]["observation.image"]["dtype"] == "video"
    assert info["features"]["observation.state"] == {
        "dtype": "float64",
        "shape": [3],
        "names": None,
    }
    data = pq.read_table(tmp_path / "out/data/chunk-000/file-000.parquet")
    assert data.column("episode_index").to_pylist() == [0] * 4 + [1] * 4
    # dones lose their reset row; column 1 of the trajectory is episode 1; [T, 1] rows
    # are scalar columns, as LeRobot writes its shape [1] features.
    assert data.column("next.done").to_pylist() == [0, 0, 0, 1] * 2
    assert info["features"]["next.reward"]["shape"] == [1]
    assert data.column("timestamp").to_pylist() == pytest.approx([0, 0.2, 0.4, 0.6] * 2)
    assert len(decoded(tmp_path / "out/videos/observation.image/chunk-000/file-000.mp4")) == 8


def test_a_dataset_at_an_fsspec_url_imports(lerobot, tmp_path):
    root, _ = lerobot
    memory = fsspec.filesystem("memory")
    memory.put(str(root), "/lerobot-source", recursive=True)
    try:
        import_dataset("memory://lerobot-source", tmp_path / "store", "lerobot")
        import_dataset(root, tmp_path / "local", "lerobot")
        for one, two in zip(stored(tmp_path / "store"), stored(tmp_path / "local"), strict=True):
            assert one == two
    finally:
        memory.rm("/lerobot-source", recursive=True)


def test_robomimic_round_trip_is_bit_exact(tmp_path):
    arrays = write_robomimic(tmp_path / "demos.hdf5")
    documents = import_dataset(tmp_path / "demos.hdf5", tmp_path / "store", "robomimic")
    assert documents.metadata["size"] == 3
    first = stored(tmp_path / "store")[0]
    assert first.curr_obs["agentview_image"].shape == (6, 1, 8, 8, 3)
    assert torch.equal(
        first.forward_inputs["states"][:, 0], torch.from_numpy(arrays["demo_0"]["states"])
    )
    assert first.dones.dtype == torch.int64
    assert export_dataset(tmp_path / "store", tmp_path / "out.hdf5", "hdf5").episodes == 3
    with h5py.File(tmp_path / "demos.hdf5") as source, h5py.File(tmp_path / "out.hdf5") as out:
        assert out["data"].attrs["env_args"] == source["data"].attrs["env_args"]
        assert out["data"].attrs["total"] == 14
        assert list(out["mask/train"][()]) == [b"demo_0", b"demo_1"]
        for demo, fields in arrays.items():
            assert out[f"data/{demo}"].attrs["num_samples"] == len(fields["actions"])
            assert dataset_names(out[f"data/{demo}"]) == set(fields)
            for name, value in fields.items():
                written = out[f"data/{demo}/{name}"][()]
                assert written.dtype == value.dtype
                assert np.array_equal(written, value), (demo, name)


def test_robomimic_without_next_obs_gets_shifted_observations_export_leaves_out(tmp_path):
    write_robomimic(tmp_path / "demos.hdf5", lengths=(3,), next_obs=False)
    import_dataset(tmp_path / "demos.hdf5", tmp_path / "store", "robomimic")
    (trajectory,) = stored(tmp_path / "store")
    state = trajectory.curr_obs["robot0_eef_pos"][:, 0]
    assert torch.equal(trajectory.next_obs["robot0_eef_pos"][:, 0], state[[1, 2, 2]])
    export_dataset(tmp_path / "store", tmp_path / "out.hdf5", "hdf5")
    with h5py.File(tmp_path / "out.hdf5") as out:
        assert "next_obs" not in out["data/demo_0"]


def test_cli_import_and_export(lerobot, tmp_path):
    root, _ = lerobot
    runner = CliRunner()
    result = runner.invoke(
        main, ["import", str(root), str(tmp_path / "store"), "--from", "lerobot"]
    )
    assert result.exit_code == 0, result.output
    assert result.output == f"imported 3 episodes (16 frames) into {tmp_path / 'store'}\n"
    result = runner.invoke(
        main, ["export", str(tmp_path / "store"), str(tmp_path / "out.hdf5"), "--format", "hdf5"]
    )
    assert (result.exit_code, result.output) == (
        0,
        f"exported 3 episodes to {tmp_path / 'out.hdf5'}\n",
    )
    result = runner.invoke(
        main, ["import", str(tmp_path / "out.hdf5"), str(tmp_path / "again"), "--from", "robomimic"]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        main,
        [
            "export",
            str(tmp_path / "again"),
            str(tmp_path / "lr"),
            "--format",
            "lerobot",
            "--codec",
            "mpeg4",
        ],
    )
    assert (result.exit_code, result.output) == (0, f"exported 3 episodes to {tmp_path / 'lr'}\n")
    result = runner.invoke(
        main,
        ["export", str(tmp_path / "store"), str(tmp_path / "x"), "--format", "hdf5", "--last", "1"],
    )
    assert result.exit_code == 2
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def thousand_demos(tmp_path_factory):
    """A pt store of 1,000 one-step trajectories: h5py reads back its file past a few hundred."""
    root = tmp_path_factory.mktemp("thousand") / "store"
    buffer = TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=str(root), trajectory_format="pt"
    )
    demos = []
    for i in range(1000):
        demo = make_trajectory(1, 1, i)
        demo.dones = torch.ones_like(demo.dones)  # each one a complete episode
        demos.append(demo)
    buffer.add_trajectories(demos)
    buffer.close()
    return root


def test_cli_exports_a_thousand_demos_to_hdf5(thousand_demos, tmp_path):
    out = tmp_path / "out.hdf5"
    result = CliRunner().invoke(main, ["export", str(thousand_demos), str(out), "--format", "hdf5"])
    assert (result.exit_code, result.output) == (0, f"exported 1000 episodes to {out}\n")
    with h5py.File(out) as written:
        assert len(written["data"]) == 1000
        assert written["data/demo_999/actions"][()].tolist() == [[999, 999]]


def test_hdf5_export_to_a_remote_filesystem_uploads_the_finished_file(thousand_demos, memory_url):
    assert export_dataset(thousand_demos, f"{memory_url}/out.hdf5", "hdf5").episodes == 1000
    with fsspec.open(f"{memory_url}/out.hdf5", "rb") as handle, h5py.File(handle) as written:
        assert written["data"].attrs["total"] == 1000


def test_seed_buffer_fills_a_demo_buffer_that_then_grows(lerobot, tmp_path):
    root, _ = lerobot
    demo_buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    seed_buffer(demo_buffer, root, "lerobot", tmp_path / "demos")
    assert (len(demo_buffer), demo_buffer.total_samples) == (3, 16)
    batch = demo_buffer.sample(8)
    assert batch["curr_obs"]["images.top"].shape == (8, 32, 32, 3)
    assert batch["actions"].shape == (8, 4)
    # A second run loads the store it imported the first time.
    again = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    seed_buffer(again, root, "lerobot", tmp_path / "demos")
    assert len(again) == 3
    # On disk: the buffer's own store is the imported one, read in place, grown online.
    on_disk = TrajectoryReplayBuffer(
        seed=0,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=tmp_path / "demos",
        cache_size=1,
    )
    seed_buffer(on_disk, root, "lerobot", tmp_path / "demos")
    assert on_disk.sample(4)["curr_obs"]["state"].shape == (4, 6)
    online = stored(tmp_path / "demos")[0]
    on_disk.add_trajectories([online])
    on_disk.close()
    assert len(stored(tmp_path / "demos")) == 4
    other = tmp_path / "other"
    write_robomimic(other.with_suffix(".hdf5"))
    with pytest.raises(StoreExistsError, match="imported from"):
        seed_buffer(again, other.with_suffix(".hdf5"), "robomimic", tmp_path / "demos")


# -- bad input: a named error, and no store left behind ------------------------------------


def edit_json(path, change):
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def import_fails(source, tmp_path, error, match, source_format="lerobot"):
    with pytest.raises(error, match=match):
        import_dataset(source, tmp_path / "store", source_format)
    assert not (tmp_path / "store").exists()


def test_a_v2_dataset_names_its_version_and_the_converter(lerobot, tmp_path):
    source, _ = copy_of(lerobot, tmp_path)
    edit_json(source / "meta/info.json", lambda info: info.update(codebase_version="v2.1"))
    import_fails(source, tmp_path, UnsupportedDatasetError, r"v2\.1.*convert_dataset_v21_to_v30")


def test_a_missing_video_or_parquet_file_is_named(lerobot, tmp_path):
    source, _ = copy_of(lerobot, tmp_path)
    video = source / "videos/observation.images.top/chunk-000/file-000.mp4"
    video.unlink()
    import_fails(source, tmp_path, DatasetFileNotFoundError, "file-000.mp4 is missing")
    shutil.rmtree(source / "videos")
    (source / "data/chunk-000/file-000.parquet").unlink()
    edit_json(
        source / "meta/info.json", lambda info: info["features"].pop("observation.images.top")
    )
    import_fails(source, tmp_path, DatasetFileNotFoundError, "data/chunk-000/file-000.parquet")


def test_lengths_that_disagree_are_refused(lerobot, tmp_path):
    source, _ = copy_of(lerobot, tmp_path)
    path = source / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    lengths = table.column("length").to_pylist()
    lengths[1] += 1
    to_index = table.column("dataset_to_index").to_pylist()
    pq.write_table(table.set_column(2, "length", [lengths]), path)
    import_fails(source, tmp_path, DatasetMismatchError, "episode 1: length 8")
    table = table.set_column(2, "length", [lengths])
    to_index[1] += 1
    pq.write_table(
        table.set_column(
            table.column_names.index("dataset_to_index"), "dataset_to_index", [to_index]
        ),
        path,
    )
    import_fails(
        source, tmp_path, DatasetMismatchError, "holds 16 rows, the episodes metadata says 17"
    )


def test_rows_of_the_wrong_episode_fail_midway_and_leave_nothing(lerobot, tmp_path):
    source, _ = copy_of(lerobot, tmp_path)
    path = source / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    episodes = table.column("episode_index").to_pylist()
    episodes[-1] = 1  # the last row claims to belong to episode 1
    pq.write_table(
        table.set_column(table.column_names.index("episode_index"), "episode_index", [episodes]),
        path,
    )
    import_fails(source, tmp_path, DatasetMismatchError, "episode 2 should have 4 rows")


def test_an_unknown_codec_is_refused(lerobot, tmp_path):
    source, _ = copy_of(lerobot, tmp_path)
    edit_json(
        source / "meta/info.json",
        lambda info: info["features"]["observation.images.top"]["info"].update(
            {"video.codec": "notacodec"}
        ),
    )
    import_fails(source, tmp_path, UnsupportedDatasetError, "codec 'notacodec'")


@pytest.mark.parametrize(
    ("codecs", "match"),
    [
        ({"curr_obs/images.tpo": "qoi"}, r"codecs name \['curr_obs/images.tpo'\]"),
        ({"curr_obs/state": "jpeg:90"}, r"'curr_obs/state': codec 'jpeg:90' takes image-like"),
    ],
)
def test_a_codec_for_no_key_or_one_that_cannot_encode_is_refused(lerobot, tmp_path, codecs, match):
    root, _ = lerobot
    with pytest.raises(InvalidCodecError, match=match):
        import_dataset(root, tmp_path / "store", "lerobot", codecs=codecs)
    assert not (tmp_path / "store").exists()


def test_an_hdf5_file_without_data_is_refused(tmp_path):
    with h5py.File(tmp_path / "other.hdf5", "w") as f:
        f.create_dataset("images", data=np.zeros(3))
    import_fails(
        tmp_path / "other.hdf5", tmp_path, UnsupportedDatasetError, "no 'data' group", "robomimic"
    )


def test_demo_lengths_that_disagree_with_num_samples_are_refused(tmp_path):
    write_robomimic(tmp_path / "demos.hdf5")
    with h5py.File(tmp_path / "demos.hdf5", "a") as f:
        f["data/demo_1"].attrs["num_samples"] = 4
    import_fails(
        tmp_path / "demos.hdf5", tmp_path, DatasetMismatchError, "num_samples says 4", "robomimic"
    )


def test_a_destination_holding_a_store_is_left_alone(lerobot, tmp_path):
    root, _ = lerobot
    import_dataset(root, tmp_path / "store", "lerobot")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store").rglob("*"))
    with pytest.raises(StoreExistsError, match="already holds a store"):
        import_dataset(root, tmp_path / "store", "lerobot")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "store").rglob("*")) == before
    (tmp_path / "out.hdf5").write_bytes(b"mine")
    with pytest.raises(StoreExistsError):
        export_dataset(tmp_path / "store", tmp_path / "out.hdf5", "hdf5")
    assert (tmp_path / "out.hdf5").read_bytes() == b"mine"


def test_the_datasets_benchmark_reads_its_targets_and_prints_a_table():
    from benchmarks import table  # noqa: PLC0415
    from benchmarks.datasets_roundtrip import datasets_targets  # noqa: PLC0415

    error = {"max_abs": 25.0, "mean_abs": 2.0, "psnr_db": 38.8}
    results = {
        "fidelity": {
            "codec": "libsvtav1",
            "store_lerobot_store_bit_exact": True,
            "lerobot_store_lerobot_bit_exact": True,
            "import_equals_pyav_decode": True,
            "codec_round_trip": error,
            "export_round_trip": {"max_abs": 8.0, "mean_abs": 1.0, "psnr_db": 44.5},
            "import_frames_s": 1200.0,
            "export_frames_s": 360.0,
        },
        "memory": {
            "episodes": 1000,
            "largest_episode_bytes": 10e6,
            "python_numpy_peak": 13e6,
            "arrow_peak": 1e6,
            "peak_vs_largest_episode": 1.4,
            "import_frames_s": 300.0,
            "import_episodes_s": 45.0,
        },
        "throughput": {
            "episodes": 1000,
            "frames": 6000,
            "formats": {
                "lerobot": {"export_frames_s": 900.0, "import_frames_s": 1000.0},
                "hdf5": {"export_frames_s": 2000.0, "import_frames_s": 1100.0},
                "minari": {"unavailable": "minari is not installed here"},
            },
            "lerobot_writer": {"frames_s": 150.0},
        },
        "torchrl_lerobot": {"unavailable": "not installed here: datasets"},
    }
    found = datasets_targets(results)
    assert [(t["value"], t["met"]) for t in found] == [
        (1.0, True),
        (1.0, True),
        (0.5, True),
        (1000.0, True),
        (1.4, True),
    ]
    results["memory"]["peak_vs_largest_episode"] = 2.5
    assert datasets_targets(results)[-1]["met"] is False
    document = {"benchmark": "datasets", "results": results, "targets": found, "notes": []}
    text = table(document)
    assert "14.00 MB = 2.50x the largest episode (10.00 MB)" in text
    assert "not installed here: datasets" in text
    assert "export 2,000, import 1,100 frames/s" in text
    assert "LeRobot's own writer, 1000 short numeric episodes" in text


_DTYPES = st.sampled_from(["float32", "float64", "int64", "uint8", "bool"])


@st.composite
def robomimic_demos(draw):
    """1-3 demos of 1-6 steps; each dataset with its own dtype and trailing shape."""
    names = ("actions", "rewards", "dones", "states", "obs/eef", "next_obs/eef")
    layout = {name: (draw(_DTYPES), draw(st.sampled_from([(), (2,), (2, 3)]))) for name in names}
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    return [
        {
            name: (rng.standard_normal((n, *shape)) * 50).astype(dtype)
            for name, (dtype, shape) in layout.items()
        }
        for n in lengths
    ]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(demos=robomimic_demos())
def test_any_robomimic_file_round_trips_bit_exact(tmp_path_factory, demos):
    folder = tmp_path_factory.mktemp("roundtrip")
    with h5py.File(folder / "in.hdf5", "w") as f:
        for i, fields in enumerate(demos):
            group = f.create_group(f"data/demo_{i}")
            group.attrs["num_samples"] = len(fields["actions"])
            for name, value in fields.items():
                group.create_dataset(name, data=value)
    import_dataset(folder / "in.hdf5", folder / "store", "robomimic")
    export_dataset(folder / "store", folder / "out.hdf5", "hdf5")
    with h5py.File(folder / "out.hdf5") as out:
        assert sorted(out["data"].keys()) == [f"demo_{i}" for i in range(len(demos))]
        for i, fields in enumerate(demos):
            assert dataset_names(out[f"data/demo_{i}"]) == set(fields)
            for name, value in fields.items():
                written = out[f"data/demo_{i}/{name}"][()]
                assert (written.dtype, written.shape) == (value.dtype, value.shape)
                assert np.array_equal(written, value)


def test_a_missing_extra_names_it(lerobot, tmp_path, monkeypatch):
    root, _ = lerobot
    monkeypatch.delitem(sys.modules, "rbzarr.interop.lerobot_read", raising=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(
        ImportError, match=r"install the datasets extra, pip install 'rbzarr\[datasets\]'"
    ):
        import_dataset(root, tmp_path / "store", "lerobot")
    assert not (tmp_path / "store").exists()


def test_export_leaves_a_running_episode_out_and_says_so(tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "store")
    trajectory = make_trajectory(4, 2, base=0)
    # Column 0 ends at its last step; column 1 is still running where the store ends.
    trajectory.dones = torch.tensor([[-1, -1], [0, 0], [0, 0], [0, 0], [1, 0]]).reshape(5, 2, 1)
    buffer.add_trajectories([trajectory])
    buffer.close()
    runner = CliRunner()
    out = tmp_path / "out.hdf5"
    result = runner.invoke(main, ["export", str(tmp_path / "store"), str(out), "--format", "hdf5"])
    assert (result.exit_code, result.output) == (
        0,
        f"exported 1 episodes to {out}; 1 incomplete episodes left out (--include-incomplete "
        "writes them)\n",
    )
    with h5py.File(out) as written:
        assert sorted(written["data"]) == ["demo_0"]
    every = tmp_path / "every.hdf5"
    result = runner.invoke(
        main,
        ["export", str(tmp_path / "store"), str(every), "--format", "hdf5", "--include-incomplete"],
    )
    assert (result.exit_code, result.output) == (0, f"exported 2 episodes to {every}\n")
    with h5py.File(every) as written:
        assert written["data/demo_1/dones"][()].ravel().tolist() == [0, 0, 0, 0]
    result = runner.invoke(
        main,
        [
            "export",
            str(tmp_path / "store"),
            str(tmp_path / "z"),
            "--format",
            "zarr",
            "--include-incomplete",
        ],
    )
    assert result.exit_code == 2
    assert not (tmp_path / "z").exists()


def test_an_hdf5_export_of_many_demos_and_to_an_fsspec_url(tmp_path):
    """HDF5 reads back its file as it grows (1,000 demos did, through a write-only handle)."""
    rng = np.random.default_rng(0)
    episodes = [
        {
            "curr_obs/state": rng.standard_normal((3, 2)),
            "actions": rng.standard_normal((3, 1)),
            "rewards": rng.standard_normal(3),
        }
        for _ in range(1000)
    ]
    write_episodes(iter(episodes), tmp_path / "store", {"format": "synthetic"})
    assert export_dataset(tmp_path / "store", tmp_path / "out.hdf5", "hdf5").episodes == 1000
    memory = fsspec.filesystem("memory")
    try:
        export_dataset(tmp_path / "store", "memory://exports/out.hdf5", "hdf5")
        memory.get("/exports/out.hdf5", str(tmp_path / "fetched.hdf5"))
    finally:
        memory.rm("/exports", recursive=True)
    for path in (tmp_path / "out.hdf5", tmp_path / "fetched.hdf5"):
        with h5py.File(path) as written:
            assert len(written["data"]) == 1000
            assert np.array_equal(
                written["data/demo_999/obs/state"][()], episodes[999]["curr_obs/state"]
            )


@pytest.mark.parametrize("verbose", [False, True])
def test_a_lerobot_export_keeps_the_encoders_log_for_verbose(lerobot, tmp_path, verbose):
    root, _ = lerobot
    import_dataset(root, tmp_path / "store", "lerobot")
    flags = ["--verbose"] if verbose else []
    command = ["export", str(tmp_path / "store"), str(tmp_path / "out"), "--format", "lerobot"]
    env = {k: v for k, v in os.environ.items() if k != "SVT_LOG"}
    done = subprocess.run(
        [sys.executable, "-m", "rbzarr", *flags, *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert ("Svt[info]" in done.stderr) is verbose, done.stderr
