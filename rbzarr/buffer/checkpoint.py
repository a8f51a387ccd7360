"""Checkpoints: what ``save_checkpoint`` writes and what ``load_checkpoint`` reads back.

A checkpoint is the state of the index, the sampler and the schema (in ``metadata.json`` and
``trajectory_index.json``) plus the trajectories' data.  :func:`save` writes one from states
the buffer hands it; :func:`load` reads one completely, this rank's share only, *before*
anything changes, and returns a :class:`LoadedCheckpoint` that the buffer adopts.

RLinf lists every id it ever added but saves only its window: in a store written by RLinf
(no rbzarr format marker) listed ids without data are skipped with one warning, unless
``strict``; in a store written by rbzarr, missing data is always an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.buffer import manifest
from rbzarr.errors import (
    CheckpointConflictError,
    CheckpointNotFoundError,
    CorruptStoreError,
    InvalidTrajectoryError,
    StoreExistsError,
)
from rbzarr.storage.index import format_records
from rbzarr.storage.index.priorities import PriorityFiles
from rbzarr.storage.index.schema import check_schema, is_rbzarr_store, schema_from_json
from rbzarr.storage.index.store_index import StoreIndex, stored_format
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.index.writer_slot import WriterSlot
from rbzarr.storage.index.writers import IndexWriter
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout, check_entry_shape
from rbzarr.storage.rlinf.documents import Documents, Entry
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = [
    "LoadedCheckpoint",
    "check_adoptable",
    "check_target",
    "load",
    "materialize",
    "save",
]

LayoutFactory = manifest.LayoutFactory


# -- saving -----------------------------------------------------------------------------------
def check_target(target: TrajectoryLayout, auto_save_url: str | None, by_reference: bool) -> None:
    """Refuse a save path that is the auto-save store or holds a store or checkpoint already
    (for a manifest, one listing)."""
    url = target.location.url
    if url == auto_save_url:
        raise CheckpointConflictError(
            f"save_path {url!r} is the auto_save_path: a checkpoint there would drop older "
            "trajectories from the store's index; choose another path"
        )
    if by_reference:
        manifest.check_free(target.location)
    elif StoreIndex.open(target.location).holds_data(target) or target.location.exists(
        manifest.MANIFEST_FILE
    ):
        raise StoreExistsError(
            f"{url} already holds a store or a checkpoint; a checkpoint never overwrites data: "
            "choose a new save_path or delete the old checkpoint first"
        )


def save(
    target: TrajectoryLayout,
    index: TrajectoryIndex,
    metadata: Mapping[str, Any],
    copy_trajectory: Callable[[TrajectoryLayout, Entry], None],
) -> Documents:
    """Write ``index``'s trajectories (through ``copy_trajectory``), then its documents (the
    ones written are returned)."""
    # Unsafe file names fail before anything is written.
    for trajectory_id in index.id_list:
        target.trajectory_path(index.entries[trajectory_id])
    for trajectory_id in index.id_list:
        copy_trajectory(target, index.entries[trajectory_id])
    return format_records.write_documents(target, index.to_documents(target.format, metadata))


def materialize(location: Location, destination: Location, open_layout: LayoutFactory) -> Documents:
    """Copy the trajectories the manifest at ``location`` names into a self-contained
    checkpoint at ``destination``: what ``save_checkpoint(path, copy=True)`` would have written.

    Raises
    ------
    CheckpointNotFoundError
        No manifest is at ``location``.
    CheckpointReferenceError
        Its store, or a trajectory of it, is gone or changed.
    StoreExistsError
        ``destination`` holds a store or a checkpoint already.
    """
    found = manifest.read_manifest(location)
    if found is None:
        raise CheckpointNotFoundError(
            f"{location.url}: no checkpoint manifest ({manifest.MANIFEST_FILE}) here"
        )
    source = manifest.open_store(found, location, open_layout)
    index = found.index(location.url)
    manifest.check_trajectories(source, index, location.url)
    target = open_layout(destination, found.trajectory_format)
    check_target(target, source.location.url, by_reference=False)
    files = PriorityFiles(destination)
    for trajectory_id, values in PriorityFiles(location).read_all(index.entries.values()).items():
        files.write(trajectory_id, values)
    return save(target, index, found.documents.metadata, source.copy_to)


# -- loading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedCheckpoint:
    """Everything a buffer needs to adopt a checkpoint, read before anything changes."""

    source: TrajectoryLayout  # to copy or read more trajectories from
    full: TrajectoryIndex
    share: TrajectoryIndex  # this rank's part of full (all of it), only ids that have data
    schema: Schema | None  # stored, or learnt from the data; None for an empty share
    sampler: dict[str, Any]  # the state to restore (only the seed for a rank's share)
    warm: list[tuple[int, ValidatedTrajectory]]  # the share's last, as many as the cache keeps
    is_partial: bool  # share leaves out other ranks' ids
    path: Location  # the checkpoint's: its priority files are there (a manifest's data is not)

    @property
    def trajectory_format(self) -> str:
        """The format stored at the checkpoint's path."""
        return self.source.format


