"""SlotCollector: a writer's collection of its own slot as it appends (``retention=``).

After each burst of commits the writer thread asks its slot's collector whether the slot
holds more than its :class:`~rbzarr.storage.index.retention.Retention` keeps (from memory:
no storage call).  When it does, by an eighth, the collector removes the oldest
trajectories beyond it that no checkpoint pins and that are not in the buffer's sample
window, in this order:

1. ``gc/<run-id>.json`` records the ids, the slot and the time (``"state": "intent"``);
2. the slot's index log is rewritten without them (new files first, then the head): from
   here on no reader lists them -- the deletion's record in the log;
3. the buffer drops them from its index (its counters count what is left);
4. once ``grace`` seconds have passed (checked at each burst and at close), their data and
   priority files are deleted, then the record.

A collection only ever touches its own slot's log and its own slot's ids: other writers
append meanwhile to their slots, untouched.  A storage failure at any step leaves the store
readable and the collection due: the next burst retries it.  A crash leaves the record;
the slot's next writer (at its first collection), ``rbzarr gc`` or ``rbzarr verify
--repair`` (data no index lists) finishes it.  The cost of a collection is the slot's
size (its log is rewritten), paid once per eighth of it: per removed trajectory it does
not grow with what the store ever held.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rbzarr.storage.index.gc_records import CollectionRecord, delete_data, open_records
from rbzarr.storage.index.log import IndexLog
from rbzarr.storage.index.pins import StorePins
from rbzarr.storage.index.retention import Retention
from rbzarr.storage.layout import TrajectoryLayout

__all__ = ["SlotCollector"]


class SlotCollector:
    """What one writer slot keeps: its trajectories in order (with their bytes, when a bound
    by bytes asks), and the collections whose data waits for its grace period.

    Parameters
    ----------
    layout
        The store's layout (its data is deleted through it).
    slot
        The writer's slot.
    retention
        What to keep.
    """

    def __init__(
        self,
        layout: TrajectoryLayout,
        slot: int,
        retention: Retention,
    ) -> None:
        self.layout = layout
        self.slot = slot
        self.retention = retention
        self._sizes: dict[int, int] | None = None  # the slot's ids, oldest first: bytes
        self._held = (0, 0)  # count and bytes beyond retention it could not remove
        self._waiting: list[CollectionRecord] | None = None  # removed, data not deleted yet

    def noted(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """The writer listed ``entries`` (their data complete)."""
        if self._sizes is None:
            return  # read whole at the first collection
        for entry in entries:
            self._sizes[int(entry["trajectory_id"])] = self._bytes(entry)

    def is_due(self, log: IndexLog) -> bool:
        """Whether a collection is due, or data waits whose grace period is over."""
        if self._waiting is None:
            return True  # open records of an earlier writer of the slot: adopt them first
        now = time.time()
        if any(now - record.at >= self.retention.grace for record in self._waiting):
            return True
        count = log.size - self._held[0]
        total = 0 if self._sizes is None else sum(self._sizes.values()) - self._held[1]
        return self.retention.is_due(count, total)

    def collect(self, log: IndexLog, protected: Collection[int]) -> list[int]:
        """Remove from ``log`` what falls outside retention, except pinned ids and
        ``protected`` (the buffer's window); the ids removed (with, at the first call, those
        of the slot's open records, which the log no longer lists).  Steps 1-2 of the
        module docs.

        Raises
        ------
        StorageUnavailableError
            A storage call failed: the store reads as before the failed step.
        """
        adopted: list[int] = []
        if self._waiting is None:
            self._waiting = self._adopt(log)
            adopted = [i for record in self._waiting for i in record.ids]
        if self._sizes is None:
            self._sizes = {int(e["trajectory_id"]): self._bytes(e) for e, _ in log.read().entries}
        ids = list(self._sizes)
        sizes = list(self._sizes.values())
        count, total = len(ids), sum(sizes)
        if not self.retention.is_due(count - self._held[0], total - self._held[1]):
            return adopted
        outside = ids[: count - self.retention.keeps(sizes)]
        pinned = {i for pin in StorePins(self.layout.location).all() for i in pin.ids}
        removed = [i for i in outside if i not in pinned and i not in protected]
        if removed:
            record = CollectionRecord.new(self.layout.location, removed, self.slot)
            record.write("intent")
            gone = set(removed)
            kept = [(e, t) for e, t in log.read().entries if int(e["trajectory_id"]) not in gone]
            log.rewrite(kept, counter=log.trajectory_counter, metadata=log.metadata)
            self._waiting.append(record)
            for trajectory_id in removed:
                self._sizes.pop(trajectory_id, None)
        left = [self._sizes[i] for i in outside if i in self._sizes]
        over = sum(self._sizes.values()) - (self.retention.max_bytes or 0)
        self._held = (len(left), max(over, 0) if self.retention.max_bytes else 0)
        return adopted + removed

    def delete_expired(self) -> None:
        """Delete the data of the collections whose grace period is over, then their
        records.  Step 4 of the module docs.

        Raises
        ------
        StorageUnavailableError
            A delete failed: the rest waits for the next call.
        """
        now = time.time()
        while self._waiting and now - self._waiting[0].at >= self.retention.grace:
            record = self._waiting[0]
            delete_data(self.layout, record.ids)
            record.remove()
            self._waiting.pop(0)

    def forget(self) -> None:
        """After a failed step: read the slot's ids and open records again at the next
        collection (a write whose reply was lost may have happened)."""
        self._sizes = None
        self._waiting = None

    def _adopt(self, log: IndexLog) -> list[CollectionRecord]:
        """The open records of this slot (an earlier writer's, crashed or closed within its
        grace period), without the ids the log still lists (a record whose rewrite failed)."""
        mine = [r for r in open_records(self.layout.location) if r.slot == self.slot]
        if not mine:
            return []
        listed = {int(e["trajectory_id"]) for e, _ in log.read().entries}
        return [
            CollectionRecord(
                r.location, r.run_id, [i for i in r.ids if i not in listed], r.slot, r.at
            )
            for r in mine
        ]

    def _bytes(self, entry: Mapping[str, Any]) -> int:
        """A trajectory's stored bytes (one listing), 0 without a bound by bytes."""
        if self.retention.max_bytes is None:
            return 0
        entry = {"model_weights_id": "", **entry}
        return self.layout.stored_bytes(entry)
