"""Write a store as a LeRobot v3.0 dataset: one data parquet file, one mp4 per video feature.

Every episode (cut at ``dones``, see :mod:`rbzarr.interop.episodes`) is one row group of
``data/chunk-000/file-000.parquet`` and one stretch of each
``videos/<key>/chunk-000/file-000.mp4``; ``meta/`` gets ``info.json``, ``stats.json``
(LeRobot 0.6's statistics with quantiles, :mod:`rbzarr.interop.lerobot_stats`),
``tasks.parquet`` and ``episodes/chunk-000/file-000.parquet`` (with each episode's
``stats/<feature>/<stat>``).  A store imported from LeRobot is written back with its own
features (their ``info`` included), fps, robot type and tasks; its image features are PNG
frames in the parquet file again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from rbzarr.errors import StoreExistsError
from rbzarr.interop.episodes import SOURCE_KEY, StoredEpisode, read_episodes
from rbzarr.interop.images import png_column
from rbzarr.interop.lerobot_keys import CODEBASE_VERSION, feature_name, flat_key
from rbzarr.interop.lerobot_stats import aggregate_stats, episode_stats, image_episode_stats
from rbzarr.interop.video import VideoFrameWriter
from rbzarr.storage.io.location import Location

__all__ = ["LEROBOT_CODEC_OPTIONS", "export_lerobot"]

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
# Encoder options per codec: LeRobot's own defaults where it has them (libsvtav1, crf 30).
LEROBOT_CODEC_OPTIONS: dict[str, dict[str, str]] = {
    "libsvtav1": {"crf": "30", "preset": "12", "g": "2"},
    "libx264": {"crf": "23", "g": "2"},
}


def _is_video(rows: np.ndarray) -> bool:
    return rows.dtype == np.uint8 and rows.ndim == 4 and rows.shape[-1] == 3


@dataclass
class _Plan:
    """Which stored key becomes which feature, and what the source dataset said."""

    features: dict[str, dict[str, Any]]
    keys: dict[str, str]
    video_keys: list[str]
    fps: int
    robot_type: str | None
    episode_tasks: list[list[str]]
    # Features whose rows [T, 1] are written as scalar columns (LeRobot's shape [1]).
    scalar: frozenset[str] = frozenset()


def _plan(
    first: StoredEpisode, source: Mapping[str, Any] | None, fps: int | None, task: str
) -> _Plan:
    """The features to write: the source dataset's own, or one per mappable key of the store."""
    if source is not None and source.get("format") == "lerobot":
        features = {name: dict(spec) for name, spec in source["features"].items()}
        keys = {name: key for name in features if (key := flat_key(name)) is not None}
        tasks = [list(entry["tasks"]) for entry in source["episodes"]]
        return _Plan(
            features,
            keys,
            [n for n, spec in features.items() if spec["dtype"] == "video"],
            int(fps or source["fps"]),
            source.get("robot_type"),
            tasks,
        )
    features, keys, videos = {}, {}, []
    for key, rows in first.fields.items():
        name = "next.done" if key == "dones" else feature_name(key)
        if name is None or name in features:
            continue
        keys[name] = key
        if _is_video(rows):
            videos.append(name)
            features[name] = {
                "dtype": "video",
                "shape": list(rows.shape[1:]),
                "names": ["height", "width", "channels"],
            }
        else:
            features[name] = {
                "dtype": str(rows.dtype),
                "shape": list(rows.shape[1:]) or [1],
                "names": None,
            }
    for name, dtype in (("timestamp", "float32"), ("task_index", "int64")):
        features.setdefault(name, {"dtype": dtype, "shape": [1], "names": None})
    for name in ("frame_index", "episode_index", "index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    scalar = frozenset(name for name, key in keys.items() if first.fields[key].shape[1:] == (1,))
    return _Plan(features, keys, videos, int(fps or 30), None, [[task]], scalar)


def _arrow_column(rows: np.ndarray) -> pa.Array:
    """``[T]`` rows as a scalar column, ``[T, *shape]`` as nested fixed-size lists."""
    flat = pa.array(np.ascontiguousarray(rows).reshape(-1))
    for length in reversed(rows.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, int(length))
    return flat


def _video_info(
    source: Mapping[str, Any] | None, writer: VideoFrameWriter, codec: str, fps: int
) -> dict[str, Any]:
    """A video feature's ``info`` with LeRobot 0.6's keys: the stream's, then the encoder's.

    A source dataset's ``info`` is kept; only what the stream now says is set over it.
    """
    stream = {
        "video.height": writer.height,
        "video.width": writer.width,
        "video.codec": writer.codec_name,
        "video.pix_fmt": "yuv420p",
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }
    if source:
        return {**source, **stream}
    options = LEROBOT_CODEC_OPTIONS.get(codec, {})
    encoder: dict[str, Any] = {
        "video.g": int(options["g"]) if "g" in options else None,
        "video.crf": int(options["crf"]) if "crf" in options else None,
        "video.preset": int(options["preset"]) if "preset" in options else None,
        "video.fast_decode": 0,
        "video.video_backend": "pyav",
        "video.extra_options": {},
    }
    return {**stream, **encoder, "is_depth_map": False}


class _LeRobotWriter:
    """The files of one dataset being written below ``location``."""

    def __init__(self, location: Location, plan: _Plan, codec: str) -> None:
        self.location, self.plan, self.codec = location, plan, codec
        self.stats: dict[str, list[dict[str, np.ndarray]]] = {}
        self.episodes: list[dict[str, Any]] = []
        self.tasks: dict[str, int] = {}
        self.frames = 0
        self._handles: list[IO[bytes]] = []
        self._data: pq.ParquetWriter | None = None
        self._videos: dict[str, VideoFrameWriter] = {}

    def _open(self, path: str) -> IO[bytes]:
        target = self.location.join(*path.split("/"))
        self.location.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        handle: IO[bytes] = self.location.fs.open(target, "wb")
        self._handles.append(handle)
        return handle

    def add(self, episode: StoredEpisode) -> None:
        index = len(self.episodes)
        length = len(next(iter(episode.fields.values())))
        tasks = (
            self.plan.episode_tasks[index]
            if index < len(self.plan.episode_tasks)
            else self.plan.episode_tasks[-1]
        )
        for task in tasks:
            self.tasks.setdefault(task, len(self.tasks))
        columns: dict[str, pa.Array] = {}
        meta: dict[str, Any] = {
            "episode_index": index,
            "tasks": tasks,
            "length": length,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": self.frames,
            "dataset_to_index": self.frames + length,
        }
        stats: dict[str, dict[str, np.ndarray]] = {}
        for name, spec in self.plan.features.items():
            rows = self._rows(name, episode, index, length, tasks)
            if spec["dtype"] in ("video", "image"):
                stats[name] = image_episode_stats(rows)
                if spec["dtype"] == "video":
                    meta.update(self._add_video(name, rows))
                else:
                    columns[name] = png_column(rows)
                continue
            columns[name] = _arrow_column(rows)
            stats[name] = episode_stats(rows)
        for name, values in stats.items():
            self.stats.setdefault(name, []).append(values)
            for stat, value in values.items():
                meta[f"stats/{name}/{stat}"] = value.tolist()
        meta["meta/episodes/chunk_index"] = 0
        meta["meta/episodes/file_index"] = 0
        table = pa.table(columns)
        if self._data is None:
            self._data = pq.ParquetWriter(
                self._open(DATA_PATH.format(chunk_index=0, file_index=0)), table.schema
            )
        self._data.write_table(table)
        self.episodes.append(meta)
        self.frames += length

    def _rows(
        self, name: str, episode: StoredEpisode, index: int, length: int, tasks: list[str]
    ) -> np.ndarray:
        """The rows of feature ``name``: stored, or recomputed from the episode's position."""
        key = self.plan.keys.get(name)
        if key is not None and key in episode.fields:
            rows = episode.fields[key]
            return rows[:, 0] if name in self.plan.scalar else rows
        frame = np.arange(length, dtype=np.int64)
        computed: dict[str, np.ndarray] = {
            "frame_index": frame,
            "episode_index": np.full(length, index, dtype=np.int64),
            "index": frame + self.frames,
            "timestamp": (frame / self.plan.fps).astype(np.float32),
            "task_index": np.full(length, self.tasks[tasks[0]], dtype=np.int64),
        }
        if name not in computed:
            raise KeyError(f"trajectory {episode.trajectory_id} has no key for feature {name!r}")
        return computed[name]

    def _add_video(self, name: str, frames: np.ndarray) -> dict[str, Any]:
        writer = self._videos.get(name)
        if writer is None:
            handle = self._open(VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0))
            height, width = int(frames.shape[1]), int(frames.shape[2])
            writer = VideoFrameWriter(
                handle,
                self.plan.fps,
                height,
                width,
                self.codec,
                LEROBOT_CODEC_OPTIONS.get(self.codec, {}),
            )
            self._videos[name] = writer
            feature = self.plan.features[name]
            feature["info"] = _video_info(feature.get("info"), writer, self.codec, self.plan.fps)
        start, end = writer.append(frames)
        return {
            f"videos/{name}/chunk_index": 0,
            f"videos/{name}/file_index": 0,
            f"videos/{name}/from_timestamp": start,
            f"videos/{name}/to_timestamp": end,
        }

    def finish(self) -> dict[str, Any]:
        """Close the data and video files; write the ``meta/`` documents; return info.json."""
        for writer in self._videos.values():
            writer.close()
        if self._data is not None:
            self._data.close()
        self.close_files()
        with self._open_closing("meta/episodes/chunk-000/file-000.parquet") as handle:
            pq.write_table(pa.Table.from_pylist(self.episodes), handle)
        with self._open_closing("meta/tasks.parquet") as handle:
            pq.write_table(_tasks_table(self.tasks), handle)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.plan.robot_type,
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.plan.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.plan.video_keys else None,
            "features": self.plan.features,
        }
        stats = {
            name: {stat: value.tolist() for stat, value in aggregate_stats(episodes).items()}
            for name, episodes in self.stats.items()
        }
        self.location.write_bytes(json.dumps(stats, indent=4).encode(), "meta", "stats.json")
        self.location.write_bytes(json.dumps(info, indent=4).encode(), "meta", "info.json")
        return info

    def _open_closing(self, path: str) -> IO[bytes]:
        handle = self._open(path)
        self._handles.remove(handle)
        return handle

    def close_files(self) -> None:
        """Close every file still open (after a failure, before it is removed)."""
        for handle in self._handles:
            handle.close()
        self._handles.clear()


