"""What a store holds and what it costs: the data behind ``rbzarr info`` and ``rbzarr ls``."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from rbzarr.analysis.listing import StoreListing
from rbzarr.storage.io.backends import translate_errors
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import bytes_by_prefix

__all__ = ["describe_store", "file_sizes", "list_trajectories"]


def file_sizes(location: Location) -> dict[str, int]:
    """Size of every file below ``location``."""
    return _file_costs(location)[0]


def _file_costs(location: Location) -> tuple[dict[str, int], int | None]:
    """Size of every file below ``location`` and, locally, the disk blocks of its files and
    folders in bytes (as ``du`` counts them; ``None`` elsewhere)."""
    if location.is_local:
        return _local_tree(location.path)
    with translate_errors(location.url, "listing"):
        if not location.exists():
            return {}, None
        found = location.fs.find(location.path, detail=True, **deadline_options(location.fs))
    root = location.path.rstrip("/") + "/"
    sizes = {
        str(path)[len(root) :]: int(info.get("size") or 0)
        for path, info in found.items()
        if str(path).startswith(root)
    }
    return sizes, None


def _local_tree(root: str) -> tuple[dict[str, int], int]:
    """One walk of a local folder (none if it is missing): file sizes, and disk blocks."""
    sizes: dict[str, int] = {}
    disk = 0
    for folder, _, names in os.walk(root):
        disk += os.stat(folder).st_blocks * 512
        relative = os.path.relpath(folder, root).replace(os.sep, "/")
        for name in names:
            stat = os.stat(os.path.join(folder, name))
            sizes[name if relative == "." else f"{relative}/{name}"] = stat.st_size
            disk += stat.st_blocks * 512
    return sizes, disk


def store_costs(sizes: dict[str, int], disk_usage: int | None) -> dict[str, Any]:
    """What the store's files cost: their count, their bytes, the bytes of the metadata
    documents (``zarr.json`` and the JSON indexes) and, locally, their disk blocks."""
    documents = [name for name in sizes if posixpath.basename(name).endswith(".json")]
    return {
        "files": len(sizes),
        "file_bytes": sum(sizes.values()),
        "json_files": len(documents),
        "json_bytes": sum(sizes[name] for name in documents),
        "disk_usage": disk_usage,
    }


def list_trajectories(store: StoreListing) -> list[dict[str, Any]]:
    """One row per committed trajectory, in index order, with its bytes on storage;
    ``missing`` marks one the index lists but whose data has no file at all."""
    totals = bytes_by_prefix(file_sizes(store.location))
    return [
        {
            "missing": store.trajectory_path(entry) not in totals,
            "trajectory_id": trajectory_id,
            "uuid": entry.get("uuid"),
            "shape": list(entry["shape"]),
            "num_samples": int(entry["num_samples"]),
            "model_weights_id": entry.get("model_weights_id", ""),
            "bytes": totals.get(store.trajectory_path(entry), 0),
        }
        for trajectory_id, entry in store.entries.items()
    ]


def describe_store(store: StoreListing, progress: bool = False) -> dict[str, Any]:
    """Counts, per-key layout and sizes of a store; see ``rbzarr info``."""
    sizes, disk_usage = _file_costs(store.location)
    keys, disk = store.describe_keys(sizes, progress)
    raw = sum(int(info["raw_bytes"]) for info in keys.values())
    metadata = store.metadata
    return {
        "url": store.url,
        "format": store.format,
        "layout_version": metadata.get("layout_version", store.unrecorded_version),
        "trajectories": len(store),
        "total_samples": store.total_samples,
        "trajectory_counter": metadata.get("trajectory_counter"),
        "seed": metadata.get("seed"),
        "keys": keys,
        "raw_bytes": raw,
        "bytes_on_disk": disk,
        "stored_over_raw": disk / raw if raw else None,
        "store": store_costs(sizes, disk_usage),
    }
