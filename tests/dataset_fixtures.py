"""Small LeRobot v3.0 datasets and robomimic HDF5 files, written as those projects write them.

The LeRobot layout follows ``lerobot/datasets/utils.py`` and ``dataset_metadata.py``
(``meta/info.json``, ``meta/tasks.parquet`` indexed by task, ``meta/episodes/chunk-000/
file-000.parquet`` with from/to indices and video timestamps, one data parquet file and one
mp4 per camera shared by every episode, one row group per episode).  The robomimic layout
follows ``robomimic/utils/dataset.py`` (``data/demo_<i>`` with ``num_samples``,
``obs/*``, ``next_obs/*``, ``actions``, ``rewards``, ``dones``, ``data.attrs['env_args']``).
Written independently of rbzarr's exporters, so an import test does not check the exporter
against itself.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass
class LeRobotSpec:
    """What a fixture dataset holds."""

    lengths: tuple[int, ...] = (5, 7, 4)
    fps: int = 10
    size: int = 32
    codec: str = "libsvtav1"
    cameras: tuple[str, ...] = ("observation.images.top",)
    with_reward: bool = True
    tasks: tuple[str, ...] = ("pick the cube", "place the cube")
    seed: int = 0
    # Episodes from this index on go to file-001 (data and videos), as LeRobot does when
    # a file reaches its size limit; None: every episode in file-000.
    second_file_from: int | None = None
    frames: dict[str, np.ndarray] = field(default_factory=dict)


def frame_pattern(count: int, size: int, seed: int) -> np.ndarray:
    """Smooth moving gradients (video codecs keep them well): ``[count, size, size, 3]`` uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    phases = rng.uniform(0, 2 * np.pi, size=3)
    frames = np.empty((count, size, size, 3), dtype=np.uint8)
    for i in range(count):
        for c in range(3):
            wave = np.sin((x + 2 * i) / 6.0 + phases[c]) + np.cos((y - i) / 7.0 + c)
            frames[i, :, :, c] = np.clip(128 + 60 * wave, 0, 255).astype(np.uint8)
    return frames


def _encode(path: Path, frames: np.ndarray, fps: int, codec: str) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"preset": "12", "crf": "30", "g": "2"} if codec == "libsvtav1" else {"g": "2"}
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
        name = stream.codec.canonical_name
    return {
        "video.height": frames.shape[1],
        "video.width": frames.shape[2],
        "video.codec": name,
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }


def _tasks_table(tasks: tuple[str, ...]) -> pa.Table:
    """``meta/tasks.parquet`` as LeRobot writes it, through pandas: the task is the index."""
    import pandas  # noqa: PLC0415 (only the LeRobot fixtures need it)

    frame = pandas.DataFrame(
        {"task_index": range(len(tasks))}, index=pandas.Index(tasks, name="task")
    )
    return pa.Table.from_pandas(frame)


def _write_videos(
    root: Path,
    spec: LeRobotSpec,
    starts: np.ndarray,
    file_of: list[int],
    features: dict[str, dict],
    episodes: dict[str, list],
) -> None:
    """One mp4 per camera and file; the episodes' video columns and the features' info."""
    count, total = len(spec.lengths), int(starts[-1])
    split = file_of.index(1) if 1 in file_of else count
    # Video timestamps count from the start of each file.
    file_start = [int(starts[0 if file_of[i] == 0 else split]) for i in range(count)]
    for number, camera in enumerate(spec.cameras):
        frames = frame_pattern(total, spec.size, spec.seed + number)
        spec.frames[camera] = frames
        for file in sorted(set(file_of)):
            first, end = (0, int(starts[split])) if file == 0 else (int(starts[split]), total)
            info = _encode(
                root / f"videos/{camera}/chunk-000/file-{file:03d}.mp4",
                frames[first:end],
                spec.fps,
                spec.codec,
            )
        features[camera] = {
            "dtype": "video",
            "shape": [spec.size, spec.size, 3],
            "names": ["height", "width", "channels"],
            "info": info,
        }
        episodes[f"videos/{camera}/chunk_index"] = [0] * count
        episodes[f"videos/{camera}/file_index"] = file_of
        episodes[f"videos/{camera}/from_timestamp"] = [
            (int(starts[i]) - file_start[i]) / spec.fps for i in range(count)
        ]
        episodes[f"videos/{camera}/to_timestamp"] = [
            (int(starts[i + 1]) - file_start[i]) / spec.fps for i in range(count)
        ]


