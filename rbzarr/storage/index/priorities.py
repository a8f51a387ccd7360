"""Priority files: the raw priorities of a trajectory's rows, stored beside its data.

One file per trajectory, ``priorities/<trajectory_id>.f32`` below the store's root: the
8-byte marker :data:`MARKER` then ``num_samples`` little-endian float32, in flat row order
(``t * B + b``).  A file is written whole and atomically (a temporary file renamed locally,
one PUT on an object store), so a crash leaves the previous version or the new one.  A
trajectory without a file has no stored priorities (its rows enter at the largest
priority).  Reading costs one file per trajectory asked for (the window's), never the
store's.  The files are untrusted input: a wrong marker or length, or a value that is not a
finite float ``>= 0``, is a :class:`~rbzarr.errors.CorruptStoreError` naming the file.

:class:`PriorityChanges` is the store's *change record*, ``priorities/changes.json``: after
each flush's files are written, the writer rewrites it with the ids each of its last flushes
wrote (``{"writer": token, "flush": n, "flushes": [[n, [ids...]], ...]}``, bounded).  A
reader that read the priorities at flush ``m`` of the same writer reads the record and then
only the files of the ids flushed after ``m``: one file plus one per trajectory changed,
whatever the window.  The record is a hint: when it is missing, damaged, of another writer
or too short to reach back to ``m``, the reader reads every file it needs (never a stale
value for a listed change: the files are written before the record lists them).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Collection, Iterable

import numpy as np

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.store_files import StoreFiles
from rbzarr.storage.rlinf.documents import Entry

__all__ = ["CHANGES", "FOLDER", "MARKER", "PriorityChanges", "PriorityFiles", "file_name"]

FOLDER = "priorities"
MARKER = b"RBZPRI\x00\x01"
CHANGES = "changes.json"
# The change record keeps the last flushes up to this many ids (at least the newest flush).
HISTORY_IDS = 65536


def file_name(trajectory_id: int) -> str:
    """The name of a trajectory's priority file in :data:`FOLDER`."""
    return f"{int(trajectory_id)}.f32"


class PriorityFiles(StoreFiles):
    """The priority files of the store at ``location``."""

    def write(self, trajectory_id: int, values: np.ndarray) -> None:
        """Write one trajectory's priorities (float32, one per flat row), atomically."""
        data = MARKER + np.ascontiguousarray(values, dtype="<f4").tobytes()
        self.location.write_bytes(data, FOLDER, file_name(trajectory_id))

    def read(self, entry: Entry) -> np.ndarray | None:
        """The stored priorities of one trajectory (float32); ``None`` when it has no file.

        Raises
        ------
        CorruptStoreError
            The file is not a priority file of this trajectory's rows.
        """
        trajectory_id = int(entry["trajectory_id"])
        rows = int(entry["num_samples"])
        try:
            raw = self.location.read_bytes(FOLDER, file_name(trajectory_id))
        except FileNotFoundError:
            return None
        where = f"{self.location.url}/{FOLDER}/{file_name(trajectory_id)}"
        if raw[: len(MARKER)] != MARKER or len(raw) != len(MARKER) + 4 * rows:
            raise CorruptStoreError(
                f"{where}: not the priorities of trajectory {trajectory_id} ({rows} rows: "
                f"{len(MARKER) + 4 * rows} bytes with the marker), {len(raw)} bytes found; "
                "delete the file to give its rows the largest priority"
            )
        values = np.frombuffer(raw, dtype="<f4", offset=len(MARKER)).astype(np.float32)
        if not np.isfinite(values).all() or (values < 0).any():
            raise CorruptStoreError(
                f"{where}: priorities must be finite and >= 0; delete the file to give its "
                "rows the largest priority"
            )
        return values

    def delete(self, trajectory_id: int) -> None:
        """Remove one trajectory's file (its rows take the largest priority); none is fine."""
        self.location.delete(FOLDER, file_name(trajectory_id))

    def carry(self, target: PriorityFiles, pairs: Iterable[tuple[Entry, Entry]]) -> int:
        """Copy the stored priorities of each ``(entry here, entry in target)`` pair to
        ``target`` (the same rows, under the target entry's id, which may differ); how many
        were carried.  Each file is checked as :meth:`read` checks it on its way.

        Raises
        ------
        CorruptStoreError
            A file here is damaged (nothing later is carried).
        """
        carried = 0
        for entry, target_entry in pairs:
            values = self.read(entry)
            if values is not None:
                target.write(int(target_entry["trajectory_id"]), values)
                carried += 1
        return carried

    def read_all(self, entries: Iterable[Entry]) -> dict[int, np.ndarray]:
        """The stored priorities of those of ``entries`` that have them, by id."""
        found = {}
        for entry in entries:
            values = self.read(entry)
            if values is not None:
                found[int(entry["trajectory_id"])] = values
        return found


