"""Merge several stores into one (renumbering ids), or split one into parts.

Both validate every source first and commit the documents last, so an interrupted run
leaves no index entry without data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from rbzarr.analysis.export import export_store
from rbzarr.analysis.view import BufferView, open_buffer
from rbzarr.errors import CorruptStoreError, StoreExistsError
from rbzarr.storage.index import format_records
from rbzarr.storage.index.schema import schema_from_json, schema_to_json
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex, share_bounds
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.trajectory.model import Schema, validate

__all__ = ["merge_stores", "split_store"]


def _require_empty(location: Location) -> None:
    if location.exists() and location.list_names():
        raise StoreExistsError(
            f"{location.url} already exists and is not empty; choose a new destination"
        )


def _require_data(view: BufferView) -> None:
    missing = [i for i in view.ids if not view.layout.contains(view.entry(i))]
    if missing:
        raise CorruptStoreError(
            f"{view.url}: the index lists trajectories {missing} but their data is missing; "
            "run `rbzarr verify` on it"
        )


def _require_distinct_trajectories(views: Sequence[BufferView]) -> None:
    """Refuse sources that share a trajectory: the merged store would list it twice."""
    seen: dict[str, tuple[str, int]] = {}
    for view in views:
        for trajectory_id in view.ids:
            uuid = str(view.entry(trajectory_id)["uuid"])
            if uuid in seen:
                url, first_id = seen[uuid]
                raise ValueError(
                    f"cannot merge: trajectory {uuid} is id {first_id} of {url} and id "
                    f"{trajectory_id} of {view.url} (is one an export of the other?); merge "
                    "stores that hold different trajectories"
                )
            seen[uuid] = (view.url, trajectory_id)


def merge_stores(
    destination: str | os.PathLike[str],
    sources: Sequence[str | os.PathLike[str]],
    trajectory_format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Write the committed trajectories of ``sources`` into a new store at ``destination``,
    with their priority files (renumbered as their trajectories)."""
    if not sources:
        raise ValueError("merge needs at least one source store")
    views = [open_buffer(source, storage_options) for source in sources]
    urls = [view.url for view in views]
    if len(set(urls)) != len(urls):
        raise ValueError(f"a source is given twice: {urls}")
    schema = _common_schema(views)
    for view in views:
        _require_data(view)
    _require_distinct_trajectories(views)
    fmt = trajectory_format or views[0].format
    target = layout_class(fmt)(Location.from_url(destination, storage_options))
    _require_empty(target.location)
    index = TrajectoryIndex()
    merged_from = []
    total = sum(len(view) for view in views)
    with tqdm(total=total, desc="merge", unit="traj", disable=not progress) as bar:
        for view in views:
            ids = sorted(view.ids)
            for trajectory_id in ids:
                old = view.entry(trajectory_id)
                entry = index.new_entry(
                    old["shape"], old["max_episode_length"], old["model_weights_id"], old["uuid"]
                )
                target.write(entry, view.trajectory(trajectory_id))
                # Its stored priorities go along, under its new id (before the index).
                StoreIndex.assumed(view.layout.location).priorities.carry(
                    StoreIndex.assumed(target.location).priorities, [(old, entry)]
                )
                bar.update()
            merged_from.append({"source": view.url, "source_ids": ids})
    extra = {
        "seed": views[0].metadata.get("seed"),
        "schema": schema_to_json(schema),
        "merged_from": merged_from,
    }
    documents = index.to_documents(fmt, extra)
    format_records.write_documents(target, documents)
    return documents


def _common_schema(views: Sequence[BufferView]) -> Schema | None:
    """The sources' common schema (``None`` when all are empty); any difference raises."""
    found: Schema | None = None
    first_url = ""
    for view in views:
        schema = schema_from_json(view.metadata.get("schema"))
        if schema is None and len(view):
            schema = validate(view.trajectory(view.ids[0])).schema
        if schema is None:
            continue
        if found is None:
            found, first_url = schema, view.url
        elif schema != found:
            raise ValueError(
                f"cannot merge: {view.url} has schema {schema_to_json(schema)}, "
                f"but {first_url} has {schema_to_json(found)}"
            )
    return found


def split_store(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    count: int,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> list[str]:
    """Split the store at ``source`` into ``count`` stores ``destination/part_<k>``, each
    with its trajectories' priority files."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    view = open_buffer(source, storage_options)
    _require_data(view)
    root = Location.from_url(destination, storage_options)
    _require_empty(root)
    ids = view.ids
    if count > len(ids):
        raise ValueError(
            f"cannot split {view.url} into {count} parts: it holds {len(ids)} "
            f"trajector{'y' if len(ids) == 1 else 'ies'}, so at most {len(ids)} parts "
            "(each part gets at least one)"
        )
    parts = []
    for k in tqdm(range(count), desc="split", unit="part", disable=not progress):
        start, end = share_bounds(len(ids), k, count)
        part = root.child(f"part_{k}")
        export_store(view.layout.location, part, view.format, ids=ids[start:end])
        parts.append(part.url)
    return parts