def write_lerobot(root: Path, spec: LeRobotSpec | None = None) -> LeRobotSpec:
    """Write a LeRobot v3.0 dataset below ``root``; the spec comes back with its frames."""
    spec = spec or LeRobotSpec()
    rng = np.random.default_rng(spec.seed)
    total = sum(spec.lengths)
    starts = np.cumsum((0, *spec.lengths))
    episode_index = np.repeat(np.arange(len(spec.lengths)), spec.lengths)
    frame_index = np.concatenate([np.arange(n) for n in spec.lengths])
    task_index = episode_index % len(spec.tasks)
    state = rng.standard_normal((total, 6)).astype(np.float32)
    action = rng.standard_normal((total, 4)).astype(np.float32)
    columns = {
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 6),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), 4),
        "timestamp": pa.array((frame_index / spec.fps).astype(np.float32)),
        "frame_index": pa.array(frame_index.astype(np.int64)),
        "episode_index": pa.array(episode_index.astype(np.int64)),
        "index": pa.array(np.arange(total, dtype=np.int64)),
        "task_index": pa.array(task_index.astype(np.int64)),
    }
    features: dict[str, dict] = {
        "observation.state": {
            "dtype": "float32",
            "shape": [6],
            "names": [f"j{i}" for i in range(6)],
        },
        "action": {"dtype": "float32", "shape": [4], "names": [f"a{i}" for i in range(4)]},
    }
    if spec.with_reward:
        reward = rng.standard_normal(total).astype(np.float32)
        done = np.zeros(total, dtype=bool)
        done[starts[1:] - 1] = True
        columns["next.reward"] = pa.array(reward)
        columns["next.done"] = pa.array(done)
        features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
        features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        features[name] = {
            "dtype": "float32" if name == "timestamp" else "int64",
            "shape": [1],
            "names": None,
        }
    table = pa.table(columns)
    count = len(spec.lengths)
    split = count if spec.second_file_from is None else spec.second_file_from
    file_of = [0 if i < split else 1 for i in range(count)]
    for file in sorted(set(file_of)):
        data = root / f"data/chunk-000/file-{file:03d}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(data, table.schema) as writer:
            for i in range(count):
                if file_of[i] == file:
                    writer.write_table(table.slice(int(starts[i]), spec.lengths[i]))
    episodes: dict[str, list] = {
        "episode_index": list(range(count)),
        "tasks": [[spec.tasks[i % len(spec.tasks)]] for i in range(count)],
        "length": list(spec.lengths),
        "data/chunk_index": [0] * count,
        "data/file_index": file_of,
        "dataset_from_index": [int(s) for s in starts[:-1]],
        "dataset_to_index": [int(s) for s in starts[1:]],
    }
    _write_videos(root, spec, starts, file_of, features, episodes)
    episodes["meta/episodes/chunk_index"] = [0] * count
    episodes["meta/episodes/file_index"] = [0] * count
    episodes["stats/action/mean"] = [
        action[s:e].mean(0).tolist() for s, e in itertools.pairwise(starts)
    ]
    meta = root / "meta"
    (meta / "episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table(episodes), meta / "episodes/chunk-000/file-000.parquet")
    pq.write_table(_tasks_table(spec.tasks), meta / "tasks.parquet")
    info_doc = {
        "codebase_version": "v3.0",
        "robot_type": "so100",
        "total_episodes": len(spec.lengths),
        "total_frames": total,
        "total_tasks": len(spec.tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": spec.fps,
        "splits": {"train": f"0:{len(spec.lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
    }
    (meta / "info.json").write_text(json.dumps(info_doc, indent=4))
    (meta / "stats.json").write_text("{}")
    return spec


def write_robomimic(
    path: Path, lengths: tuple[int, ...] = (6, 3, 5), seed: int = 0, next_obs: bool = True
) -> dict:
    """Write a robomimic HDF5 file; returns its arrays by demo name."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i, n in enumerate(lengths):
            demo = {
                "actions": rng.uniform(-1, 1, (n, 7)),
                "rewards": rng.standard_normal(n),
                "dones": (np.arange(n) == n - 1).astype(np.int64),
                "states": rng.standard_normal((n, 12)),
                "obs/robot0_eef_pos": rng.standard_normal((n, 3)),
                "obs/agentview_image": rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
            }
            if next_obs:
                demo["next_obs/robot0_eef_pos"] = rng.standard_normal((n, 3))
                demo["next_obs/agentview_image"] = rng.integers(
                    0, 256, (n, 8, 8, 3), dtype=np.uint8
                )
            group = data.create_group(f"demo_{i}")
            group.attrs["num_samples"] = n
            for name, value in demo.items():
                group.create_dataset(name, data=value)
            arrays[f"demo_{i}"] = demo
        data.attrs["total"] = sum(lengths)
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1, "env_kwargs": {}})
        f.create_dataset(
            "mask/train", data=np.array([f"demo_{i}" for i in range(len(lengths) - 1)], dtype="S")
        )
    return arrays
