"""What a zarr store's trajectory groups hold, read from zarr's metadata alone (no torch).

``rbzarr info`` and ``rbzarr ls`` read a store through this module and the store's
documents only, so they answer without importing torch;
:class:`~rbzarr.storage.zarr.layout.ZarrLayout` delegates the same questions here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import zarr
from tqdm import tqdm
from zarr.errors import UnknownCodecError

from rbzarr.errors import CodecUnavailableError, CorruptStoreError
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.zarr.codecs import unknown_codec
from rbzarr.storage.zarr.packs import PACKS, Membership, membership
from rbzarr.storage.zarr.shard_index import DTYPE_ATTR

__all__ = [
    "CONSOLIDATED",
    "FIELDS_ATTR",
    "TRAJECTORIES",
    "UNRECORDED_VERSION",
    "checked_group",
    "codec_text",
    "data_group",
    "recorded_arrays",
    "describe_keys",
    "group_arrays",
    "trajectory_group",
    "trajectory_id",
    "trajectory_path",
]

TRAJECTORIES = "trajectories"
FIELDS_ATTR = "fields"
# The group attribute where layout 2 records its arrays (their kind, shape, dtype, ...).
LAYOUT_ATTR = "rbzarr_layout"
# Where a trajectory group's document consolidates its subgroups' and arrays' documents
# (zarr's inline consolidated metadata): a trajectory is its shards and that one document.
CONSOLIDATED = "consolidated_metadata"
# The layout version of a store written before layout 2 recorded one.
UNRECORDED_VERSION = 1


def trajectory_id(entry: Entry) -> int:
    """The trajectory id of an index entry."""
    try:
        return int(entry["trajectory_id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"index entry has no valid 'trajectory_id': {entry!r}") from exc


def trajectory_path(entry: Entry) -> tuple[str, ...]:
    """The path of a trajectory's group below the root, as parts."""
    return (TRAJECTORIES, str(int(entry["trajectory_id"])))


def trajectory_group(location: Location, entry: Entry) -> zarr.Group:
    """The zarr group of an index entry's trajectory, opened by zarr once rbzarr has checked
    it: no link in its path or below it, nothing but folders and regular files below it (a
    FIFO would block zarr's reads), and each ``zarr.json`` within the bounds of every
    document (:func:`~rbzarr.storage.io.json_limits.read_json`; zarr's own parser recurses);
    missing is a :class:`CorruptStoreError`."""
    parts = trajectory_path(entry)
    path = "/".join(parts)
    return checked_group(
        location,
        path,
        f"trajectory {trajectory_id(entry)}: the index of {location.url} lists it but its data "
        f"({path}) is missing; run `rbzarr verify --repair --drop-damaged {location.url}` to "
        "drop it from the index",
    )


def data_group(location: Location, entry: Entry) -> tuple[zarr.Group, Membership | None]:
    """The zarr group holding a trajectory's arrays, checked as :func:`trajectory_group`
    checks one: its own, or a pack member's pack (then also where it is in it: its rows of
    each array are the ``member``-th of ``members`` equal slices of the first axis)."""
    group = trajectory_group(location, entry)
    place = membership(group.attrs.get(LAYOUT_ATTR), f"{location.url}/{group.path}")
    if place is None:
        return group, None
    missing = (
        f"{location.url}/{place.group}: the pack holding trajectory {trajectory_id(entry)} is "
        f"missing; run `rbzarr verify --repair --drop-damaged {location.url}` to drop its "
        "members from the index"
    )
    return checked_group(location, place.group, missing), place


def checked_group(location: Location, path: str, missing: str) -> zarr.Group:
    """The zarr group at ``path`` below the root, checked as :func:`trajectory_group`
    checks a trajectory's; ``missing`` is the message when it is not there."""
    folder = location.child(*path.split("/"))  # the gate: plain names, no link on the way
    folder.check_tree()
    store = location.zarr_store(read_only=True)
    try:
        # Locally, where a tampered store costs nothing to read, every document is checked
        # first; on object storage that would cost a request per array, so zarr's own
        # parse is bounded instead (a deeply nested document raises RecursionError).
        for document in folder.list_files() if location.is_local else ():
            if PurePosixPath(document).name == "zarr.json":
                read_json(folder.read_bytes(*document.split("/")), f"{folder.url}/{document}")
        return zarr.open_group(store=store, path=path, mode="r")
    except RecursionError as exc:
        raise CorruptStoreError(f"{folder.url}/zarr.json: nested too deeply") from exc
    except UnknownCodecError as exc:
        raise _not_known_here(folder.url, exc) from exc
    except FileNotFoundError as exc:  # zarr's GroupNotFoundError
        raise CorruptStoreError(missing) from exc


