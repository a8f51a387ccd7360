"""Adding by reference: index entries for trajectories other writers committed to the store.

A learner's buffer shares its auto-save store with the writers.  What it adds by reference
is checked here (the right store, committed data, no id twice) before anything changes;
nothing is read at add time.  Each takes its FIFO place in the cache at once (reserved) and
is read whole into it after the first draw that needs its rows
(:meth:`~rbzarr.buffer.held.BufferRows.fill`), so window, draws and cache are those of a
buffer that added the trajectories by value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, InvalidTrajectoryError
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.trajectory.model import Schema

__all__ = ["Notice", "check_notices", "store_schema"]


class Notice(Protocol):
    """What a commit notice carries (:class:`~rbzarr.distributed.notices.CommitNotice`)."""

    @property
    def store(self) -> str: ...

    @property
    def entry(self) -> Mapping[str, Any]: ...


def check_notices(
    notices: Iterable[Notice],
    layout: TrajectoryLayout,
    index: TrajectoryIndex,
    storage_options: Mapping[str, Any],
) -> list[IndexEntry]:
    """The entries of ``notices``; refused unless each is a new, committed one of ``layout``."""
    entries: list[IndexEntry] = []
    seen: set[int] = set(index.entries)
    url = layout.location.url
    for notice in notices:
        store = Location.from_url(notice.store, storage_options).url
        if store != url:
            raise InvalidTrajectoryError(
                f"a notice of store {notice.store!r} cannot be added by reference to a buffer "
                f"of {url!r}: build the learner's buffer on the writers' store; nothing added"
            )
        try:
            entry = IndexEntry.parse(notice.entry, f"a notice of {notice.store!r}")
        except CorruptStoreError as exc:
            raise InvalidTrajectoryError(f"{exc}; nothing added") from exc
        trajectory_id = entry.trajectory_id
        if trajectory_id in seen:
            raise InvalidTrajectoryError(
                f"{url}: trajectory {trajectory_id} is in the buffer already; nothing added"
            )
        if not layout.contains(entry):
            raise CheckpointNotFoundError(
                f"{url}: trajectory {trajectory_id} has no committed data: send a notice only "
                "after the writer's flush(); nothing added"
            )
        seen.add(trajectory_id)
        entries.append(entry)
    return entries


def store_schema(layout: TrajectoryLayout) -> Schema | None:
    """The schema the store's writers recorded (``None`` if none has committed any)."""
    return StoreIndex.open(layout.location).schema
