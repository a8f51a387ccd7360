"""CommitNotice: what a writer sends a learner once a trajectory is committed (not its bytes).

A notice names the store and carries the trajectory's index entry (id, uuid, shape, sample
count, ``max_episode_length``, ``model_weights_id``): a few hundred bytes whatever the
trajectory's size.  The writer slot is the id's (``id // ID_STRIDE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CheckpointNotFoundError
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.index.slots import ID_STRIDE

if TYPE_CHECKING:
    from rbzarr.buffer.buffer import TrajectoryReplayBuffer

__all__ = ["CommitNotice", "commit_notices"]


@dataclass(frozen=True)
class CommitNotice:
    """One committed trajectory of a shared store, by reference.

    Parameters
    ----------
    store
        The store's URL, as the writer's buffer names it (``store_url``).
    entry
        The trajectory's index entry (JSON-ready values).
    """

    store: str
    entry: Mapping[str, Any]

    @property
    def trajectory_id(self) -> int:
        """The trajectory's id in the store."""
        return int(self.entry["trajectory_id"])

    @property
    def writer(self) -> int:
        """The writer slot that committed it."""
        return self.trajectory_id // ID_STRIDE

    @property
    def shape(self) -> list[int]:
        """``[T, B]`` of its reference field."""
        return [int(d) for d in self.entry["shape"]]


def commit_notices(
    buffer: TrajectoryReplayBuffer, trajectory_ids: Iterable[int]
) -> list[CommitNotice]:
    """Notices of trajectories ``buffer`` has committed to its auto-save store.

    Call after ``buffer.flush()``: a notice must only be sent for committed data.

    Parameters
    ----------
    buffer
        An ``auto_save`` buffer (a writer of the shared store).
    trajectory_ids
        Ids in ``buffer``'s index.

    Returns
    -------
    list of CommitNotice
        One per id, in the order given.

    Raises
    ------
    ValueError
        ``buffer`` has no auto-save store.
    CheckpointNotFoundError
        An id is not in ``buffer``'s index, or is not committed yet.
    """
    store = buffer.store_url
    if store is None:
        raise ValueError("commit notices need an auto_save buffer (its store is the transport)")
    entries = buffer.index_entries
    committed = buffer.get_stats()["pending_writes"] == 0
    notices = []
    for trajectory_id in trajectory_ids:
        if trajectory_id not in entries or not committed:
            raise CheckpointNotFoundError(
                f"{store}: trajectory {trajectory_id} is not committed by this buffer; call "
                "flush() before sending its notice"
            )
        entry = entries[trajectory_id]
        notices.append(CommitNotice(store, IndexEntry.parse(entry, store).to_json()))
    return notices