class PriorityChanges(StoreFiles):
    """The change record of the store at ``location``: written by its one priority writer,
    read by views to re-read only the priority files changed since their last read."""

    def __init__(self, location: Location) -> None:
        super().__init__(location)
        self._writer = uuid.uuid4().hex  # a new writer: readers of an old one read all
        self._flushes: list[tuple[int, list[int]]] = []
        self.unrecorded: set[int] = set()  # written, their record not yet
        self._recording = threading.Lock()  # flushes on two threads: one number each
        self._seen: tuple[str, int] | None = None  # (writer, flush) a reader has read
        self._reading: tuple[str, int] | None = None  # what changed() last found

    def record(self, ids: Collection[int]) -> None:
        """After a flush wrote the files of ``ids``: list them (and those a failed record
        left) as that flush's changes.  If this write fails they stay to be recorded."""
        with self._recording:
            self.unrecorded.update(int(i) for i in ids)
            number = self._flushes[-1][0] + 1 if self._flushes else 1
            flushes = [*self._flushes, (number, sorted(self.unrecorded))]
            while len(flushes) > 1 and sum(len(f[1]) for f in flushes) > HISTORY_IDS:
                flushes.pop(0)
            document = {"writer": self._writer, "flush": number, "flushes": flushes}
            self.location.write_bytes(json.dumps(document).encode(), FOLDER, CHANGES)
            self._flushes, self.unrecorded = flushes, set()

    def changed(self) -> set[int] | None:
        """The ids flushed since this reader's last :meth:`read` (``None``: unknown, read
        them all).

        The first call, a record of another writer or one that no longer reaches back
        answers ``None``; a store without a record has no change to tell.  Nothing counts
        as read until :meth:`read` says so (a failed read of the files asks again).
        """
        seen = self._seen
        try:
            raw = self.location.read_bytes(FOLDER, CHANGES)
        except FileNotFoundError:
            self._reading = ("", 0)
            return None if seen is None else set()
        document = self._parse(raw)
        self._reading = None if document is None else document[:2]
        if document is None:
            return None
        writer, number, flushes = document
        if seen is None or seen[0] != writer or seen[1] > number:
            return None
        if seen[1] == number:
            return set()
        if not flushes or flushes[0][0] > seen[1] + 1:
            return None
        return {i for n, ids in flushes if n > seen[1] for i in ids}

    def read(self) -> None:
        """The files :meth:`changed` named were read: the next call counts from there."""
        self._seen = self._reading

    def _parse(self, raw: bytes) -> tuple[str, int, list[tuple[int, list[int]]]] | None:
        """The record's writer, flush and flushes; ``None`` when it is not a change record."""
        try:
            document = read_json(raw, f"{self.location.url}/{FOLDER}/{CHANGES}")
            writer, number = document["writer"], document["flush"]
            flushes = [(n, list(ids)) for n, ids in document["flushes"]]
        except (CorruptStoreError, KeyError, TypeError, ValueError):
            return None
        numbers = [n for n, _ in flushes]
        if (
            not isinstance(writer, str)
            or not _whole(number)
            or not all(_whole(n) for n in numbers)
            or not all(_whole(i) for _, ids in flushes for i in ids)
        ):
            return None
        return writer, number, flushes


def _whole(value: object) -> bool:
    """``value`` is an int ``>= 0`` (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
