"""robomimic-layout HDF5 in and out, with h5py.

The layout (robomimic's ``SequenceDataset`` reads it): a group ``data`` whose attribute
``env_args`` is a JSON document, one group ``data/demo_<i>`` per demonstration with the
attribute ``num_samples`` and the datasets ``actions``, ``rewards``, ``dones``, ``states``,
``obs/<key>`` and ``next_obs/<key>``; optional filter keys ``mask/<name>`` list demo names.

==========================  ===================================================
robomimic dataset           rbzarr key
==========================  ===================================================
``obs/<key>``               ``curr_obs/<key>``
``next_obs/<key>``          ``next_obs/<key>`` (``curr_obs`` shifted when absent)
``actions``                 ``actions``
``rewards``                 ``rewards`` (zeros when absent)
``dones``                   ``dones`` (the episode's end when absent)
``states``, any other       ``forward_inputs/<name>``
==========================  ===================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import h5py
import numpy as np
from tqdm import tqdm

from rbzarr.errors import (
    DatasetFileNotFoundError,
    DatasetMismatchError,
    StoreExistsError,
    UnsupportedDatasetError,
)
from rbzarr.interop.episodes import SOURCE_KEY, StoredEpisode, read_episodes, shifted
from rbzarr.storage.io.location import Location

__all__ = ["RobomimicSource", "export_robomimic"]

_GENERIC_ENV = {"env_name": "rbzarr", "type": 2, "env_kwargs": {}}
_TOP = {"actions": "actions", "rewards": "rewards", "dones": "dones"}


def _demo_order(name: str) -> tuple[int, str]:
    match = re.fullmatch(r"demo_(\d+)", name)
    return (int(match.group(1)) if match else -1, name)


class RobomimicSource:
    """An open robomimic HDF5 file, checked; :meth:`episodes` reads one demo at a time."""

    def __init__(
        self, url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None
    ) -> None:
        self.location = Location.from_url(url, storage_options)
        if not self.location.exists():
            raise DatasetFileNotFoundError(f"{self.location.url} does not exist")
        self._handle = self.location.fs.open(self.location.path, "rb")
        try:
            self.file = h5py.File(self._handle, "r")
        except OSError as exc:
            self._handle.close()
            raise UnsupportedDatasetError(
                f"{self.location.url} is not an HDF5 file: {exc}"
            ) from exc
        if "data" not in self.file:
            found = sorted(self.file.keys())
            self.close()
            raise UnsupportedDatasetError(
                f"{self.location.url}: no 'data' group, so not a robomimic dataset (it holds "
                f"{found})"
            )
        self.demos = sorted(self.file["data"].keys(), key=_demo_order)
        try:
            for demo in self.demos:
                self._check_lengths(demo)
        except (DatasetMismatchError, UnsupportedDatasetError):
            self.close()
            raise

    def _check_lengths(self, demo: str) -> None:
        group = self.file["data"][demo]
        if "num_samples" not in group.attrs:
            raise UnsupportedDatasetError(f"{self.location.url}: data/{demo} has no num_samples")
        expected = int(group.attrs["num_samples"])
        for name, dataset in _datasets(group):
            if dataset.shape[:1] != (expected,):
                raise DatasetMismatchError(
                    f"{self.location.url}: data/{demo}/{name} has {dataset.shape[0]} rows, "
                    f"num_samples says {expected}"
                )

    def metadata(self) -> dict[str, Any]:
        """What the import records of the file: env_args, demo names, masks, attributes."""
        data = self.file["data"]
        masks = {
            name: [bytes(v).decode() for v in self.file["mask"][name][()]]
            for name in (self.file["mask"].keys() if "mask" in self.file else [])
        }
        env_args = data.attrs.get("env_args")
        return {
            "format": "robomimic",
            "url": self.location.url,
            "env_args": None if env_args is None else str(env_args),
            "demos": list(self.demos),
            "masks": masks,
            "synthesized": sorted(self._synthesized()),
        }

    def _synthesized(self) -> set[str]:
        """Keys the import fills in because the file's demos lack them."""
        if not self.demos:
            return set()
        group = self.file["data"][self.demos[0]]
        made = {"rewards", "dones"} - set(group.keys())
        if "next_obs" not in group:
            made.add("next_obs")
        return made

    def episodes(self) -> Iterator[dict[str, np.ndarray]]:
        """Each demo's arrays by flat trajectory key (see the module docs)."""
        for demo in self.demos:
            group = self.file["data"][demo]
            length = int(group.attrs["num_samples"])
            fields: dict[str, np.ndarray] = {}
            for name, dataset in _datasets(group):
                fields[_flat_key(name)] = dataset[()]
            if "next_obs" not in group:
                for key in [k for k in fields if k.startswith("curr_obs/")]:
                    fields["next_obs/" + key.removeprefix("curr_obs/")] = shifted(fields[key])
            fields.setdefault("rewards", np.zeros(length, dtype=np.float32))
            if "dones" not in fields:
                ends = np.zeros(length, dtype=bool)
                ends[-1] = True
                fields["dones"] = ends
            yield fields

    def close(self) -> None:
        """Close the file."""
        self.file.close()
        self._handle.close()


