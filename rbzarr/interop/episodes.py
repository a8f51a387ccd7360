"""Stream episodes into a new zarr store, and read a store back as episodes.

An episode is a dict of numpy arrays by flat trajectory key (``"actions"``,
``"curr_obs/state"``), each with ``T`` rows and no env dimension.  In a store it is one
trajectory of shape ``[T, 1, ...]``; going out, every env column of a trajectory is one
episode.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rbzarr.buffer.index import TrajectoryIndex
from rbzarr.errors import StoreExistsError
from rbzarr.storage.documents import Documents
from rbzarr.storage.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.fields import RESET_ROW_FIELDS
from rbzarr.trajectory.model import trajectory_from_raw

__all__ = ["SOURCE_KEY", "StoredEpisode", "read_episodes", "shifted", "write_episodes"]

# The metadata.json key under which an import records where its store came from.
SOURCE_KEY = "source_dataset"


def shifted(rows: np.ndarray) -> np.ndarray:
    """The next row of each row; the last row repeats (an episode's final step)."""
    return np.concatenate([rows[1:], rows[-1:]], axis=0)


def _trajectory_fields(episode: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The episode's arrays as ``[T, 1, ...]`` tensors of the same dtype and bits."""
    return {
        key: torch.from_numpy(np.require(rows[:, None], requirements=["C", "W"]))
        for key, rows in episode.items()
    }


def write_episodes(
    episodes: Iterable[Mapping[str, np.ndarray]],
    destination: str | os.PathLike[str] | Location,
    source: Mapping[str, Any],
    *,
    total: int | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Write each episode as one ``[T, 1, ...]`` trajectory of a new zarr store.

    The documents are written last, so a store appears only when every episode is in.  If
    an episode fails (bad data, a backend error), what was written is removed and the error
    propagates: ``destination`` is left as it was.  ``source`` is recorded in the metadata
    under :data:`SOURCE_KEY`.
    """
    location = Location.from_url(destination, destination_options)
    layout = ZarrLayout(location)
    if layout.has_documents() or layout.list_ids():
        raise StoreExistsError(
            f"{location.url} already holds a store; import writes only to a new location"
        )
    existed = location.exists()
    index = TrajectoryIndex()
    longest = 0
    try:
        for episode in tqdm(
            episodes, desc="import", unit="episode", total=total, disable=not progress
        ):
            fields = _trajectory_fields(episode)
            rows = len(next(iter(episode.values())))
            longest = max(longest, rows)
            entry = index.new_entry((rows, 1), rows, "")
            layout.write(entry, trajectory_from_raw(fields, rows, ""))
        documents = index.to_documents("zarr", extra={SOURCE_KEY: dict(source)})
        return layout.write_documents(documents)
    except BaseException:
        if existed:
            for trajectory_id in index.id_list:
                layout.delete(index.entries[trajectory_id])
        else:
            location.delete()
        raise


@dataclass(frozen=True)
class StoredEpisode:
    """One env column of one stored trajectory, as numpy rows without the env dimension."""

    trajectory_id: int
    column: int
    fields: dict[str, np.ndarray]


def _without_reset_rows(key: str, rows: np.ndarray, steps: int) -> np.ndarray:
    """``rows`` minus the reset row leading each rollout epoch (reset-row fields only)."""
    if key not in RESET_ROW_FIELDS or len(rows) == steps:
        return rows
    epochs = len(rows) - steps
    per_epoch = steps // epochs + 1
    keep = np.ones(len(rows), dtype=bool)
    keep[::per_epoch] = False
    return rows[keep]


def read_episodes(
    source: str | os.PathLike[str] | Location,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[Documents, int, Iterator[StoredEpisode]]:
    """The source's documents, its episode count and its episodes, read one trajectory at a time.

    Every env column of a trajectory is one episode of ``T`` rows; reset rows are left out.
    """
    reader, documents = open_store(source, storage_options)
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    count = sum(int(index.entries[i]["shape"][1]) for i in index.id_list)

    def episodes() -> Iterator[StoredEpisode]:
        for trajectory_id in index.id_list:
            entry = index.entries[trajectory_id]
            steps, columns = int(entry["shape"][0]), int(entry["shape"][1])
            tensors = reader.read(entry).tensors()
            arrays = {key: to_numpy(value) for key, value in tensors.items() if value.dim() >= 2}
            for column in range(columns):
                fields = {
                    key: _without_reset_rows(key, rows[:, column], steps)
                    for key, rows in arrays.items()
                }
                yield StoredEpisode(trajectory_id, column, fields)

    return documents, count, episodes()
