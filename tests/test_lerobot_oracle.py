"""LeRobot 0.6 as the oracle: datasets written by LeRobot's own writer, exports read by it.

``lerobot`` 0.6 needs Python >= 3.12, so these tests run in the environment that
``bash scripts/lerobot_env.sh test`` builds; elsewhere they are skipped.  LeRobot writes
the sources (``LeRobotDataset.create`` -> ``add_frame`` -> ``save_episode`` ->
``finalize``); rbzarr imports and exports them; ``LeRobotDataset``,
``LeRobotDatasetMetadata``, ``merge_datasets`` and ``delete_episodes`` read the exports.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

pytest.importorskip("lerobot.datasets.lerobot_dataset")

from lerobot.datasets.compute_stats import aggregate_stats as lerobot_aggregate
from lerobot.datasets.compute_stats import (
    compute_episode_stats,
    get_feature_stats,
)
from lerobot.datasets.dataset_tools import delete_episodes, merge_datasets
from lerobot.datasets.lerobot_dataset import (
    LeRobotDataset,
    LeRobotDatasetMetadata,
)

from rbzarr.interop import export_dataset, import_dataset
from rbzarr.interop.episodes import read_episodes
from rbzarr.interop.lerobot_stats import (
    aggregate_stats,
    episode_stats,
    image_episode_stats,
)

CAMERA = "observation.images.cam"
LENGTHS = (5, 7, 1, 4)


def features(visual: str) -> dict:
    return {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        CAMERA: {"dtype": visual, "shape": (32, 48, 3), "names": ["height", "width", "channels"]},
    }


def write_with_lerobot(root, visual: str, seed: int = 0):
    """A dataset written by LeRobot's writer; returns it and the frames it was given."""
    dataset = LeRobotDataset.create(
        "rbzarr/oracle",
        fps=10,
        features=features(visual),
        root=root,
        use_videos=visual == "video",
    )
    rng = np.random.default_rng(seed)
    given = []
    for episode, length in enumerate(LENGTHS):
        frames = []
        for step in range(length):
            frame = {
                "observation.state": rng.standard_normal(6).astype(np.float32),
                "action": rng.standard_normal(4).astype(np.float32),
                "next.reward": np.array([rng.standard_normal()], dtype=np.float32),
                "next.done": np.array([step == length - 1]),
                # smooth gradients: what a camera sees, and what a codec keeps
                CAMERA: np.clip(
                    np.mgrid[0:32, 0:48, 0:3].sum(axis=0) * 2 + 10 * episode + step, 0, 255
                ).astype(np.uint8),
                "task": f"task {episode % 2}",
            }
            frames.append(frame)
            dataset.add_frame(dict(frame))
        dataset.save_episode()
        given.append(frames)
    dataset.finalize()
    return dataset, given


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def image_source(tmp_path_factory):
    return write_with_lerobot(tmp_path_factory.mktemp("image") / "lerobot", "image")


@pytest.fixture(scope="module")
def video_source(tmp_path_factory):
    return write_with_lerobot(tmp_path_factory.mktemp("video") / "lerobot", "video")


# LeRobot's two video decoders (torchcodec: its Linux default, which needs FFmpeg's shared
# libraries; scripts/lerobot_env.sh installs them): every oracle test runs with each.
DECODERS = ("pyav", "torchcodec")
_decoder = {"name": "pyav"}


@pytest.fixture(autouse=True, params=DECODERS)
def decoder(request):
    _decoder["name"] = request.param
    return request.param


def load(root, repo_id="rbzarr/export") -> LeRobotDataset:
    return LeRobotDataset(repo_id, root=root, video_backend=_decoder["name"])


def round_trip(source, tmp_path):
    import_dataset(source.root, tmp_path / "store", "lerobot")
    written = export_dataset(tmp_path / "store", tmp_path / "export", "lerobot")
    assert (written.episodes, written.left_out) == (len(LENGTHS), 0)
    return tmp_path / "export"


def assert_items_equal(one: LeRobotDataset, two: LeRobotDataset, skip=()):
    assert len(one) == len(two)
    for position in range(len(one)):
        first, second = one[position], two[position]
        assert first.keys() == second.keys()
        for key, value in first.items():
            if key in skip:
                continue
            if hasattr(value, "dtype"):
                assert value.dtype == second[key].dtype, key
                assert (value == second[key]).all(), (position, key)
            else:
                assert value == second[key], (position, key)


def relative_error(one, two) -> float:
    one, two = np.asarray(one, dtype=np.float64), np.asarray(two, dtype=np.float64)
    return float(np.max(np.abs(one - two) / np.maximum(np.abs(one), 1e-12)))


