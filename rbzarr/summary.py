"""What a store holds and what it costs: the data behind ``rbzarr info`` and ``rbzarr ls``.

Sizes come from one recursive listing of the store; per-key shapes, dtypes, codecs and
chunking from the Zarr metadata (zarr layout) or from loading each file (pt / pkl layouts,
whose files hold no separate metadata).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from rbzarr.analysis import BufferView
from rbzarr.dtypes import dtype_name
from rbzarr.storage.layout import Entry, TrajectoryLayout
from rbzarr.storage.location import Location, translate_errors
from rbzarr.storage.zarr_layout import DTYPE_ATTR, FIELDS_ATTR, TRAJECTORIES, ZarrLayout

__all__ = ["data_path", "describe_store", "file_sizes", "list_trajectories"]


def data_path(layout: TrajectoryLayout, entry: Entry) -> tuple[str, ...]:
    """Names (below the root) of the file or directory that holds one trajectory."""
    path = layout.trajectory_path(entry)
    if path is None:
        raise ValueError(f"{layout!r} does not say where a trajectory's data lives")
    return path


def file_sizes(location: Location) -> dict[str, int]:
    """Size of every file below ``location``, by ``/``-joined path relative to it."""
    with translate_errors(location.url, "listing"):
        if not location.fs.exists(location.path):
            return {}
        found = location.fs.find(location.path, detail=True)
    root = location.path.rstrip("/") + "/"
    return {
        str(path)[len(root) :]: int(info.get("size") or 0)
        for path, info in found.items()
        if str(path).startswith(root)
    }


def _bytes_by_prefix(sizes: Mapping[str, int]) -> dict[str, int]:
    """Total size below every one- and two-part prefix (a file counts as its own prefix)."""
    totals: dict[str, int] = defaultdict(int)
    for path, size in sizes.items():
        parts = path.split("/")
        for depth in {1, min(2, len(parts))}:
            totals["/".join(parts[:depth])] += size
    return totals


def list_trajectories(view: BufferView) -> list[dict[str, Any]]:
    """One row per committed trajectory, in index order, with its bytes on storage."""
    totals = _bytes_by_prefix(file_sizes(view.layout.location))
    rows = []
    for trajectory_id, entry in view.entries.items():
        rows.append(
            {
                "trajectory_id": trajectory_id,
                "uuid": entry.get("uuid"),
                "shape": list(entry["shape"]),
                "num_samples": int(entry["num_samples"]),
                "model_weights_id": entry.get("model_weights_id", ""),
                "bytes": totals.get("/".join(data_path(view.layout, entry)), 0),
            }
        )
    return rows


def describe_store(view: BufferView, progress: bool = False) -> dict[str, Any]:
    """Counts, per-key layout and sizes of a store; see ``rbzarr info``.

    Each key reports the dtype, shape, chunk shape and codec of its first trajectory, and
    ``raw_bytes`` (uncompressed) and ``bytes_on_disk`` summed over every committed
    trajectory (``bytes_on_disk`` is ``None`` per key in pt / pkl layouts, whose files hold
    all keys together).  The totals count trajectory data only, not the JSON documents.
    """
    if isinstance(view.layout, ZarrLayout):
        keys, disk = _describe_zarr(view, progress)
    else:
        keys, disk = _describe_files(view, progress)
    raw = sum(int(info["raw_bytes"]) for info in keys.values())
    metadata = view.metadata
    return {
        "url": view.url,
        "format": view.format,
        "layout_version": metadata.get("layout_version", 1 if view.format == "zarr" else None),
        "trajectories": len(view),
        "total_samples": view.total_samples,
        "trajectory_counter": metadata.get("trajectory_counter"),
        "seed": metadata.get("seed"),
        "keys": keys,
        "raw_bytes": raw,
        "bytes_on_disk": disk,
        "compression_ratio": raw / disk if disk else None,
    }


def _describe_zarr(view: BufferView, progress: bool) -> tuple[dict[str, Any], int]:
    sizes = file_sizes(view.layout.location)
    keys: dict[str, dict[str, Any]] = {}
    disk = 0
    for trajectory_id in tqdm(view.ids, desc="info", disable=not progress):
        group = view.zarr_group(trajectory_id)
        members = {
            name: node for name, node in group.members(max_depth=None) if hasattr(node, "chunks")
        }
        # In the trajectory's field order (that of a sampled batch), not the listing order.
        order = group.attrs.get(FIELDS_ATTR) or {}
        arrays = {name: members[name] for name in sorted(members, key=list(order).index)}
        for name, array in arrays.items():
            info = keys.setdefault(name, _zarr_key_info(array))
            info["raw_bytes"] += int(array.nbytes)
        prefix = f"{TRAJECTORIES}/{trajectory_id}/"
        for path, size in sizes.items():
            if not path.startswith(prefix):
                continue
            disk += size
            key = _owning_key(path[len(prefix) :], arrays)
            if key is not None:
                keys[key]["bytes_on_disk"] += size
    return keys, disk


def _zarr_key_info(array: Any) -> dict[str, Any]:
    shards = array.shards
    return {
        "dtype": array.attrs.get(DTYPE_ATTR, str(array.dtype)),
        "shape": list(array.shape),
        "chunks": list(array.chunks),
        "shards": None if shards is None else list(shards),
        "codec": _codec_text(array.metadata.to_dict().get("codecs", ())),
        "raw_bytes": 0,
        "bytes_on_disk": 0,
    }


def _codec_text(codecs: Any) -> str:
    """``zstd(level=1, checksum=False)``-style names of a codec chain, serializer left out."""
    parts = []
    for codec in codecs:
        name = codec.get("name")
        config = codec.get("configuration") or {}
        if name == "bytes":
            continue
        if name == "sharding_indexed":
            inner = _codec_text(config.get("codecs", ()))
            parts.append(f"sharding(chunks={list(config.get('chunk_shape', ()))}, {inner})")
            continue
        args = ", ".join(f"{k}={v}" for k, v in config.items())
        parts.append(f"{name}({args})")
    return " | ".join(parts) or "none"


def _owning_key(relative: str, keys: Mapping[str, Any]) -> str | None:
    """The longest key that ``relative`` (a path inside a trajectory group) lies under."""
    parts = relative.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:depth])
        if candidate in keys:
            return candidate
    return None


def _describe_files(view: BufferView, progress: bool) -> tuple[dict[str, Any], int]:
    totals = _bytes_by_prefix(file_sizes(view.layout.location))
    codec = "torch.save" if view.format == "pt" else view.format
    keys: dict[str, dict[str, Any]] = {}
    disk = 0
    for trajectory_id, trajectory in view.iter_trajectories(progress=progress):
        disk += totals.get("/".join(data_path(view.layout, view.entry(trajectory_id))), 0)
        for name, tensor in trajectory.tensors().items():
            info = keys.setdefault(
                name,
                {
                    "dtype": dtype_name(tensor.dtype),
                    "shape": list(tensor.shape),
                    "chunks": None,
                    "shards": None,
                    "codec": codec,
                    "raw_bytes": 0,
                    "bytes_on_disk": None,
                },
            )
            info["raw_bytes"] += tensor.numel() * tensor.element_size()
    return keys, disk
