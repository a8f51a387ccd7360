"""Read a LeRobot v3.0 dataset (a folder or fsspec URL) episode by episode, with pyarrow and PyAV.

Image features (PNG frames in the parquet files) decode to ``uint8`` ``[H, W, 3]``.  The
dataset is checked before anything is decoded: its version, that every parquet and
video file its episodes metadata names exists, that the files hold as many rows as the
metadata says, and that every video codec can be decoded.  Then episodes stream one at a
time: the rows of each data file are read in batches and handed out per episode, and each
video file is decoded front to back once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rbzarr.errors import DatasetFileNotFoundError, DatasetMismatchError, UnsupportedDatasetError
from rbzarr.interop.episodes import shifted
from rbzarr.interop.images import decode_images
from rbzarr.interop.lerobot_keys import CODEBASE_VERSION, flat_key
from rbzarr.interop.video import VideoFrameReader, check_decodable
from rbzarr.storage.io.location import Location

__all__ = ["LeRobotSource"]

_CONVERTER = "lerobot.scripts.convert_dataset_v21_to_v30"
_ROWS_PER_BATCH = 4096


def _chunk_path(template: str, chunk: int, file: int, **names: str) -> str:
    return template.format(chunk_index=chunk, file_index=file, **names)


@dataclass
class LeRobotSource:
    """A LeRobot v3.0 dataset's metadata, checked; :meth:`episodes` streams its frames."""

    location: Location
    info: dict[str, Any]
    tasks: list[str]
    episodes_meta: list[dict[str, Any]]
    video_keys: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._check_files()

    @classmethod
    def from_url(
        cls, url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None
    ) -> LeRobotSource:
        """Read and check the metadata of the dataset at ``url`` (see the module docs)."""
        location = Location.from_url(url, storage_options)
        info = _read_info(location)
        features = info["features"]
        video_keys = [name for name, spec in features.items() if spec.get("dtype") == "video"]
        for name, spec in features.items():
            _check_feature(location.url, name, spec)
        return cls(location, info, _read_tasks(location), _read_episodes(location), video_keys)

    @property
    def fps(self) -> int:
        """Frames per second of every episode."""
        return int(self.info["fps"])

    def _check_files(self) -> None:
        """Every named file exists; data files hold as many rows as their episodes."""
        where = self.location.url
        if len(self.episodes_meta) != int(self.info.get("total_episodes", len(self.episodes_meta))):
            raise DatasetMismatchError(
                f"{where}: info.json says total_episodes={self.info['total_episodes']}, the "
                f"episodes metadata lists {len(self.episodes_meta)}"
            )
        rows_by_file: dict[str, int] = {}
        for episode in self.episodes_meta:
            span = int(episode["dataset_to_index"]) - int(episode["dataset_from_index"])
            if span != int(episode["length"]):
                raise DatasetMismatchError(
                    f"{where}: episode {episode['episode_index']}: length {episode['length']}, "
                    f"but dataset_from_index..dataset_to_index spans {span} frames"
                )
            path = self.data_path(episode)
            rows_by_file[path] = rows_by_file.get(path, 0) + span
            for key in self.video_keys:
                self._require(self.video_path(episode, key))
        for path, rows in rows_by_file.items():
            self._require(path)
            with self.location.fs.open(self.location.join(*path.split("/")), "rb") as handle:
                stored = pq.ParquetFile(handle).metadata.num_rows
            if stored != rows:
                raise DatasetMismatchError(
                    f"{where}/{path}: holds {stored} rows, the episodes metadata says {rows}"
                )

    def _require(self, path: str) -> None:
        if not self.location.exists(*path.split("/")):
            raise DatasetFileNotFoundError(
                f"{self.location.url}/{path} is missing (named by the episodes metadata)"
            )

    def data_path(self, episode: Mapping[str, Any]) -> str:
        """The data parquet file holding ``episode``'s rows, relative to the root."""
        return _chunk_path(
            self.info["data_path"],
            int(episode["data/chunk_index"]),
            int(episode["data/file_index"]),
        )

    def video_path(self, episode: Mapping[str, Any], key: str) -> str:
        """The mp4 file holding ``episode``'s frames of video feature ``key``."""
        return _chunk_path(
            self.info["video_path"],
            int(episode[f"videos/{key}/chunk_index"]),
            int(episode[f"videos/{key}/file_index"]),
            video_key=key,
        )

    def episodes(self) -> Iterator[dict[str, np.ndarray]]:
        """Each episode's fields by flat trajectory key, in episode order (see lerobot_keys)."""
        videos = _VideoCursors(self)
        try:
            for episode, rows in self._episode_rows():
                yield self._episode_fields(episode, rows, videos)
        finally:
            videos.close()

    def _episode_rows(self) -> Iterator[tuple[dict[str, Any], pa.Table]]:
        """Each episode's metadata and its rows, reading every data file once, in batches."""
        reader: _RowReader | None = None
        for episode in self.episodes_meta:
            path = self.data_path(episode)
            if reader is None or reader.path != path:
                if reader is not None:
                    reader.finish()
                reader = _RowReader(self.location, path)
            yield episode, reader.take(int(episode["length"]), int(episode["episode_index"]))
        if reader is not None:
            reader.finish()

    def _episode_fields(
        self, episode: Mapping[str, Any], rows: pa.Table, videos: _VideoCursors
    ) -> dict[str, np.ndarray]:
        """One episode's arrays: every feature mapped, next observations, dones."""
        length = int(episode["length"])
        where = f"{self.location.url}: episode {episode['episode_index']}"
        _check_positions(where, rows, int(episode["dataset_from_index"]))
        fields: dict[str, np.ndarray] = {}
        for name, spec in self.info["features"].items():
            key = flat_key(name)
            if key is None:
                continue
            if name in self.video_keys:
                times = rows.column("timestamp").to_numpy() + float(
                    episode[f"videos/{name}/from_timestamp"]
                )
                fields[key] = videos.frames(episode, name, times)
            elif spec.get("dtype") == "image":
                fields[key] = decode_images(rows.column(name), spec["shape"], f"{where}: {name!r}")
            else:
                fields[key] = _column_array(rows.column(name), spec, where, name)
        for key in [k for k in fields if k.startswith("curr_obs/")]:
            fields["next_obs/" + key.removeprefix("curr_obs/")] = shifted(fields[key])
        if "rewards" not in fields:
            fields["rewards"] = np.zeros(length, dtype=np.float32)
        ends = np.zeros(length, dtype=bool)
        ends[-1] = True
        done = fields.get("terminations")
        fields["dones"] = ends if done is None else ends | done.astype(bool).reshape(length)
        return fields


