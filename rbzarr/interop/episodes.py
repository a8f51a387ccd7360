"""Stream episodes into a new zarr store, and read a store back as episodes.

An episode is a dict of numpy arrays by flat trajectory key (``"actions"``,
``"curr_obs/state"``), each with ``T`` rows and no env dimension.  In a store it is one
trajectory of shape ``[T, 1, ...]``.  Going out, every env column is cut into episodes at
its ``dones``, followed across consecutive trajectories; incomplete ones are counted.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rbzarr.errors import StoreExistsError
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.rlinf.documents import Documents, Entry
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.fields import RESET_ROW_FIELDS
from rbzarr.trajectory.model import Trajectory, trajectory_from_raw
from rbzarr.trajectory.steps import DONES, continues

__all__ = [
    "SOURCE_KEY",
    "StoreEpisodes",
    "StoredEpisode",
    "read_episodes",
    "shifted",
    "write_episodes",
]

# The metadata.json key under which an import records where its store came from.
SOURCE_KEY = "source_dataset"
# Import writes: threads, trajectories queued or being written, and the bytes they may hold.
_WRITERS = 2
_IN_FLIGHT = 4
_BURST_BYTES = 16 * 2**20


def shifted(rows: np.ndarray) -> np.ndarray:
    """The next row of each row; the last row repeats (an episode's final step)."""
    return np.concatenate([rows[1:], rows[-1:]], axis=0)


def _trajectory_fields(episode: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The episode's arrays as ``[T, 1, ...]`` tensors of the same dtype and bits."""
    return {
        key: torch.from_numpy(np.require(rows[:, None], requirements=["C", "W"]))
        for key, rows in episode.items()
    }


class _Writes:
    """Trajectory writes on a few threads, while the caller reads the next episodes.

    At most :data:`_IN_FLIGHT` trajectories are queued or being written, and one larger
    than :data:`_BURST_BYTES` is written alone, so memory stays near one episode's.
    """

    def __init__(self, layout: ZarrLayout) -> None:
        self.layout = layout
        self.pool = ThreadPoolExecutor(_WRITERS, thread_name_prefix="rbzarr-import")
        self.pending: deque[tuple[Future[None], int]] = deque()
        self.bytes = 0

    def submit(self, entry: Entry, trajectory: Trajectory, size: int) -> None:
        while self.pending and (
            len(self.pending) >= _IN_FLIGHT or self.bytes + size > _BURST_BYTES
        ):
            self._wait_one()
        self.pending.append((self.pool.submit(self.layout.write, entry, trajectory), size))
        self.bytes += size

    def _wait_one(self) -> None:
        future, size = self.pending.popleft()
        self.bytes -= size
        future.result()

    def finish(self) -> None:
        """Wait for every write; the first error propagates."""
        while self.pending:
            self._wait_one()
        self.pool.shutdown()

    def abandon(self) -> None:
        """After an error: cancel the queued writes, wait for those running."""
        for future, _ in self.pending:
            future.cancel()
        self.pool.shutdown(wait=True)
        self.pending.clear()


def write_episodes(
    episodes: Iterable[Mapping[str, np.ndarray]],
    destination: str | os.PathLike[str] | Location,
    source: Mapping[str, Any],
    *,
    total: int | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    codecs: Mapping[str, Any] | None = None,
) -> Documents:
    """Write each episode as one ``[T, 1, ...]`` trajectory of a new zarr store, its keys
    encoded with ``codecs`` (``{key: spec}``, as ``layout_options={"codecs": ...}``).

    Trajectories are written on :data:`_WRITERS` threads while the next episodes are read,
    and the documents are written once, last, so a store appears only when every episode
    is in.  If an episode fails (bad data, a backend error), what was written is removed
    and the error propagates: ``destination`` is left as it was.  ``source`` is recorded
    in the metadata under :data:`SOURCE_KEY`.
    """
    location = Location.from_url(destination, destination_options)
    layout = ZarrLayout(location, codecs=codecs)
    if layout.has_documents() or layout.list_ids():
        raise StoreExistsError(
            f"{location.url} already holds a store; import writes only to a new location"
        )
    existed = location.exists()
    index = TrajectoryIndex()
    writes = _Writes(layout)
    try:
        for episode in tqdm(
            episodes, desc="import", unit="episode", total=total, disable=not progress
        ):
            fields = _trajectory_fields(episode)
            rows = len(next(iter(episode.values())))
            entry = index.new_entry((rows, 1), rows, "")
            size = sum(int(rows.nbytes) for rows in episode.values())
            trajectory = trajectory_from_raw(fields, rows, "")
            layout.check_writable(trajectory)  # a codec for no key, or one that cannot encode
            writes.submit(entry, trajectory, size)
        writes.finish()
        documents = index.to_documents("zarr", extra={SOURCE_KEY: dict(source)})
        return layout.write_documents(documents)
    except BaseException:
        writes.abandon()
        if existed:
            for trajectory_id in index.id_list:
                layout.delete(index.entries[trajectory_id])
        else:
            location.delete()
        raise


@dataclass(frozen=True)
class StoredEpisode:
    """One episode of one env column, as numpy rows without the env dimension.

    ``trajectory_id`` is the trajectory it starts in; ``done`` says whether it ended.
    """

    trajectory_id: int
    column: int
    fields: dict[str, np.ndarray]
    done: bool = True


def _without_reset_rows(key: str, rows: np.ndarray, steps: int) -> np.ndarray:
    """``rows`` minus the reset row leading each rollout epoch (reset-row fields only)."""
    if key not in RESET_ROW_FIELDS or len(rows) == steps:
        return rows
    epochs = len(rows) - steps
    per_epoch = steps // epochs + 1
    keep = np.ones(len(rows), dtype=bool)
    keep[::per_epoch] = False
    return rows[keep]


def _segments(
    dones: np.ndarray | None, steps: int, columns: int
) -> list[tuple[int, int, int, bool]]:
    """``(column, start, end, ended)`` of each episode piece of a ``[T, B, ...]`` trajectory."""
    if dones is None:
        return [(column, 0, steps, False) for column in range(columns)]
    ended = (dones.reshape(steps, columns, -1) != 0).any(axis=-1)
    pieces = []
    for column in range(columns):
        start = 0
        for end in np.flatnonzero(ended[:, column]).tolist():
            pieces.append((column, start, end + 1, True))
            start = end + 1
        if start < steps:
            pieces.append((column, start, steps, False))
    return pieces


@dataclass
class StoreEpisodes:
    """A store's episodes, cut at ``dones`` and followed across consecutive trajectories.

    Iterating reads one trajectory at a time.  An episode still running where its run of
    trajectories ends is incomplete: it is handed out only with ``include_incomplete``, and
    :attr:`left_out` counts those skipped so far.  Without ``dones`` no episode ends.  A
    store an import wrote (its metadata has :data:`SOURCE_KEY`) holds one whole episode per
    trajectory, whatever its ``dones`` say (robomimic's mark success, not the end).
    """

    reader: Any
    documents: Documents
    index: TrajectoryIndex
    include_incomplete: bool = False
    left_out: int = 0

    def __iter__(self) -> Iterator[StoredEpisode]:
        open_pieces: dict[int, tuple[int, list[dict[str, np.ndarray]]]] = {}
        ids = self.index.id_list
        for position, trajectory_id in enumerate(ids):
            entry = self.index.entries[trajectory_id]
            following = self.index.entries[ids[position + 1]] if position + 1 < len(ids) else None
            run_continues = following is not None and continues(entry, following)
            carried, open_pieces = open_pieces, {}
            for column, start, done, fields in self._pieces(entry):
                held = carried.pop(column, None) if start == 0 else None
                first, pieces = held if held is not None else (trajectory_id, [])
                pieces.append(fields)
                if done or not run_continues:
                    yield from self._close(first, column, pieces, done)
                else:
                    open_pieces[column] = (first, pieces)
            for column, (first, pieces) in carried.items():
                yield from self._close(first, column, pieces, False)

    def _pieces(
        self, entry: Mapping[str, Any]
    ) -> Iterator[tuple[int, int, bool, dict[str, np.ndarray]]]:
        """The episode pieces of one trajectory, with their fields' rows."""
        steps, columns = int(entry["shape"][0]), int(entry["shape"][1])
        tensors = self.reader.read(entry).tensors()
        arrays = {
            key: _without_reset_rows(key, to_numpy(value), steps)
            for key, value in tensors.items()
            if value.dim() >= 2
        }
        if SOURCE_KEY in self.documents.metadata:
            pieces = [(column, 0, steps, True) for column in range(columns)]
        else:
            pieces = _segments(arrays.get(DONES), steps, columns)
        for column, start, end, done in pieces:
            fields = {key: rows[start:end, column] for key, rows in arrays.items()}
            yield column, start, done, fields

    def _close(
        self, first: int, column: int, pieces: list[dict[str, np.ndarray]], done: bool
    ) -> Iterator[StoredEpisode]:
        if not done and not self.include_incomplete:
            self.left_out += 1
            return
        fields = (
            pieces[0]
            if len(pieces) == 1
            else {key: np.concatenate([piece[key] for piece in pieces]) for key in pieces[0]}
        )
        yield StoredEpisode(first, column, fields, done)


def read_episodes(
    source: str | os.PathLike[str] | Location,
    storage_options: Mapping[str, Any] | None = None,
    *,
    include_incomplete: bool = False,
) -> StoreEpisodes:
    """The source's episodes (see :class:`StoreEpisodes`); reset rows are left out."""
    reader, documents = open_store(source, storage_options)
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    return StoreEpisodes(reader, documents, index, include_incomplete)
