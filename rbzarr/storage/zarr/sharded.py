"""One opened trajectory: its group's description, open shards, and reads into a batch.

The trajectory group's attributes carry ``rbzarr_layout: {"version": 2, "arrays": {key:
description}}`` (see :mod:`rbzarr.storage.zarr.encode`), so opening a trajectory reads one
document and then each shard's index; arrays of kind ``"zarr"`` (zero-size, 0-d, or a
compressor other than zstd) are opened and read through zarr (:mod:`rbzarr.storage.zarr.arrays`),
as is every array of a layout-1 group (no description).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.array import AsyncArray

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.files import read_regular
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.zarr import next_obs
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.chunking import KeyPlan
from rbzarr.storage.zarr.describe import LAYOUT_ATTR
from rbzarr.storage.zarr.encode import encode_array, shard_key
from rbzarr.storage.zarr.local import LocalShard, RowRead, decode_whole, plan_rows, read_local
from rbzarr.storage.zarr.remote import (
    INLINE,
    RemoteShard,
    fetch_rows,
    inline_copy,
    open_inline,
    open_remote,
)
from rbzarr.storage.zarr.spec import FILL, ArraySpec, check_document, parse_specs
from rbzarr.trajectory.dtypes import storage_dtype

if TYPE_CHECKING:
    import torch

__all__ = [
    "LAYOUT_ATTR",
    "RowBatch",
    "ShardedTrajectory",
    "describe_sharded",
    "encode_trajectory",
    "open_pending",
    "read_whole_shards",
]

VERSION = 2


@dataclass(frozen=True)
class ShardedTrajectory:
    """Open handles of one committed trajectory (immutable once built).

    Parameters
    ----------
    group
        The trajectory group's path below the root (``trajectories/<id>``).
    T, B
        Time steps and environments, from the index entry.
    dtypes
        The dtype name of every flat key (``"float32"``, ``"bfloat16"``), in the
        trajectory's field order.
    specs
        The layout description of every key; ``None`` for arrays zarr reads.
    local
        Open local shards by key (local stores).
    remote
        Shards with fetched indexes by key (object stores).
    arrays
        zarr's array handles of the keys whose spec is ``None``.
    described
        Whether the group carries a layout description (layout 2); a layout-1 group has
        none, and every key is read by zarr.
    plans
        Row-read plans by key tuple, filled on first use (a cache, not compared).
    member, members
        A trajectory of a pack (:mod:`rbzarr.storage.zarr.packs`) is member ``member`` of
        the ``members`` whose rows the pack's arrays hold end to end: ``group`` and the
        shards are the pack's, ``T`` the member's own.  ``0, 1``: the group is the
        trajectory's own.
    """

    group: str
    T: int
    B: int
    dtypes: dict[str, str]
    specs: dict[str, ArraySpec | None]
    local: dict[str, LocalShard] = field(default_factory=dict)
    remote: dict[str, RemoteShard] = field(default_factory=dict)
    arrays: dict[str, AsyncArray[Any]] = field(default_factory=dict)
    described: bool = True
    plans: dict[tuple[str, ...], Any] = field(default_factory=dict, compare=False)
    member: int = 0
    members: int = 1

    @property
    def files(self) -> int:
        """Open file descriptors held."""
        return len(self.local)

    def shape(self, key: str) -> tuple[int, ...]:
        """The stored shape of ``key`` (a pack member's: its own rows)."""
        spec = self.specs[key]
        shape = spec.logical_shape if spec is not None else tuple(self.arrays[key].shape)
        if self.members == 1 or not shape:
            return shape
        return (shape[0] // self.members, *shape[1:])

    def first_element(self, key: str) -> int:
        """The element (``raw_t * B + b``) of the stored array where this trajectory's row 0
        of ``key`` is: 0, or a pack member's offset into its pack."""
        if self.member == 0:
            return 0
        return self.member * self.shape(key)[0] * self.B

    def member_view(self, member: int, members: int, T: int) -> ShardedTrajectory:
        """Member ``member`` of ``members`` of this pack's handles (shards shared), of ``T``
        steps."""
        return replace(self, T=T, member=member, members=members, plans={})


def encode_trajectory(
    fields: Mapping[str, torch.Tensor],
    plans: Mapping[str, KeyPlan],
    T: int,
    B: int,
    separator: str = "/",
    inline: bool = True,
    staging: Mapping[str, np.ndarray] | None = None,
    copies: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, list[Any]], dict[str, Any], dict[str, Any]]:
    """Encode the ``mapped`` and ``chunked`` fields of one trajectory as shards, their chunk
    keys joined by ``separator``: the shards' files, the layout description and each array's
    ``zarr.json`` document (parsed; the group's document consolidates them).  ``inline``
    copies small shards into the description (for object stores: opening them then costs no
    request).  ``staging``: the buffers the fields were copied into on add, and ``copies``
    the copies' numpy arrays, by key (:func:`~rbzarr.storage.zarr.encode.encode_array`)."""
    staging = staging or {}
    copies = copies or {}
    files: dict[str, list[Any]] = {}
    documents: dict[str, Any] = {}
    arrays: dict[str, Any] = {}
    for key, value in fields.items():
        plan = plans[key]
        if plan.by_zarr:
            arrays[key] = {"kind": "zarr"}
            continue
        shared: dict[str, Any] = {}
        stored = value
        pair = next_obs.pair_of(key, fields, plans, T)
        if pair is not None:
            explicit = next_obs.differing_rows(value, fields[pair])
            if len(explicit) <= T * B // 2:  # stored once: only the rows that differ
                import torch  # noqa: PLC0415 (writing: the trajectory's tensors)

                rows = value.reshape(T * B, *value.shape[2:])[torch.from_numpy(explicit)]
                stored = rows.reshape(len(explicit), 1, *value.shape[2:])
                shared = next_obs.describe(explicit, pair, T, B)
        array = copies.get(key) if stored is value else None  # not rows picked from it
        encoded = encode_array(key, stored, plan, T, B, separator, staging.get(key), array)
        documents[key] = _parsed(encoded.document)
        arrays[key] = {**encoded.description, **shared}
        copy = inline_copy(encoded.shard) if inline or encoded.fill else None
        if encoded.fill and copy is not None:  # no shard object: zarr reads its fill values
            arrays[key] = {**arrays[key], FILL: True, INLINE: copy}
            continue
        files[f"{key}/{shard_key(stored.dim(), separator)}"] = encoded.shard
        if copy is not None:
            arrays[key] = {**arrays[key], INLINE: copy}
    return files, {"version": VERSION, "arrays": arrays}, documents


@functools.lru_cache(maxsize=512)
def _parsed(document: bytes) -> dict[str, Any]:
    """An array's ``zarr.json``, parsed once per schema (callers only serialize it again)."""
    parsed: dict[str, Any] = json.loads(document)
    return parsed


def describe_sharded(
    location: Any,
    group: str,
    entry_shape: tuple[int, int],
    fields: Mapping[str, str],
    layout: Mapping[str, Any],
    members: Any,
    keys: Collection[str] | None = None,
) -> tuple[ShardedTrajectory, list[tuple[str, str, ArraySpec, str]]]:
    """A v2 trajectory from its group's attributes; local shards are opened here already,
    and remote ones whose description carries a copy (those of ``keys`` only, when given;
    the others stay unopened).  ``members``: the group's consolidated documents, else
    ``None`` (each array's document is a file)."""
    where = f"{location.url}/{group}"
    specs = parse_specs(layout, where)
    if list(specs) != list(fields):
        raise CorruptStoreError(
            f"{where}: the layout describes {sorted(specs)}, the fields are {sorted(fields)}"
        )
    T, B = entry_shape
    opened = ShardedTrajectory(group, T, B, dict(fields), specs)
    _check_shared(specs, where)
    if keys is not None:  # a shared next_obs key reads rows of its curr_obs key
        keys = {*keys, *(s.same_as for k, s in specs.items() if k in keys and s and s.same_as)}
    # The one gate (Location.child): every part a plain name, no link inside a local store.
    folder = location.child(*group.split("/"))
    pending = []
    for key, spec in specs.items():
        if spec is None or (keys is not None and key not in keys):
            continue
        _check_shape(spec, T, B, f"{where}/{key}", entry_shape)
        array = folder.child(*key.split("/"))
        path = array.join(*shard_key(len(spec.shape), spec.separator).split("/"))
        if location.is_local and not spec.fill:
            if isinstance(members, dict):
                document = members.get(key)
            else:
                raw = _read_file(array.join("zarr.json"))
                document = None if raw is None else read_json(raw, f"{where}/{key}/zarr.json")
            check_document(document, spec, f"{where}/{key}")
            opened.local[key] = LocalShard(path, spec, f"{where}/{key}")
        else:
            inline = open_inline(layout["arrays"][key], spec, path, f"{where}/{key}")
            if inline is None and spec.fill:
                raise CorruptStoreError(
                    f"{where}/{key}: described as all fill values (no shard stored) but its "
                    "description carries no copy of the shard"
                )
            if inline is None:
                pending.append((key, path, spec, f"{where}/{key}"))
            else:
                opened.remote[key] = inline
    return opened, pending


def _check_shared(specs: Mapping[str, ArraySpec | None], where: str) -> None:
    """A ``next_obs`` key stored once names a ``curr_obs`` key of its logical shape, dtype
    and codec, itself stored whole."""
    for key, spec in specs.items():
        if spec is None or not spec.same_as:
            continue
        pair = specs.get(spec.same_as)
        if (
            pair is None
            or pair.same_as
            or pair.shape != spec.logical_shape
            or pair.dtype != spec.dtype
            or (pair.kind, pair.codec, pair.image) != (spec.kind, spec.codec, spec.image)
        ):
            raise CorruptStoreError(
                f"{where}/{key}: stored once against {spec.same_as!r}, which does not match it"
            )


def open_pending(
    fs: Any,
    pending: Sequence[tuple[ShardedTrajectory, tuple[str, str, ArraySpec, str]]],
    source: ByteSource,
) -> None:
    """Open the remote shards :func:`describe_sharded` left, ``(handles, shard)`` pairs of
    several trajectories, every index fetched in one round (into ``handles.remote``)."""
    requests = [(path, spec, where) for _, (_, path, spec, where) in pending]
    opened_shards = open_remote(fs, requests, source)
    for (opened, (key, *_)), shard in zip(pending, opened_shards, strict=True):
        opened.remote[key] = shard


def _shard_path(location: Any, group: str, key: str, spec: ArraySpec) -> str:
    """A shard's path, through the one gate (Location.child)."""
    parts = [
        *group.split("/"),
        *key.split("/"),
        *shard_key(len(spec.shape), spec.separator).split("/"),
    ]
    return location.join(*parts)


def _check_shape(spec: ArraySpec, T: int, B: int, where: str, entry_shape: Any) -> None:
    if len(spec.shape) < 2:
        return
    rows, envs = spec.logical_shape[0], spec.logical_shape[1]
    if envs != B or rows < T or (rows > T and T % (rows - T) != 0):
        raise CorruptStoreError(
            f"{where}: shape {spec.shape} disagrees with the index entry's shape "
            f"{list(entry_shape)}"
        )


@dataclass
class RowBatch:
    """Rows of several trajectories' shards read by pieces (compressed, or remote), each
    landing at its final position in a uint8 ``[n, row_bytes]`` view of its key's output."""

    out: dict[str, np.ndarray]
    source: ByteSource
    gap: int
    local: list[tuple[LocalShard, RowRead]] = field(default_factory=list)
    remote: list[tuple[RemoteShard, RowRead]] = field(default_factory=list)
    # Rows of a key read for itself, by (trajectory handles' id, key): (elements, positions).
    own_rows: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # ``next_obs`` rows stored once, read from their ``curr_obs`` key's shard at :meth:`run`.
    borrowed: list[tuple[ShardedTrajectory, str, str, np.ndarray, np.ndarray]] = field(
        default_factory=list
    )

    def add(
        self, opened: ShardedTrajectory, key: str, elements: np.ndarray, positions: np.ndarray
    ) -> None:
        """Queue rows ``elements`` (``raw_t * B + b``) of a described, not memory-mapped
        ``key`` for rows ``positions`` of ``out[key]``."""
        if not len(positions):
            return
        spec = opened.specs[key]
        if spec is not None and spec.explicit is not None:
            own, stored_rows, borrowed = next_obs.split_elements(spec.explicit, opened.B, elements)
            self._add(opened, key, key, stored_rows, positions[own])
            if len(borrowed):
                self.borrowed.append((opened, spec.same_as, key, borrowed, positions[~own]))
            return
        self.own_rows[id(opened), key] = (elements, positions)
        self._add(opened, key, key, elements, positions)

    def _add(
        self,
        opened: ShardedTrajectory,
        source: str,
        key: str,
        elements: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        """Queue rows ``elements`` of ``source``'s shard for rows ``positions`` of ``out[key]``."""
        if not len(positions):
            return
        out = self.out[key]
        shard = opened.local.get(source)
        if shard is not None:
            read = plan_rows(shard.spec, shard.index, elements, out, positions, shard.where)
            self.local.append((shard, read))
            return
        remote = opened.remote[source]
        read = plan_rows(remote.spec, remote.index, elements, out, positions, remote.where)
        self.remote.append((remote, read))

    def run(self, fs: Any) -> None:
        """Land every queued piece: local ones with ``pread``, remote ones (on ``fs``) in one
        round; then the borrowed rows that the batch read for their ``curr_obs`` key too."""
        copies = [self._borrow(*request) for request in self.borrowed]
        if self.local:
            read_local(self.local, self.source)
        if self.remote:
            fetch_rows(fs, self.remote, self.source, self.gap)
        for key, targets, source, sources in copies:
            self.out[key][targets] = self.out[source][sources]

    def _borrow(
        self,
        opened: ShardedTrajectory,
        source: str,
        key: str,
        elements: np.ndarray,
        positions: np.ndarray,
    ) -> tuple[str, np.ndarray, str, np.ndarray]:
        """Queue the borrowed rows of ``source`` the batch does not read for ``source``
        itself; the others are copied from those rows once landed (a frame decoded once):
        ``(key, their positions, source, the positions to copy from)``."""
        own = self.own_rows.get((id(opened), source))
        if own is None:
            self._add(opened, source, key, elements, positions)
            return key, positions[:0], source, positions[:0]
        read, at = own
        order = np.argsort(read, kind="stable")
        found = np.minimum(np.searchsorted(read[order], elements), len(read) - 1)
        hit = read[order][found] == elements
        self._add(opened, source, key, elements[~hit], positions[~hit])
        return key, positions[hit], source, at[order][found[hit]]


def read_whole_shards(
    location: Any, opened: ShardedTrajectory, keys: Sequence[str]
) -> dict[str, np.ndarray]:
    """Whole arrays of the described ``keys`` (each shard fetched in one read); a
    ``next_obs`` key stored once is rebuilt from its rows and its ``curr_obs`` key."""
    wanted = list(keys)
    shared = {key: _spec(opened, key) for key in wanted if _spec(opened, key).same_as}
    keys = [*wanted, *{s.same_as for s in shared.values()} - set(wanted)]
    paths = [_shard_path(location, opened.group, key, _spec(opened, key)) for key in keys]
    blobs: list[Any] = [None] * len(keys)
    remote = []
    for position, key in enumerate(keys):
        local = opened.local.get(key)
        held = opened.remote.get(key)
        if held is not None and held.data is not None:  # a copy in the description
            blobs[position] = held.data
        elif location.is_local:
            blobs[position] = _read_file(paths[position])
        elif local is not None:  # a local copy of a remote shard (unless evicted since)
            blobs[position] = _read_file(local.path)
        if blobs[position] is None and not location.is_local:
            remote.append(position)
    if remote:
        nbytes = sum(
            math.prod(opened.shape(keys[p])) * storage_dtype(opened.dtypes[keys[p]]).itemsize
            for p in remote
        )
        found = location.fs.cat(
            [paths[p] for p in remote],
            on_error="return",
            **deadline_options(location.fs, nbytes),
        )
        for position in remote:
            path = paths[position]
            blobs[position] = found[path] if isinstance(found, dict) else found
    out = {}
    for key, blob in zip(keys, blobs, strict=True):
        where = f"{location.url}/{opened.group}/{key}"
        if isinstance(blob, FileNotFoundError) or blob is None:
            raise CorruptStoreError(f"{where}: the shard is missing")
        if isinstance(blob, BaseException):
            raise blob
        out[key] = decode_whole(_spec(opened, key), bytes(blob), where)
    for key, spec in shared.items():
        assert spec.explicit is not None
        out[key] = next_obs.rebuild(out[key], out[spec.same_as], spec.explicit)
    return {key: _own_rows(opened, key, out[key]) for key in wanted}


def _own_rows(opened: ShardedTrajectory, key: str, whole: np.ndarray) -> np.ndarray:
    """The trajectory's rows of the whole array ``whole`` of ``key`` (a pack member's share)."""
    if opened.members == 1:
        return whole
    rows = opened.shape(key)[0]
    return whole[opened.member * rows : (opened.member + 1) * rows]


def _spec(opened: ShardedTrajectory, key: str) -> ArraySpec:
    spec = opened.specs[key]
    assert spec is not None
    return spec


def _read_file(path: str) -> bytes | None:
    try:
        return read_regular(path)
    except (FileNotFoundError, IsADirectoryError):
        return None
