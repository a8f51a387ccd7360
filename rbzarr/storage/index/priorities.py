"""Priority files: the raw priorities of a trajectory's rows, stored beside its data.

One file per trajectory, ``priorities/<trajectory_id>.f32`` below the store's root: the
8-byte marker :data:`MARKER` then ``num_samples`` little-endian float32, in flat row order
(``t * B + b``).  A file is written whole and atomically (a temporary file renamed locally,
one PUT on an object store), so a crash leaves the previous version or the new one.  A
trajectory without a file has no stored priorities (its rows enter at the largest
priority).  Reading costs one file per trajectory asked for (the window's), never the
store's.  The files are untrusted input: a wrong marker or length, or a value that is not a
finite float ``>= 0``, is a :class:`~rbzarr.errors.CorruptStoreError` naming the file.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Entry

__all__ = ["FOLDER", "MARKER", "PriorityFiles"]

FOLDER = "priorities"
MARKER = b"RBZPRI\x00\x01"


def _name(trajectory_id: int) -> str:
    return f"{int(trajectory_id)}.f32"


class PriorityFiles:
    """The priority files of the store at ``location``.

    Parameters
    ----------
    location
        The store's root.
    """

    def __init__(self, location: Location) -> None:
        self.location = location

    def write(self, trajectory_id: int, values: np.ndarray) -> None:
        """Write one trajectory's priorities (float32, one per flat row), atomically."""
        data = MARKER + np.ascontiguousarray(values, dtype="<f4").tobytes()
        self.location.write_bytes(data, FOLDER, _name(trajectory_id))

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
            raw = self.location.read_bytes(FOLDER, _name(trajectory_id))
        except FileNotFoundError:
            return None
        where = f"{self.location.url}/{FOLDER}/{_name(trajectory_id)}"
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

    def read_all(self, entries: Iterable[Entry]) -> dict[int, np.ndarray]:
        """The stored priorities of those of ``entries`` that have them, by id."""
        found = {}
        for entry in entries:
            values = self.read(entry)
            if values is not None:
                found[int(entry["trajectory_id"])] = values
        return found
