"""WriterSlot: which slot of a shared store this buffer writes, and how it commits there.

See :mod:`rbzarr.storage.index.slots` for the format.  A zarr buffer takes the lowest free
slot (0 if no other writer is running, so a lone writer writes exactly what it always
has); a pt / pkl buffer (RLinf's format, one writer) takes slot 0 or is refused.  The slot
is held until the buffer closes.
"""

from __future__ import annotations

import itertools

from rbzarr.errors import StoreExistsError
from rbzarr.storage.index import format_records
from rbzarr.storage.index.claims import SlotClaim
from rbzarr.storage.index.log import IndexLog
from rbzarr.storage.index.slots import (
    WRITERS,
    DocumentSlotFiles,
    id_range,
    log_of_documents,
    read_slot_documents,
    slot_has_documents,
)
from rbzarr.storage.index.slots import slot_location as documents_location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf import documents as store_documents
from rbzarr.storage.rlinf.documents import Documents

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
        if not layout.capabilities.many_writers:
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
        """Whether this slot has committed anything already."""
        return slot_has_documents(self.layout.location, self.slot)

    def read_documents(self) -> Documents | None:
        """This slot's own documents, or ``None`` before its first commit."""
        return read_slot_documents(self.layout.location, self.slot)

    def open_log(self) -> IndexLog:
        """This slot's index log; a slot committed by an earlier rbzarr (documents, no log)
        is upgraded in place: its index becomes the log's first segments, no data moves."""
        where = documents_location(self.layout.location, self.slot)
        log = IndexLog(where)
        documents = DocumentSlotFiles(where).own() if log.is_empty() else None
        if documents is not None:
            index = dict(documents.trajectory_index)
            ids = index.get("trajectory_id_list")
            if "rbzarr_format_version" not in documents.metadata and isinstance(ids, list):
                # RLinf lists ids it never saved: the log lists only what exists.
                present = set(self.layout.list_ids())
                index["trajectory_id_list"] = [i for i in ids if i in present]
            kept = Documents(documents.metadata, index)
            listed, metadata = log_of_documents(documents, kept, where.url)
            counter = max(
                int(documents.metadata.get("trajectory_counter", 0)),
                max((int(i) for i in kept.trajectory_index["trajectory_id_list"]), default=-1) + 1,
            )
            log.rewrite(listed, counter=counter, metadata=metadata)
        return log

    def first_unused_id(self, counter: int) -> int:
        """The first id from ``counter`` up that no data in the store has (a crash may leave
        a trajectory written but never listed); probes ids, never lists the store."""
        while self.owns(counter) and self.layout.location.exists(
            *self.layout.trajectory_path({"trajectory_id": counter, "model_weights_id": ""})
        ):
            counter += 1
        if self.layout.capabilities.many_writers:
            return counter
        # pt / pkl file names hold model_weights_id: only a listing finds them.
        stored = [i for i in self.layout.list_ids() if self.owns(i)]
        return max(counter, max(stored, default=-1) + 1)

    def write_documents(self, documents: Documents) -> None:
        """Rewrite this slot's two documents whole (slot 0 through the layout, as a lone
        writer does)."""
        if self.slot == 0:
            format_records.write_documents(self.layout, documents)
            return
        store_documents.write_documents(
            documents_location(self.layout.location, self.slot), documents
        )

    def release(self) -> None:
        """Give the slot up, for the next writer to continue."""
        self._claim.release()


def _stale_claim_advice(local: bool, where: str) -> str:
    """What to do when the claim may be a killed writer's (only on object stores)."""
    if local:
        return ""
    return f". If no writer is running (one was killed), delete {where}/claim and retry"