def _read_info(location: Location) -> dict[str, Any]:
    """``meta/info.json``, refusing any version but v3.x."""
    if not location.exists("meta", "info.json"):
        raise DatasetFileNotFoundError(
            f"{location.url}/meta/info.json is missing: not a LeRobot dataset"
        )
    info = json.loads(location.read_bytes("meta", "info.json"))
    version = str(info.get("codebase_version", "unknown"))
    if not version.startswith("v3."):
        raise UnsupportedDatasetError(
            f"{location.url}: LeRobot dataset version {version}; rbzarr reads {CODEBASE_VERSION}. "
            f"Convert it first with LeRobot's converter: python -m {_CONVERTER} "
            f"--repo-id=<id> (or re-download the dataset's v3.0 revision)"
        )
    for required in ("fps", "features", "data_path"):
        if required not in info:
            raise UnsupportedDatasetError(f"{location.url}/meta/info.json has no {required!r}")
    return info


def _check_feature(where: str, name: str, spec: Mapping[str, Any]) -> None:
    dtype = spec.get("dtype")
    if dtype == "video":
        codec = (spec.get("info") or {}).get("video.codec")
        if codec is not None:
            check_decodable(str(codec), f"{where}: feature {name!r}")
        return
    if dtype == "image" and (len(spec.get("shape", ())) != 3 or spec["shape"][-1] != 3):
        raise UnsupportedDatasetError(
            f"{where}: image feature {name!r} has shape {spec.get('shape')}; rbzarr imports "
            f"RGB images [H, W, 3]"
        )
    if dtype == "string":
        raise UnsupportedDatasetError(
            f"{where}: feature {name!r} has dtype 'string'; rbzarr imports numeric, image "
            f"and video features"
        )


def _read_tasks(location: Location) -> list[str]:
    """Task strings by task index (``meta/tasks.parquet``; none if it is absent)."""
    if not location.exists("meta", "tasks.parquet"):
        return []
    with location.fs.open(location.join("meta", "tasks.parquet"), "rb") as handle:
        table = pq.read_table(handle)
    names = "task" if "task" in table.column_names else "__index_level_0__"
    by_index = dict(
        zip(table.column("task_index").to_pylist(), table.column(names).to_pylist(), strict=True)
    )
    return [str(by_index[i]) for i in sorted(by_index)]


def _read_episodes(location: Location) -> list[dict[str, Any]]:
    """The episodes metadata rows (without ``stats/`` columns), by episode index."""
    listed = location.list_files("meta", "episodes") if location.exists("meta", "episodes") else []
    files = [path for path in listed if path.endswith(".parquet")]
    if not files:
        raise DatasetFileNotFoundError(
            f"{location.url}/meta/episodes/ holds no parquet file: no episodes metadata"
        )
    rows: list[dict[str, Any]] = []
    for path in files:
        with location.fs.open(location.join("meta", "episodes", *path.split("/")), "rb") as handle:
            parquet = pq.ParquetFile(handle)
            wanted = [n for n in parquet.schema_arrow.names if not n.startswith("stats/")]
            rows.extend(parquet.read(columns=wanted).to_pylist())
    return sorted(rows, key=lambda row: int(row["episode_index"]))