def _tasks_table(tasks: Mapping[str, int]) -> pa.Table:
    """``meta/tasks.parquet`` as pandas writes LeRobot's: the task string is the index."""
    table = pa.table(
        {
            "task_index": pa.array(list(tasks.values()), pa.int64()),
            "task": pa.array(list(tasks), pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def export_lerobot(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str],
    *,
    fps: int | None,
    task: str,
    codec: str,
    include_incomplete: bool,
    storage_options: Mapping[str, Any] | None,
    destination_options: Mapping[str, Any] | None,
    progress: bool,
) -> tuple[dict[str, Any], int]:
    """Write the store at ``source`` as a new LeRobot v3.0 dataset at ``destination``.

    The keywords are :func:`~rbzarr.interop.convert.export_dataset`'s (which gives their
    defaults).  Returns ``info.json``'s document and the number of incomplete episodes left
    out.
    ``destination`` must be empty; on failure what was written is removed.
    """
    location = Location.from_url(destination, destination_options)
    existed = location.exists()
    if existed and location.list_names():
        raise StoreExistsError(f"{location.url} is not empty; export writes only to a new location")
    episodes = read_episodes(source, storage_options, include_incomplete=include_incomplete)
    writer: _LeRobotWriter | None = None
    try:
        for episode in tqdm(episodes, desc="export", unit="episode", disable=not progress):
            if writer is None:
                plan = _plan(episode, episodes.documents.metadata.get(SOURCE_KEY), fps, task)
                writer = _LeRobotWriter(location, plan, codec)
            writer.add(episode)
        if writer is None:
            raise ValueError(
                f"{source}: the store holds no complete episode to export"
                f" ({episodes.left_out} incomplete; --include-incomplete writes them)"
            )
        return writer.finish(), episodes.left_out
    except BaseException:
        if writer is not None:
            writer.close_files()
        for name in location.list_names() if existed else []:
            location.delete(name)
        if not existed:
            location.delete()
        raise