def _not_known_here(where: str, exc: UnknownCodecError) -> CodecUnavailableError:
    """zarr has no codec class of a document's name here: not damage (a newer rbzarr's)."""
    return unknown_codec(where, str(exc).removeprefix("Unknown codec: ").strip("'"))


def group_arrays(location: Location, group: zarr.Group) -> dict[str, zarr.Array]:
    """Every array below a trajectory group; an array document zarr refuses is
    :class:`CorruptStoreError`."""
    try:
        return {
            name: node
            for name, node in group.members(max_depth=None)
            if isinstance(node, zarr.Array)
        }
    except UnknownCodecError as exc:
        raise _not_known_here(f"{location.url}/{group.path}", exc) from exc
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CorruptStoreError(
            f"{location.url}/{group.path}: an array's zarr.json is not one rbzarr reads: {exc}"
        ) from exc


def describe_keys(
    location: Location, entries: Iterable[Entry], sizes: Mapping[str, int], progress: bool = False
) -> tuple[dict[str, dict[str, Any]], int]:
    """Per-key layout and sizes of the trajectories ``entries`` (see
    :meth:`~rbzarr.storage.layout.TrajectoryLayout.describe_keys`)."""
    keys: dict[str, dict[str, Any]] = {}
    disk = 0
    by_trajectory = _sizes_by_group(sizes, TRAJECTORIES)
    by_pack = _sizes_by_group(sizes, PACKS)
    for entry in tqdm(list(entries), desc="info", unit="traj", disable=not progress):
        recorded, place = recorded_arrays(location, entry)
        descriptions: dict[str, Any]
        if recorded is not None and all(name in keys for name in recorded):
            # Layout 2 records every array's shape and dtype in the group's attributes: one
            # small read, not zarr's walk of the group, once each key is described.
            descriptions = recorded
            raw_bytes = {name: _raw_bytes(d) for name, d in recorded.items()}
        else:
            group, place = data_group(location, entry)
            share = 1 if place is None else place.members
            members = group_arrays(location, group)
            # In the trajectory's field order (that of a sampled batch), not listing order.
            fields = group.attrs.get(FIELDS_ATTR)
            order = list(fields) if isinstance(fields, dict) else list(members)
            arrays = {name: members[name] for name in order if name in members}
            layout = group.attrs.get(LAYOUT_ATTR)
            described = layout.get("arrays", {}) if isinstance(layout, dict) else {}
            descriptions = {name: described.get(name) for name in arrays}
            if place is not None:  # a pack member's share of its pack's arrays
                descriptions = {
                    name: d if not isinstance(d, dict) else _share(d, share)
                    for name, d in descriptions.items()
                }
            for name, array in arrays.items():
                keys.setdefault(name, _key_info(array, descriptions[name], share))
            raw_bytes = {
                name: _raw_bytes(descriptions[name], int(array.nbytes) // share)
                for name, array in arrays.items()
            }
        for name, nbytes in raw_bytes.items():
            keys[name]["raw_bytes"] += nbytes
            spec = _codec_spec(descriptions.get(name))
            if spec is not None:
                keys[name]["codec_spec"] = spec
            psnr = (descriptions.get(name) or {}).get("psnr")
            if isinstance(psnr, int | float):  # the worst trajectory's, for a lossy key
                keys[name]["psnr"] = min(float(psnr), keys[name].get("psnr", float(psnr)))
        files = [
            (relative, size)
            for relative, size in by_trajectory.get(str(int(entry["trajectory_id"])), {}).items()
        ]
        if place is not None:  # a pack member: its share of the pack's files
            pack = by_pack.get(place.group.split("/")[1], {})
            files += [(relative, size // place.members) for relative, size in pack.items()]
        for relative, size in files:
            disk += size
            key = _owning_key(relative, raw_bytes)
            if key is not None:
                keys[key]["bytes_on_disk"] += size
    return keys, disk


def recorded_arrays(
    location: Location, entry: Entry
) -> tuple[dict[str, dict[str, Any]] | None, Membership | None]:
    """Each array's description (shape, dtype, ...) in field order, as layout 2 records them
    in a trajectory group's attributes (a pack member's: its share of its pack's), and the
    pack it is a member of; ``None`` where they are not recorded (or not readable: zarr's
    own read then names the problem)."""
    where = f"{location.url}/{'/'.join(trajectory_path(entry))}/zarr.json"
    place = None
    try:
        folder = location.child(*trajectory_path(entry))  # the gate: no link on the way
        attributes = read_json(folder.read_bytes("zarr.json"), where)["attributes"]
        fields = attributes[FIELDS_ATTR]
        place = membership(attributes.get(LAYOUT_ATTR), where)
        if place is not None:
            pack = location.child(*place.group.split("/"))
            attributes = read_json(pack.read_bytes("zarr.json"), f"{pack.url}/zarr.json")[
                "attributes"
            ]
        arrays = attributes[LAYOUT_ATTR]["arrays"]
        described = {name: dict(arrays[name]) for name in fields}
        if place is not None:
            described = {name: _share(d, place.members) for name, d in described.items()}
        for description in described.values():
            _raw_bytes(description)  # a shape or dtype that does not read: not recorded
        return described, place
    except (FileNotFoundError, CorruptStoreError, KeyError, TypeError, ValueError):
        return None, place


def _share(description: dict[str, Any], members: int) -> dict[str, Any]:
    """A pack array's description as one of its ``members`` sees it: its rows divided."""
    shape = [int(n) for n in description["shape"]]
    found = {**description, "shape": [shape[0] // members, *shape[1:]]}
    rows = description.get("rows")
    if isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        found["rows"] = [rows[0] // members, rows[1]]
    return found


def _raw_bytes(description: Any, stored: int | None = None) -> int:
    """Bytes of an array as read, from its recorded description (or ``stored``, its zarr
    size): a ``next_obs`` key stored once counts its full ``[T, B]`` rows."""
    if not isinstance(description, dict):
        if stored is None:
            raise TypeError("no description")
        return stored
    shape = [int(n) for n in description["shape"]] if stored is None else None
    rows = description.get("rows")
    if isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        if stored is not None:
            per_row = stored // max(1, _stored_rows(description))
        else:
            assert shape is not None
            per_row = math.prod(shape[2:]) * np.dtype(description["dtype"]).itemsize
        return per_row * rows[0] * rows[1]
    if stored is not None:
        return stored
    assert shape is not None
    return math.prod(shape) * np.dtype(description["dtype"]).itemsize


def _codec_spec(description: Any) -> str | None:
    """The codec spec a layout-2 description records (``"raw"`` when uncompressed), or
    ``None`` for arrays zarr wrote (their chain is in ``codec``)."""
    if not isinstance(description, dict) or description.get("kind") in (None, "zarr"):
        return None
    return str(description.get("codec") or "raw")


def _stored_rows(description: dict[str, Any]) -> int:
    """How many rows a ``next_obs`` key stored once keeps in its own array."""
    explicit = description.get("explicit")
    return len(explicit) if isinstance(explicit, list) else 1


def _sizes_by_group(sizes: Mapping[str, int], folder: str) -> dict[str, dict[str, int]]:
    """``{group name: {path inside it: size}}`` of the groups in ``folder`` (the
    trajectories, or the packs) from a store's file sizes."""
    found: dict[str, dict[str, int]] = {}
    prefix = f"{folder}/"
    for path, size in sizes.items():
        if path.startswith(prefix):
            tid, _, relative = path[len(prefix) :].partition("/")
            found.setdefault(tid, {})[relative] = size
    return found


def _key_info(array: zarr.Array, description: Any, members: int = 1) -> dict[str, Any]:
    """The first trajectory's dtype, shape (as read: a ``next_obs`` key stored once has its
    full ``[T, B]`` rows; ``stored_shape`` is its array's; a pack member's, ``members``
    sharing the array, its share of the rows), chunking and codec of one key (no sizes
    yet)."""
    shards = array.shards
    rows = description.get("rows") if isinstance(description, dict) else None
    stored = list(array.shape)
    if members > 1 and stored:
        stored[0] //= members
    logical = stored
    if isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        logical = [*rows, *stored[2:]]
    return {
        "dtype": array.attrs.get(DTYPE_ATTR, str(array.dtype)),
        "shape": logical,
        **({"stored_shape": stored} if logical != stored else {}),
        "chunks": list(array.chunks),
        "shards": None if shards is None else list(shards),
        "codec": codec_text(array.metadata.to_dict().get("codecs", ())),
        "raw_bytes": 0,
        "bytes_on_disk": 0,
    }


def codec_text(codecs: Any) -> str:
    """``zstd(level=1, checksum=False)``-style names of a codec chain, serializer left out."""
    parts = []
    for codec in codecs:
        name = codec.get("name")
        config = codec.get("configuration") or {}
        if name == "bytes":
            continue
        if name == "sharding_indexed":
            inner = codec_text(config.get("codecs", ()))
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