def _check_positions(where: str, rows: pa.Table, start: int) -> None:
    """The rows' ``frame_index`` and ``index`` count up from 0 and from ``start``."""
    length = rows.num_rows
    expected = {"frame_index": np.arange(length), "index": np.arange(start, start + length)}
    for name, wanted in expected.items():
        if name in rows.column_names and not np.array_equal(rows.column(name).to_numpy(), wanted):
            raise DatasetMismatchError(f"{where}: column {name!r} is not {wanted[0]}..{wanted[-1]}")


def _column_array(
    column: pa.ChunkedArray, spec: Mapping[str, Any], where: str, name: str
) -> np.ndarray:
    """A parquet column as ``[rows, *shape]`` (a scalar column stays ``[rows]``)."""
    values = column.combine_chunks()
    trailing: tuple[int, ...] = ()
    while (
        pa.types.is_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
        or (pa.types.is_large_list(values.type))
    ):
        values = values.flatten()
        trailing = tuple(int(d) for d in spec["shape"])
    array = values.to_numpy(zero_copy_only=False)
    try:
        return array.reshape(len(column), *trailing)
    except ValueError as exc:
        raise DatasetMismatchError(
            f"{where}: feature {name!r} has shape {list(spec['shape'])} in info.json, but its "
            f"rows hold {array.size // max(1, len(column))} values"
        ) from exc


class _RowReader:
    """One data file's rows, read in batches and handed out episode by episode."""

    def __init__(self, location: Location, path: str) -> None:
        self.path = path
        self.where = f"{location.url}/{path}"
        self._handle = location.fs.open(location.join(*path.split("/")), "rb")
        self._batches = pq.ParquetFile(self._handle).iter_batches(batch_size=_ROWS_PER_BATCH)
        self._pending = pa.table({})
        self._pending_rows = 0

    def take(self, count: int, episode_index: int) -> pa.Table:
        """The next ``count`` rows; they must all belong to ``episode_index``."""
        parts = [self._pending] if self._pending_rows else []
        rows = self._pending_rows
        while rows < count:
            batch = next(self._batches, None)
            if batch is None:
                raise DatasetMismatchError(
                    f"{self.where}: ends {count - rows} rows before episode {episode_index} does"
                )
            parts.append(pa.Table.from_batches([batch]))
            rows += batch.num_rows
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        self._pending = table.slice(count)
        self._pending_rows = rows - count
        taken = table.slice(0, count)
        indices = taken.column("episode_index").to_numpy()
        if not (indices == episode_index).all():
            raise DatasetMismatchError(
                f"{self.where}: episode {episode_index} should have {count} rows, but its rows "
                f"hold episode_index values {sorted(set(indices.tolist()))}"
            )
        return taken

    def finish(self) -> None:
        """Close the file; rows left over mean the metadata undercounts them."""
        left = self._pending_rows + sum(batch.num_rows for batch in self._batches)
        self._handle.close()
        if left:
            raise DatasetMismatchError(f"{self.where}: {left} rows belong to no listed episode")


class _VideoCursors:
    """One open reader per video feature, moved to the next file as episodes advance."""

    def __init__(self, source: LeRobotSource) -> None:
        self.source = source
        self.readers: dict[str, tuple[str, float, VideoFrameReader, Any]] = {}

    def frames(self, episode: Mapping[str, Any], key: str, times: np.ndarray) -> np.ndarray:
        """``key``'s frames at ``times`` seconds into the episode's video file."""
        path = self.source.video_path(episode, key)
        held = self.readers.get(key)
        if held is None or held[0] != path or held[1] > float(times[0]):
            self._close(key)
            handle = self.source.location.fs.open(self.source.location.join(*path.split("/")), "rb")
            held = (
                path,
                0.0,
                VideoFrameReader(handle, f"{self.source.location.url}/{path}"),
                handle,
            )
        tolerance = 0.4 / self.source.fps
        frames = held[2].frames_at(times, tolerance)
        self.readers[key] = (path, float(times[-1]) + tolerance, held[2], held[3])
        return frames

    def _close(self, key: str) -> None:
        held = self.readers.pop(key, None)
        if held is not None:
            held[2].close()
            held[3].close()

    def close(self) -> None:
        """Close every open reader."""
        for key in list(self.readers):
            self._close(key)
