"""A sampled batch's rows: the cache's hits placed, its misses planned and read from storage.

A sampled batch is a list of ``(trajectory id, flat row)`` pairs, some served by the cache
(*hits*), the rest (*misses*) by a trajectory still waiting for its write (*pending*: its
flat rows ``{key: [T*B, ...]}`` are read from memory, with no re-validation) or by the
store.  :func:`plan_misses` runs under the buffer's lock: one stable argsort groups the
misses by trajectory, and it snapshots what the read needs (index entries, pending
trajectories).  :func:`read_batch` then runs without the lock: every row lands straight
at its place in one preallocated ``[n, ...]`` tensor per key (cached rows with one
assignment per key, each (trajectory, key) of the misses with one gather or one batch of
pieces), with no permutation pass afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from rbzarr.storage.documents import Entry
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.trajectory.dtypes import byte_rows, dtype_from_name
from rbzarr.trajectory.model import Schema

__all__ = ["MissPlan", "all_cached", "plan_misses", "read_batch"]


@dataclass(frozen=True)
class _Group:
    """The missed rows of one trajectory: ``[start, stop)`` of the sorted misses."""

    entry: Entry
    start: int
    stop: int
    pending: Mapping[str, torch.Tensor] | None


@dataclass(frozen=True)
class MissPlan:
    """What :func:`read_batch` needs, snapshotted under the buffer's lock."""

    count: int  # the batch size n
    hit_positions: torch.Tensor  # batch positions the cache serves (int64)
    cached: dict[str, torch.Tensor]  # their rows, {key: [hits, ...]}
    schema: Schema
    miss_positions: torch.Tensor  # the other positions, sorted by trajectory (int64)
    miss_rows: torch.Tensor  # their flat rows, in the same order
    groups: list[_Group]


def all_cached(cached: dict[str, torch.Tensor], schema: Schema) -> MissPlan:
    """The plan of a batch the cache serves whole: ``cached`` holds its rows in batch order."""
    count = len(next(iter(cached.values())))
    nothing = torch.empty(0, dtype=torch.int64)
    return MissPlan(count, torch.arange(count), cached, schema, nothing, nothing, [])


def plan_misses(
    ids: torch.Tensor,
    rows: torch.Tensor,
    hit: torch.Tensor,
    cached: dict[str, torch.Tensor],
    schema: Schema,
    entries: Mapping[int, Entry],
    pending: Mapping[int, Mapping[str, torch.Tensor]],
) -> MissPlan:
    """Group a batch's missed rows by trajectory, with their entries (call under the lock)."""
    hit_np = hit.numpy()
    miss = np.flatnonzero(~hit_np)
    miss_ids = ids.numpy()[miss]
    order = np.argsort(miss_ids, kind="stable")
    positions = miss[order]
    sorted_ids = miss_ids[order]
    starts = np.flatnonzero(np.diff(sorted_ids)) + 1
    bounds = [0, *starts.tolist(), len(sorted_ids)] if len(sorted_ids) else [0]
    firsts = sorted_ids[bounds[:-1]].tolist()
    groups = [
        _Group(entries[tid], lo, hi, pending.get(tid))
        for tid, lo, hi in zip(firsts, bounds[:-1], bounds[1:], strict=True)
    ]
    return MissPlan(
        count=len(hit_np),
        hit_positions=torch.from_numpy(np.flatnonzero(hit_np)),
        cached=cached,
        schema=schema,
        miss_positions=torch.from_numpy(positions),
        miss_rows=torch.from_numpy(rows.numpy()[positions]),
        groups=groups,
    )


def read_batch(plan: MissPlan, store: TrajectoryLayout | None) -> dict[str, torch.Tensor]:
    """The flat batch ``{key: [n, ...]}`` of ``plan`` (``store`` is needed for stored misses)."""
    if len(plan.hit_positions) == plan.count:
        return dict(plan.cached)  # all from the cache, already in batch order
    out = {
        key: torch.empty((plan.count, *trailing), dtype=dtype_from_name(dtype))
        for key, (dtype, trailing) in plan.schema.items()
    }
    hits = plan.hit_positions.numpy()
    if len(hits):
        for key, tensor in out.items():
            _records(tensor)[hits] = _records(plan.cached[key])
    stored = []
    sizes = [group.stop - group.start for group in plan.groups]
    split_rows = plan.miss_rows.split(sizes)  # one call for every group's views
    split_positions = plan.miss_positions.split(sizes)
    for group, rows, positions in zip(plan.groups, split_rows, split_positions, strict=True):
        if group.pending is None:
            stored.append((group.entry, rows, positions))
            continue
        for key, tensor in out.items():
            tensor.index_copy_(0, positions, group.pending[key].index_select(0, rows))
    if stored:
        assert store is not None
        store.read_rows_into(stored, list(plan.schema), out)
    return out


def _records(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's rows as one numpy record each (copied in and out ~2x faster than bytes)."""
    rows = byte_rows(tensor)
    return rows.view(np.dtype((np.void, rows.shape[1]))).reshape(-1) if rows.shape[1] else rows