def _datasets(group: h5py.Group) -> Iterator[tuple[str, h5py.Dataset]]:
    """``(path below the demo, dataset)`` for every dataset of a demo group, sorted."""
    found: list[tuple[str, h5py.Dataset]] = []
    group.visititems(
        lambda name, item: found.append((name, item)) if isinstance(item, h5py.Dataset) else None
    )
    return iter(sorted(found, key=lambda pair: pair[0]))


def _flat_key(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    if name.startswith("obs/"):
        return "curr_obs/" + name.removeprefix("obs/")
    if name.startswith("next_obs/"):
        return name
    return "forward_inputs/" + name


def _dataset_name(key: str) -> str | None:
    """The demo-level dataset of a flat key; ``None`` for keys robomimic has no place for."""
    if key in _TOP.values():
        return key
    for prefix, into in (
        ("curr_obs/", "obs/"),
        ("next_obs/", "next_obs/"),
        ("forward_inputs/", ""),
    ):
        if key.startswith(prefix) and key.count("/") == 1:
            return into + key.removeprefix(prefix)
    return None


def _write_demo(group: h5py.Group, episode: StoredEpisode, synthesized: set[str]) -> int:
    length = 0
    for key, rows in episode.fields.items():
        name = _dataset_name(key)
        if name is None or key in synthesized or key.split("/")[0] in synthesized:
            continue
        group.create_dataset(name, data=rows)
        length = len(rows)
    group.attrs["num_samples"] = length
    return length


def _write_demos(
    out: h5py.File,
    episodes: Iterable[StoredEpisode],
    recorded: Mapping[str, Any],
    synthesized: set[str],
    names: list[str],
    progress: bool,
) -> int:
    """Every episode as ``data/<demo>``, then the file's attributes and masks; the count."""
    data = out.create_group("data")
    total = count = 0
    for position, episode in enumerate(
        tqdm(episodes, desc="export", unit="demo", disable=not progress)
    ):
        count += 1
        name = names[position] if position < len(names) else f"demo_{position}"
        total += _write_demo(data.create_group(name), episode, synthesized)
    data.attrs["total"] = total
    data.attrs["env_args"] = recorded.get("env_args") or json.dumps(_GENERIC_ENV)
    for mask, demos in (recorded.get("masks") or {}).items():
        out.create_dataset(f"mask/{mask}", data=np.array(demos, dtype="S"))
    return count


def export_robomimic(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str],
    *,
    include_incomplete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> tuple[int, int]:
    """Write the store at ``source`` as a new robomimic HDF5 file.

    Returns the demo count and the number of incomplete episodes left out.
    """
    location = Location.from_url(destination, destination_options)
    if location.exists():
        raise StoreExistsError(f"{location.url} already exists; export writes only a new file")
    episodes = read_episodes(source, storage_options, include_incomplete=include_incomplete)
    recorded = episodes.documents.metadata.get(SOURCE_KEY) or {}
    from_robomimic = recorded.get("format") == "robomimic"
    synthesized = set(recorded.get("synthesized", [])) if from_robomimic else set()
    names = list(recorded["demos"]) if from_robomimic else []
    try:
        location.fs.makedirs(posixpath.dirname(location.path), exist_ok=True)
        # HDF5 reads back what it wrote as the file grows: a local file is written in place,
        # another location gets a local temporary file, uploaded when complete.
        with contextlib.ExitStack() as stack:
            if location.is_local:
                path = location.path
            else:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rbzarr-hdf5-"))
                path = os.path.join(folder, "export.hdf5")
            with h5py.File(path, "w") as out:
                count = _write_demos(out, episodes, recorded, synthesized, names, progress)
            if not location.is_local:
                location.fs.put_file(path, location.path)
    except BaseException:
        location.delete()
        raise
    return count, episodes.left_out