def test_image_frames_import_bit_exact_as_uint8_hwc(image_source, tmp_path):
    source, given = image_source
    import_dataset(source.root, tmp_path / "store", "lerobot")
    stored = [episode.fields for episode in read_episodes(tmp_path / "store")]
    for fields, frames in zip(stored, given, strict=True):
        images = fields["curr_obs/images.cam"]
        assert images.dtype == np.uint8
        assert images.shape == (len(frames), 32, 48, 3)
        assert np.array_equal(images, np.stack([f[CAMERA] for f in frames]))
        assert np.array_equal(fields["actions"], np.stack([f["action"] for f in frames]))


def test_an_image_dataset_round_trips_bit_exact_through_lerobot(image_source, tmp_path):
    source, _ = image_source
    export = round_trip(source, tmp_path)
    info = json.loads((export / "meta/info.json").read_text())
    original = json.loads((source.root / "meta/info.json").read_text())
    assert info == original
    assert_items_equal(load(source.root, "rbzarr/source"), load(export))
    exported = pq.read_table(export / "data/chunk-000/file-000.parquet")
    written = pq.read_table(source.root / "data/chunk-000/file-000.parquet")
    for name in written.column_names:
        if name != CAMERA:
            assert exported.column(name).equals(written.column(name)), name


def test_video_info_is_lerobots_and_kept_and_numeric_columns_are_exact(video_source, tmp_path):
    source, _ = video_source
    export = round_trip(source, tmp_path)
    info = json.loads((export / "meta/info.json").read_text())
    original = json.loads((source.root / "meta/info.json").read_text())
    assert info["features"] == original["features"]
    assert info["features"][CAMERA]["info"]["is_depth_map"] is False
    assert "video.is_depth_map" not in info["features"][CAMERA]["info"]
    assert_items_equal(load(source.root, "rbzarr/source"), load(export), skip={CAMERA})
    # The imported frames are LeRobot's own decode (pyav) of the source's video, and the
    # export decodes, in LeRobot, to the frames rbzarr encoded within the codec's loss.
    imported = np.concatenate(
        [e.fields["curr_obs/images.cam"] for e in read_episodes(tmp_path / "store")]
    )
    theirs, ours = load(source.root, "rbzarr/source"), load(export)
    for position in range(len(theirs)):
        decoded = (theirs[position][CAMERA].numpy().transpose(1, 2, 0) * 255).round()
        assert np.array_equal(decoded.astype(np.uint8), imported[position]), position
        again = (ours[position][CAMERA].numpy().transpose(1, 2, 0) * 255).round()
        assert np.abs(again - imported[position].astype(np.float64)).mean() < 3.0


def test_a_store_export_has_lerobots_video_info_keys(video_source, tmp_path):
    """A store not imported from LeRobot gets the keys LeRobot's own writer records."""
    source, _ = video_source
    import_dataset(source.root, tmp_path / "store", "lerobot")
    fields = [episode.fields for episode in read_episodes(tmp_path / "store")]
    from rbzarr.interop.episodes import write_episodes  # noqa: PLC0415

    write_episodes(iter(fields), tmp_path / "plain", {"format": "synthetic"})
    export_dataset(tmp_path / "plain", tmp_path / "export", "lerobot", fps=10)
    info = json.loads((tmp_path / "export/meta/info.json").read_text())
    original = json.loads((source.root / "meta/info.json").read_text())
    assert (
        info["features"]["observation.images.cam"]["info"] == original["features"][CAMERA]["info"]
    )
    assert len(load(tmp_path / "export")) == sum(LENGTHS)


