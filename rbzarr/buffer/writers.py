"""WriterSlot: which slot of a shared store this buffer writes, and how it commits there.

See :mod:`rbzarr.storage.writers` for the format.  A zarr buffer takes the lowest free
slot (0 if no other writer is running, so a lone writer writes exactly what it always
has); a pt / pkl buffer (RLinf's format, one writer) takes slot 0 or is refused.  The slot
is held until the buffer closes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

from rbzarr.errors import StoreExistsError
from rbzarr.storage import documents as store_documents
from rbzarr.storage.claims import SlotClaim
from rbzarr.storage.documents import Documents
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.writers import COMMIT_TIMES, WRITERS, id_range, read_slot_documents
from rbzarr.storage.writers import slot_location as documents_location

__all__ = ["WriterSlot"]

# Slots tried before giving up (killed writers on an object store keep theirs).
MAX_SLOTS = 4096


class WriterSlot:
    """The slot a buffer holds in its auto-save store: its ids, its documents, its claim."""

    def __init__(self, layout: TrajectoryLayout, claim: SlotClaim) -> None:
        self.layout = layout
        self._claim = claim
        self.first_id, self.end_id = id_range(claim.slot)

    @classmethod
    def claim(cls, layout: TrajectoryLayout) -> WriterSlot:
        """Claim the lowest free slot of ``layout``'s store (only slot 0 for pt / pkl)."""
        location = layout.location
        if not layout.supports_many_writers:
            claim = SlotClaim.acquire(location, 0)
            if claim is None:
                raise StoreExistsError(
                    f"auto_save_path {location.url} is being written by another buffer: a "
                    f"{layout.format!r} store (RLinf's format) takes one writer at a time. "
                    "Close the other buffer, give each writer its own auto_save_path, or use "
                    "trajectory_format='zarr', which takes many writers"
                    + _stale_claim_advice(location.is_local, f"{location.url}/{WRITERS}/0")
                )
            return cls(layout, claim)
        for slot in itertools.islice(itertools.count(), MAX_SLOTS):
            claim = SlotClaim.acquire(location, slot)
            if claim is not None:
                return cls(layout, claim)
        raise StoreExistsError(
            f"auto_save_path {location.url}: all {MAX_SLOTS} writer slots are claimed"
            + _stale_claim_advice(location.is_local, f"{location.url}/{WRITERS}/<slot>")
        )

    @property
    def slot(self) -> int:
        """The slot number (0: the root documents)."""
        return self._claim.slot

    def owns(self, trajectory_id: int) -> bool:
        """Whether ``trajectory_id`` is in this slot's id range."""
        return self.first_id <= trajectory_id < self.end_id

    def has_documents(self) -> bool:
        """Whether this slot has committed documents already."""
        where = documents_location(self.layout.location, self.slot)
        return store_documents.documents_exist(where)

    def read_documents(self) -> Documents | None:
        """This slot's own documents, or ``None`` before its first commit."""
        return read_slot_documents(self.layout.location, self.slot)

    def write_documents(self, documents: Documents, commit_times: Mapping[int, float]) -> None:
        """Commit this slot's documents (slot 0 through the layout, as a lone writer does)."""
        if self.slot == 0:
            self.layout.write_documents(documents)
            return
        index = {
            **documents.trajectory_index,
            COMMIT_TIMES: {
                str(i): commit_times.get(i, time.time())
                for i in documents.trajectory_index["trajectory_id_list"]
            },
        }
        store_documents.write_documents(
            documents_location(self.layout.location, self.slot),
            Documents(documents.metadata, index),
        )

    def release(self) -> None:
        """Give the slot up, for the next writer to continue."""
        self._claim.release()


def _stale_claim_advice(local: bool, where: str) -> str:
    """What to do when the claim may be a killed writer's (only on object stores)."""
    if local:
        return ""
    return f". If no writer is running (one was killed), delete {where}/claim and retry"
