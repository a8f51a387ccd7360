"""The storage seam: the abstract methods every on-disk layout implements.

A layout stores whole trajectories under a :class:`~rbzarr.storage.location.Location`: it
writes, reads, deletes and lists them, and names where each one's data lives.  These six
methods are all a new layout must write; :class:`~rbzarr.storage.layout.TrajectoryLayout`
derives everything else from them once (row reads, copies, describing and checking), and
:class:`~rbzarr.storage.documents.StoreDocuments` adds the two JSON documents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from rbzarr.storage.documents import Entry, StoreDocuments
from rbzarr.trajectory.model import Trajectory

if TYPE_CHECKING:
    from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["LayoutCore"]


class LayoutCore(StoreDocuments, ABC):
    """What a layout implements: how trajectories are written, read, deleted and found.

    Subclasses implement :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`list_ids`,
    :meth:`trajectory_path` and :meth:`stored_paths`, and name their ``format``.

    Parameters
    ----------
    location
        The store's root.
    """

    format: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.url!r})"

    # -- trajectories -------------------------------------------------------------------
    @abstractmethod
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Write every tensor of ``trajectory`` (raw rows; validated unless it is a
        :class:`~rbzarr.trajectory.validated.ValidatedTrajectory`) under ``entry['trajectory_id']``.

        When this returns, the data is complete; an existing trajectory with the same id is
        replaced.  It does not touch the JSON documents (see :meth:`write_documents`).

        Parameters
        ----------
        entry
            The trajectory's index entry (its ``trajectory_id`` names where data goes).
        trajectory
            The trajectory, raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        InvalidTrajectoryError
            ``trajectory`` is not a valid trajectory.
        UnsafePathError
            The entry would name a path outside the root.
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        """Read a whole trajectory (raw rows), optionally only the flat ``keys`` given.

        Parameters
        ----------
        entry
            The trajectory's index entry.
        keys
            Flat keys to read (``"curr_obs/image"``), or ``None`` for every field.

        Returns
        -------
        Trajectory
            Raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing (named in the message).
        CorruptStoreError
            The data is damaged or lacks a key.
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    def delete(self, entry: Entry) -> None:
        """Remove a trajectory's data; missing data is not an error.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    def list_ids(self) -> list[int]:
        """Ids of the trajectories that have data here (committed or not), sorted.

        Returns
        -------
        list of int
            The ids, whatever the index lists.
        """

    @abstractmethod
    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        """Names (below the root) of the file or directory holding one trajectory.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        tuple of str
            The path's parts, each a plain name.

        Raises
        ------
        UnsafePathError
            The entry would name a path outside the root.
        """

    @abstractmethod
    def stored_paths(self) -> dict[str, int]:
        """Every trajectory's data present here, indexed or not: ``{path: trajectory_id}``.

        Returns
        -------
        dict
            ``{path: trajectory_id}``, paths ``/``-joined below the root as
            :meth:`trajectory_path` names them.
        """