def test_stats_match_lerobots_own_within_1e6(image_source, tmp_path):
    source, _ = image_source
    export = round_trip(source, tmp_path)
    theirs = json.loads((source.root / "meta/stats.json").read_text())
    ours = json.loads((export / "meta/stats.json").read_text())
    assert ours.keys() == theirs.keys()
    for feature, stats in theirs.items():
        assert set(ours[feature]) == set(stats) >= {"q01", "q10", "q50", "q90", "q99", "count"}
        for name, value in stats.items():
            assert relative_error(value, ours[feature][name]) <= 1e-6, (feature, name)
    # Per episode too: LeRobot's tools (delete_episodes) aggregate these.
    mine = pq.read_table(export / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    written = pq.read_table(source.root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for one, two in zip(written, mine, strict=True):
        for column, value in one.items():
            if column.startswith("stats/"):
                assert relative_error(value, two[column]) <= 1e-6, column
    metadata = LeRobotDatasetMetadata("rbzarr/export", root=export)
    assert metadata.stats["action"]["q99"].shape == (4,)


@pytest.mark.parametrize(
    "shape",
    [(50,), (50, 3), (1, 4), (2, 1), (200, 2, 3)],
    ids=["scalar", "vector", "one-frame", "two-frames", "matrix"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_quantiles_equal_lerobots_computation(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    episodes = [
        (rng.standard_normal((shape[0] + extra, *shape[1:])) * 5).astype(dtype)
        for extra in (0, 3, 11)
    ]
    theirs = []
    for rows in episodes:
        stats = get_feature_stats(rows, axis=0, keepdims=rows.ndim == 1)
        theirs.append({"x": stats})
    mine = [episode_stats(rows) for rows in episodes]
    for their, our in zip(theirs, mine, strict=True):
        for name, value in their["x"].items():
            assert relative_error(value, our[name]) <= 1e-6, name
    combined = lerobot_aggregate(theirs)["x"]
    for name, value in aggregate_stats(mine).items():
        assert relative_error(combined[name], value) <= 1e-6, name


def test_image_statistics_equal_lerobots_computation(tmp_path):
    """LeRobot's statistics of an episode's image files (sampled, downsampled) and ours."""
    rng = np.random.default_rng(5)
    spec = {"x": {"dtype": "image", "shape": (320, 200, 3), "names": None}}
    for count in (1, 3, 140):
        frames = rng.integers(0, 256, (count, 320, 200, 3), dtype=np.uint8)
        paths = []
        for position, frame in enumerate(frames):
            path = tmp_path / f"{count}-{position}.png"
            Image.fromarray(frame).save(path)
            paths.append(str(path))
        theirs = compute_episode_stats({"x": paths}, spec)["x"]
        ours = image_episode_stats(frames)
        assert theirs.keys() == ours.keys()
        for name, value in theirs.items():
            assert np.asarray(value).shape == ours[name].shape, name
            assert relative_error(value, ours[name]) <= 1e-6, (count, name)


def test_lerobots_tools_work_on_exports(video_source, image_source, tmp_path):
    for name, (source, _) in {"video": video_source, "image": image_source}.items():
        export = round_trip(source, tmp_path / name)
        metadata = LeRobotDatasetMetadata("rbzarr/export", root=export)
        assert (metadata.total_episodes, metadata.total_frames) == (len(LENGTHS), sum(LENGTHS))
        merged = merge_datasets(
            [load(source.root, "rbzarr/source"), load(export)],
            output_repo_id="rbzarr/merged",
            output_dir=tmp_path / name / "merged",
        )
        assert merged.meta.total_episodes == 2 * len(LENGTHS)
        again = load(tmp_path / name / "merged", "rbzarr/merged")
        assert len(again) == 2 * sum(LENGTHS)
        assert "q50" in again.meta.stats["action"]
        kept = delete_episodes(
            load(export), [1], output_dir=tmp_path / name / "deleted", repo_id="rbzarr/deleted"
        )
        assert kept.meta.total_episodes == len(LENGTHS) - 1
        assert len(load(tmp_path / name / "deleted", "rbzarr/deleted")) == sum(LENGTHS) - LENGTHS[1]


def test_a_running_episode_is_left_out_unless_asked(tmp_path):
    """A rollout store whose last episode still runs exports its complete episodes."""
    import torch  # noqa: PLC0415

    from rbzarr import Trajectory, TrajectoryReplayBuffer  # noqa: PLC0415

    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "store")
    T = 8
    dones = torch.zeros(T + 1, 1, 1, dtype=torch.bool)
    dones[[2, 5], 0] = True  # episodes of steps 0..1 and 2..4 end; 5..7 still runs
    states = torch.randn(T, 1, 3)
    buffer.add_trajectories(
        [
            Trajectory(
                max_episode_length=T,
                curr_obs={"state": states},
                next_obs={"state": states},
                actions=torch.randn(T, 1, 2),
                rewards=torch.randn(T, 1, 1),
                dones=dones,
            )
        ]
    )
    buffer.close()
    written = export_dataset(tmp_path / "store", tmp_path / "export", "lerobot")
    assert (written.episodes, written.left_out) == (2, 1)
    assert load(tmp_path / "export").meta.total_frames == 5
    every = export_dataset(
        tmp_path / "store", tmp_path / "every", "lerobot", include_incomplete=True
    )
    assert (every.episodes, every.left_out) == (3, 0)
    assert len(load(tmp_path / "every")) == T
