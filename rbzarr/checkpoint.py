"""Checkpoints: what ``save_checkpoint`` writes and how ``load_checkpoint`` restores it.

Saving follows the seed document: without ``auto_save`` the cached trajectories are saved;
with it, the current window is copied out of the auto-save store.  Loading reads the two
documents, takes this rank's share, reads everything it needs *before* touching the buffer
(so a failed load leaves it as it was), then swaps the state in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CheckpointNotFoundError, InvalidTrajectoryError, StoreExistsError
from rbzarr.index import TrajectoryIndex
from rbzarr.storage.layout import TrajectoryLayout, check_entry_shape
from rbzarr.storage.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.trajectory import Schema, Trajectory, TrajectorySpec, split_trajectory, validate

if TYPE_CHECKING:
    from rbzarr.buffer import TrajectoryReplayBuffer

__all__ = ["load", "save", "schema_from_json", "schema_to_json"]


def schema_to_json(schema: Schema | None) -> dict[str, Any] | None:
    """The buffer schema as JSON (``{key: [dtype, [trailing...]]}``)."""
    if schema is None:
        return None
    return {key: [dtype, list(trailing)] for key, (dtype, trailing) in schema.items()}


def schema_from_json(document: Any) -> Schema | None:
    """Inverse of :func:`schema_to_json`; ``None`` when the store has no schema."""
    if not document:
        return None
    return {
        key: (str(dtype), tuple(int(d) for d in trailing))
        for key, (dtype, trailing) in document.items()
    }


def save(buffer: TrajectoryReplayBuffer, save_path: str | os.PathLike[str]) -> None:
    """Write ``buffer``'s checkpoint to ``save_path``; the buffer itself is not changed."""
    destination = Location.from_url(save_path, buffer.storage_options)
    store = buffer._store
    if store is not None and destination.url == store.location.url:
        raise ValueError(
            f"save_path {destination.url!r} is the auto_save_path: a checkpoint there would "
            "drop older trajectories from the store's index; choose another path"
        )
    target = buffer._open_layout(destination.url)
    if target.holds_data():
        raise StoreExistsError(
            f"{destination.url} already holds a store; a checkpoint never overwrites data: "
            "choose a new save_path or delete the old checkpoint first"
        )
    buffer._writer.flush()
    # Hold the lock throughout: the saved set is the one at save time, and no concurrent
    # add may evict a cached trajectory half-way through.
    with buffer._lock:
        if store is not None:
            ids = buffer._index.window(buffer.sample_window_size)
        else:
            ids = buffer._cache.ids()
        index = buffer._index.subset(ids)
        for trajectory_id in ids:  # unsafe file names fail here, before anything is written
            target.trajectory_path(index.entries[trajectory_id])
        extra = {**buffer._metadata_extra(), "sampler": buffer._sampler.state_dict()}
        for trajectory_id in ids:
            entry = index.entries[trajectory_id]
            # An id still pending (added after the flush) may be half-written in the store:
            # save its in-memory copy.  Ids leave ``_pending`` under the lock, once complete.
            pending = buffer._pending.get(trajectory_id)
            if pending is not None:
                target.write(entry, pending)
            elif store is not None:
                store.copy_to(target, entry)
            else:
                target.write(entry, buffer._cache.trajectory(trajectory_id))
        target.write_documents(index.to_documents(buffer.trajectory_format, extra))


