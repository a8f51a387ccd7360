"""Garbage collection of a zarr store (``rbzarr gc``): delete what nothing keeps, offline.

A collection keeps the store's last ``keep_last`` trajectories (in the order readers list
them) and every trajectory a checkpoint pins (:mod:`rbzarr.storage.index.pins`); it deletes
the others.  It runs offline: it claims every writer slot first, so no buffer writes the
store meanwhile (a live writer makes it refuse, nothing changed).  Readers are not
registered: run it while none samples the store, or give readers ``on_damaged="skip"``
(a trajectory deleted under one is dropped and the batch drawn again).

The deletion is recorded before any data goes:

1. ``gc/<run-id>.json`` records the ids (``"state": "intent"``);
2. each writer slot's index log is rewritten without them (:meth:`IndexLog.rewrite`: the
   new files first, then the head), so readers stop listing them;
3. their data and priority files are deleted;
4. the record is marked ``"done"``.

A crash at any step leaves a readable store: before step 2 nothing changed; after it, data
no index lists is an orphan that ``rbzarr verify --repair`` (or the next collection, which
finishes every open record first, a buffer's ``retention`` left within its grace period
included) deletes.  Counters keep their meaning: the id counter
never goes back (an id is never reused); ``size`` and ``total_samples`` count what the
index still lists, as after a load of the kept trajectories.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from rbzarr.errors import CheckpointConflictError, CheckpointNotFoundError
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.claims import SlotClaim
from rbzarr.storage.index.gc_records import CollectionRecord, delete_data, open_records
from rbzarr.storage.index.slots import (
    LogSlotFiles,
    slot_files,
    slot_has_documents,
    slot_location,
    writer_slots,
)
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class

__all__ = ["CollectionPlan", "collect_store"]


@dataclass
class CollectionPlan:
    """What a collection deletes and keeps.

    Parameters
    ----------
    url
        The store.
    keep_last
        Trajectories kept from the end of the store's list.
    deleted
        The ids deleted (or, in a dry run, to delete), in list order.
    pinned
        Ids outside ``keep_last`` kept because a checkpoint pins them.
    kept
        Trajectories the store lists afterwards.
    finished
        Ids of earlier interrupted collections whose data this one deleted.
    """

    url: str
    keep_last: int
    deleted: list[int] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)
    kept: int = 0
    finished: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def collect_store(
    url: str | Location,
    keep_last: int,
    storage_options: Mapping[str, Any] | None = None,
    *,
    dry_run: bool = False,
) -> CollectionPlan:
    """Delete the trajectories of the zarr store at ``url`` outside its last ``keep_last``
    that no checkpoint pins (see the module docs); ``dry_run`` only plans.

    Raises
    ------
    ValueError
        ``keep_last`` is negative.
    CheckpointNotFoundError
        No store is at ``url``.
    CheckpointConflictError
        A buffer writes the store (a writer slot is claimed), or it is not a zarr store
        whose writers keep their index as a log.
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last must be a whole number >= 0, got {keep_last!r}")
    location = Location.from_url(url, storage_options).without_links()
    slots = [s for s in [0, *writer_slots(location)] if slot_has_documents(location, s)]
    if not slots:
        raise CheckpointNotFoundError(f"gc: {location.url}: {location.absence()}")
    unlogged = [s for s in slots if not isinstance(slot_files(location, s), LogSlotFiles)]
    if unlogged:
        raise CheckpointConflictError(
            f"gc: {location.url}: writer slots {unlogged} keep RLinf's documents, not an "
            "index log (a pt / pkl store, or one no rbzarr writer opened since): gc "
            "collects zarr stores only; a zarr store's index becomes a log when a buffer "
            "opens it"
        )
    layout = layout_class("zarr")(location)
    catalog = StoreIndex.assumed(location)
    with _claimed(location, slots):
        plan = CollectionPlan(location.url, keep_last)
        plan.finished = _finish_open_records(catalog, layout, dry_run)
        listed = catalog.read().trajectory_index["trajectory_id_list"]
        outside = listed[: max(len(listed) - keep_last, 0)]
        pinned = {i for pin in catalog.pins.all() for i in pin.ids}
        plan.pinned = [i for i in outside if i in pinned]
        plan.deleted = [i for i in outside if i not in pinned]
        plan.kept = len(listed) - len(plan.deleted)
        if dry_run or not plan.deleted:
            return plan
        record = CollectionRecord.new(location, plan.deleted)
        record.write("intent")
        gone = set(plan.deleted)
        for slot in slots:
            _drop_from_log(slot_location(location, slot), gone)
        delete_data(layout, plan.deleted)
        record.write("done")
        return plan


@contextmanager
def _claimed(location: Location, slots: list[int]) -> Iterator[None]:
    """Hold every writer slot's claim (none may write meanwhile), or refuse."""
    held: list[SlotClaim] = []
    try:
        for slot in slots:
            claim = SlotClaim.acquire(location, slot)
            if claim is None:
                raise CheckpointConflictError(
                    f"gc: {location.url}: a buffer writes writer slot {slot} of the store; "
                    "collect when no buffer writes it (close them first)"
                )
            held.append(claim)
        yield
    finally:
        for claim in held:
            claim.release()


def _drop_from_log(where: Location, gone: set[int]) -> None:
    """Rewrite one slot's index log without ``gone`` (untouched when it lists none)."""
    state = index_log.read_slot_index(where)
    kept = [(e, t) for e, t in state.entries if int(e["trajectory_id"]) not in gone]
    if len(kept) == len(state.entries):
        return
    index_log.IndexLog.for_repair(where).rewrite(
        kept, counter=state.trajectory_counter, metadata=state.metadata
    )


def _finish_open_records(catalog: StoreIndex, layout: TrajectoryLayout, dry_run: bool) -> list[int]:
    """Finish the collections a crash interrupted (and those buffers left to their grace
    period): delete the data of their ids that no index lists any more; the ids they return."""
    finished: list[int] = []
    records = open_records(catalog.location)
    if not records:
        return finished
    listed = set(catalog.read().trajectory_index["trajectory_id_list"])
    for record in records:
        orphans = [i for i in record.ids if i not in listed]
        finished.extend(orphans)
        if not dry_run:
            delete_data(layout, orphans)
            record.write("done")
    return finished
