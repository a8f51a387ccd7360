"""What the zarr layout knows about its own stores: names, field lists, damage, sizes.

:class:`ZarrInspection` is the base of :class:`~rbzarr.storage.zarr.layout.ZarrLayout`; it
answers the format questions of :class:`~rbzarr.storage.layout.TrajectoryLayout` (where data
lives, which fields a trajectory has, what is missing, whether the root group mirrors the
documents, per-key codecs and sizes) from Zarr metadata alone, without decoding chunks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

import zarr
from tqdm import tqdm

from rbzarr.storage.documents import INDEX_FILE, METADATA_FILE, Documents, Entry, Finding
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.names import is_temporary_name
from rbzarr.storage.zarr.chunks import DTYPE_ATTR
from rbzarr.storage.zarr.open import FIELDS_ATTR, TRAJECTORIES

__all__ = ["ROOT_ATTR", "ZarrInspection", "codec_text"]

# The root group's attribute that mirrors the two documents.
ROOT_ATTR = "rbzarr"


class ZarrInspection(TrajectoryLayout):
    """The zarr layout's format knowledge; :class:`ZarrLayout` adds reading and writing.

    Parameters
    ----------
    location
        The store's root (a Zarr v3 group).
    """

    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        """The trajectory's group below the root.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        tuple of str
            ``("trajectories", "<id>")``.
        """
        return (TRAJECTORIES, str(int(entry["trajectory_id"])))

    def stored_paths(self) -> dict[str, int]:
        """Every trajectory group present, indexed or not.

        Returns
        -------
        dict
            ``{"trajectories/<id>": id}`` for the ids of :meth:`list_ids`.

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """
        return {f"{TRAJECTORIES}/{tid}": tid for tid in self.list_ids()}

    def foreign_files(self, path: str) -> list[str]:
        """Files below a trajectory group that rbzarr did not write.

        rbzarr writes node documents (``zarr.json``), chunk and shard objects below ``c/``
        and, when interrupted, temporary files; anything else is the user's.

        Parameters
        ----------
        path
            A trajectory group's path from :meth:`stored_paths`.

        Returns
        -------
        list of str
            The other files, ``/``-joined relative to ``path``.

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """
        return [
            name
            for name in self.location.list_files(*path.split("/"))
            if not _written_by_rbzarr(PurePosixPath(name))
        ]

    def zarr_group(self, entry: Entry) -> zarr.Group:
        """The read-only Zarr group of one trajectory.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        zarr.Group
            Opened with ``mode="r"`` on a read-only store.

        Raises
        ------
        FileNotFoundError
            The group does not exist (zarr's ``GroupNotFoundError``).
        """
        store = self.location.zarr_store(read_only=True)
        return zarr.open_group(store=store, path="/".join(self.trajectory_path(entry)), mode="r")

    def field_names(self, entry: Entry) -> list[str]:
        """Flat field keys of one trajectory, from its group's ``fields`` attribute.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        list of str
            The keys, in the trajectory's field order.

        Raises
        ------
        ValueError
            The group has no ``fields`` attribute (an unfinished write).
        """
        fields = self.zarr_group(entry).attrs.get(FIELDS_ATTR)
        if not isinstance(fields, dict):
            raise ValueError(f"{self.location.url}: trajectory group has no {FIELDS_ATTR!r}")
        return list(fields)

    def missing_parts(self, entry: Entry) -> list[str]:
        """Arrays of a present trajectory that lack chunks (they would read as fill values).

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        list of str
            One message per array, naming how many of its chunks are stored.
        """
        return [
            f"array {name!r} stores {node.nchunks_initialized} of {node.nchunks} chunks"
            for name, node in self.zarr_group(entry).members(max_depth=None)
            if isinstance(node, zarr.Array) and node.nchunks_initialized != node.nchunks
        ]

    def check_documents(self, documents: Documents) -> list[Finding]:
        """Whether the root group's ``rbzarr`` attribute mirrors the two documents.

        Parameters
        ----------
        documents
            The store's documents, as read from the JSON files.

        Returns
        -------
        list of Finding
            One ``root_attrs_mismatch`` finding when the root ``zarr.json`` is missing,
            unparsable or mirrors other documents, else none.
        """
        try:
            root = json.loads(self.location.read_bytes("zarr.json"))
            mirror = root.get("attributes", {}).get(ROOT_ATTR)
        except (FileNotFoundError, ValueError, AttributeError) as exc:
            return [Finding("root_attrs_mismatch", "zarr.json", " ".join(str(exc).split()))]
        expected = {"metadata": documents.metadata, "trajectory_index": documents.trajectory_index}
        if mirror == expected:
            return []
        return [
            Finding(
                "root_attrs_mismatch",
                "zarr.json",
                f"root attributes {ROOT_ATTR!r} do not mirror {METADATA_FILE} and {INDEX_FILE}",
            )
        ]

    def describe_keys(
        self, entries: Iterable[Entry], sizes: Mapping[str, int], progress: bool = False
    ) -> tuple[dict[str, dict[str, Any]], int]:
        """Per-key layout and sizes of the trajectories ``entries``, from Zarr metadata.

        Parameters
        ----------
        entries
            Index entries of the trajectories to describe.
        sizes
            Size of every file below the root, by ``/``-joined path.
        progress
            Show a progress bar on stderr.

        Returns
        -------
        tuple of (dict, int)
            ``{key: {"dtype", "shape", "chunks", "shards", "codec", "raw_bytes",
            "bytes_on_disk"}}`` in field order (the first trajectory's dtype, shape and
            chunking; bytes summed over the trajectories), and the bytes on storage of all
            the trajectories' groups.
        """
        keys: dict[str, dict[str, Any]] = {}
        disk = 0
        by_trajectory = _sizes_by_trajectory(sizes)
        for entry in tqdm(list(entries), desc="info", unit="traj", disable=not progress):
            group = self.zarr_group(entry)
            members = {
                name: node
                for name, node in group.members(max_depth=None)
                if isinstance(node, zarr.Array)
            }
            # In the trajectory's field order (that of a sampled batch), not listing order.
            fields = group.attrs.get(FIELDS_ATTR)
            order = list(fields) if isinstance(fields, dict) else list(members)
            arrays = {name: members[name] for name in order if name in members}
            for name, array in arrays.items():
                info = keys.setdefault(name, _key_info(array))
                info["raw_bytes"] += int(array.nbytes)
            for relative, size in by_trajectory.get(str(int(entry["trajectory_id"])), {}).items():
                disk += size
                key = _owning_key(relative, arrays)
                if key is not None:
                    keys[key]["bytes_on_disk"] += size
        return keys, disk


def _sizes_by_trajectory(sizes: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """``{trajectory id: {path inside its group: size}}`` from a store's file sizes."""
    found: dict[str, dict[str, int]] = {}
    prefix = f"{TRAJECTORIES}/"
    for path, size in sizes.items():
        if path.startswith(prefix):
            tid, _, relative = path[len(prefix) :].partition("/")
            found.setdefault(tid, {})[relative] = size
    return found


def _key_info(array: zarr.Array) -> dict[str, Any]:
    shards = array.shards
    return {
        "dtype": array.attrs.get(DTYPE_ATTR, str(array.dtype)),
        "shape": list(array.shape),
        "chunks": list(array.chunks),
        "shards": None if shards is None else list(shards),
        "codec": codec_text(array.metadata.to_dict().get("codecs", ())),
        "raw_bytes": 0,
        "bytes_on_disk": 0,
    }


def codec_text(codecs: Any) -> str:
    """``zstd(level=1, checksum=False)``-style names of a codec chain, serializer left out.

    Parameters
    ----------
    codecs
        The ``codecs`` list of a Zarr v3 array's metadata.

    Returns
    -------
    str
        The codecs joined by ``" | "``, or ``"none"``.
    """
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


def _written_by_rbzarr(name: PurePosixPath) -> bool:
    """Node documents (``zarr.json``), chunk or shard objects below ``c/``, and temporary
    files of an interrupted write: what rbzarr writes below a trajectory group."""
    return name.name == "zarr.json" or "c" in name.parts[:-1] or is_temporary_name(name.name)