def load(
    location: Location,
    open_layout: LayoutFactory,
    *,
    share_of: tuple[int, int] | None = None,
    warm_capacity: int | None = None,
    strict: bool = False,
    window: int | None = None,
    writer: IndexWriter | None = None,
) -> LoadedCheckpoint:
    """Read the checkpoint at ``location`` (or this rank's share) before anything changes;
    with a ``window``, a large store's last ``window`` trajectories (and the cache's).
    ``writer`` writes the store at ``location`` in this process (its slot is read from
    memory).  A manifest (:mod:`rbzarr.buffer.manifest`) is read where its store holds the
    data."""
    store = StoreIndex.assumed(location)
    found = None
    try:
        if share_of is None and window is not None and window > 0:
            documents = store.read(max(window, warm_capacity or 0), writer)
        else:
            documents = store.read(writer=writer)
    except CheckpointNotFoundError:
        found = manifest.read_manifest(location)
        if found is None:
            raise
        documents = found.documents
    full = TrajectoryIndex.from_documents(documents, location.url)
    share = full if share_of is None else full.share(*share_of)
    is_partial = share.id_list != full.id_list
    if found is None:
        source = open_layout(location, stored_format(documents.metadata))
        share = _with_data(source, full, share, documents, strict)
    else:
        source = manifest.open_store(found, location, open_layout)
        manifest.check_trajectories(source, share, location.url)
    schema = schema_from_json(documents.metadata.get("schema"))
    if schema is not None and share.id_list:
        check_schema(schema, source, share.entries[share.id_list[-1]])
    warm_ids = share.id_list if warm_capacity is None else share.id_list[-warm_capacity:]
    if warm_capacity == 0:
        warm_ids = []
    warm = _read_validated(source, share, warm_ids, schema)
    if schema is None and warm:
        schema = warm[-1][1].spec.schema
    elif schema is None and share.id_list:
        # An RLinf checkpoint records no schema and nothing was warmed: learn it from data.
        ((_, last),) = _read_validated(source, share, share.id_list[-1:], None)
        schema = last.spec.schema
    sampler = documents.metadata.get("sampler")
    if share_of is not None or not isinstance(sampler, dict):
        # Only the seed (if recorded): a rank restarts the stream from it.
        sampler = {k: v for k, v in documents.metadata.items() if k == "seed"}
    return LoadedCheckpoint(source, full, share, schema, dict(sampler), warm, is_partial, location)


def _with_data(
    source: TrajectoryLayout,
    full: TrajectoryIndex,
    share: TrajectoryIndex,
    documents: Documents,
    strict: bool,
) -> TrajectoryIndex:
    """``share`` less the ids whose data is missing from an RLinf checkpoint (one warning);
    missing data of an rbzarr checkpoint (or with ``strict``) is an error."""
    where = source.location.url
    # A large store read by its window trusts its log (which lists only complete data): a
    # missing trajectory is found when it is read, not by a request per id here.
    held = share.id_list if full.is_complete else []
    audit = source.audit()
    missing = [i for i in held if not audit.contains(share.entries[i])]
    if not missing:
        return share
    if strict or is_rbzarr_store(documents.metadata):
        raise CheckpointNotFoundError(
            f"{where}: the index lists trajectories {missing} but their data is missing"
        )
    warnings.warn(
        f"{where}: skipped trajectories {missing}: the index lists them but their "
        "data was never saved (RLinf saves only its window); pass strict=True to refuse",
        UserWarning,
        stacklevel=4,
    )
    return share.subset(i for i in share.id_list if i not in set(missing))


def _read_validated(
    source: TrajectoryLayout, index: TrajectoryIndex, ids: list[int], schema: Schema | None
) -> list[tuple[int, ValidatedTrajectory]]:
    loaded = []
    where = source.location.url
    for trajectory_id in ids:
        entry = index.entries[trajectory_id]
        try:
            validated = ValidatedTrajectory.check(source.read(entry), schema)
        except InvalidTrajectoryError as exc:  # stored data that disagrees: a corrupt store
            raise CorruptStoreError(f"{where}: trajectory {trajectory_id}: {exc}") from exc
        check_entry_shape(entry, list(validated.spec.shape), where)
        schema = validated.spec.schema
        loaded.append((trajectory_id, validated))
    return loaded


def check_adoptable(loaded: LoadedCheckpoint, url: str, slot: WriterSlot) -> bool:
    """Whether the auto-save store at ``url`` (written in ``slot``) must import ``loaded``'s
    trajectories; ``False`` when it continues in place (it lists them already).

    Raises
    ------
    CheckpointConflictError
        A rank's share would continue in place in a shared store, or the checkpoint's ids
        belong to other writers' slots.
    """
    if loaded.source.location.url == url:
        if loaded.is_partial:
            raise CheckpointConflictError(
                f"{url}: a rank's share cannot continue in place in the shared auto_save "
                "store: ranks appending to one store would write the same new ids; give each "
                "rank its own auto_save_path"
            )
        return False
    if slot.slot != 0 and not all(slot.owns(i) for i in loaded.share.id_list):
        raise CheckpointConflictError(
            f"{url} has other writers: this buffer writes its slot {slot.slot} (ids from "
            f"{slot.first_id}) and cannot import the checkpoint {loaded.source.location.url}, "
            "whose ids belong to other slots; load it where no other writer runs, or into a "
            "new auto_save_path"
        )
    return True