def load(
    buffer: TrajectoryReplayBuffer,
    load_path: str | os.PathLike[str],
    is_distributed: bool,
    local_rank: int,
    world_size: int,
) -> None:
    """Replace ``buffer``'s state by the checkpoint at ``load_path`` (or this rank's share)."""
    location = Location.from_url(load_path, buffer.storage_options)
    source, documents = open_store(
        location, layout_options={buffer.trajectory_format: buffer.layout_options}
    )
    full = TrajectoryIndex.from_documents(documents, location.url)
    share = full.shard(local_rank, world_size) if is_distributed else full
    missing = [i for i in share.id_list if not source.contains(share.entries[i])]
    if missing:
        raise CheckpointNotFoundError(
            f"{location.url}: the index lists trajectories {missing} but their data is missing"
        )
    warm = _warm_ids(buffer, share)
    loaded = [(i, source.read(share.entries[i])) for i in warm]
    schema = schema_from_json(documents.metadata.get("schema"))
    specs = _validate_all(loaded, schema, location.url, share.entries)
    if schema is None and specs:
        schema = specs[-1].schema
    elif schema is None and share.id_list:
        # An RLinf checkpoint records no schema and nothing was warmed: learn it from data.
        last = share.id_list[-1]
        pair = [(last, source.read(share.entries[last]))]
        (spec,) = _validate_all(pair, None, location.url, share.entries)
        schema = spec.schema
    buffer._writer.flush()
    with buffer._lock:
        # Adopt first: if the store refuses, the buffer has not been touched.
        if buffer._store is not None:
            _adopt_into_store(buffer, source, full, share, schema)
        buffer._schema = schema
        buffer._index = share
        buffer._pending.clear()
        buffer._cache.clear()
        for (trajectory_id, trajectory), spec in zip(loaded, specs, strict=True):
            flat, residue = split_trajectory(trajectory, spec)
            buffer._cache.put(trajectory_id, flat, residue, spec.B)
        sampler_state = documents.metadata.get("sampler")
        seed = documents.metadata.get("seed", buffer.seed)
        buffer.seed = seed
        if is_distributed or not isinstance(sampler_state, dict):
            sampler_state = {"seed": seed}
        buffer._sampler.load_state_dict(sampler_state)


def _warm_ids(buffer: TrajectoryReplayBuffer, share: TrajectoryIndex) -> list[int]:
    if not buffer._cache_enabled:
        return []
    capacity = buffer._cache.capacity
    return share.id_list if capacity is None else share.id_list[-capacity:]


def _validate_all(
    loaded: list[tuple[int, Trajectory]],
    schema: Schema | None,
    where: str,
    entries: Mapping[int, Mapping[str, Any]],
) -> list[TrajectorySpec]:
    specs = []
    for trajectory_id, trajectory in loaded:
        try:
            spec = validate(trajectory, schema)
        except InvalidTrajectoryError as exc:
            raise InvalidTrajectoryError(f"{where}: trajectory {trajectory_id}: {exc}") from exc
        check_entry_shape(entries[trajectory_id], list(spec.shape), where)
        schema = spec.schema
        specs.append(spec)
    return specs


def _adopt_into_store(
    buffer: TrajectoryReplayBuffer,
    source: TrajectoryLayout,
    full: TrajectoryIndex,
    share: TrajectoryIndex,
    schema: Schema | None,
) -> None:
    """Make the auto-save store hold the loaded trajectories, so it stays self-contained."""
    store = buffer._store
    assert store is not None
    if source.location.url == store.location.url and type(source) is type(store):
        if share.id_list != full.id_list:
            raise ValueError(
                f"{store.location.url}: a rank's share cannot continue in place in the shared "
                f"auto_save store: its new ids (from {share.trajectory_counter}) would "
                "overwrite other ranks' trajectories; give each rank its own auto_save_path"
            )
        buffer._persisted = full.subset(full.id_list)
        buffer._store_claimed = True
        return
    if buffer._persisted.id_list:
        raise StoreExistsError(
            f"{store.location.url} holds {len(buffer._persisted.id_list)} trajectories of this "
            "buffer; loading a checkpoint here would orphan them: call clear() first or load "
            "into a buffer with a fresh auto_save_path"
        )
    buffer._claim_store()
    for trajectory_id in share.id_list:
        source.copy_to(store, share.entries[trajectory_id])
    buffer._persisted = share.subset(share.id_list)
    extra = {**buffer._metadata_extra(), "schema": schema_to_json(schema)}
    store.write_documents(buffer._persisted.to_documents(buffer.trajectory_format, extra))
