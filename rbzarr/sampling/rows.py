"""A sampled batch's rows: the cache's hits placed, its misses planned and read from storage.

A sampled batch is a list of ``(trajectory id, flat row)`` pairs, some served by the cache
(*hits*), the rest (*misses*) by a trajectory still waiting for its write (*pending*: its
flat rows ``{key: [T*B, ...]}`` are read from memory, with no re-validation) or by the
store.  :func:`plan_misses` runs under the buffer's lock: two stable radix sorts group the
misses by trajectory (rows ascending inside each), as one
:class:`~rbzarr.storage.row_groups.RowGroups`, and it snapshots what the read needs (index
entries, pending trajectories).  :func:`read_batch` then runs without the lock: every row
lands straight at its place in one preallocated ``[n, ...]`` tensor per key.  The store's
rows go first, and may write the other rows (a key held in one region is gathered straight
into the batch in its order, with no copy to scatter); the cached and pending rows are put
over them after, with one ``index_copy_`` per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.row_groups import RowGroups
from rbzarr.trajectory.dtypes import dtype_from_name
from rbzarr.trajectory.model import Schema

__all__ = ["MissPlan", "all_cached", "plan_misses", "read_batch"]


@dataclass(frozen=True)
class MissPlan:
    """What :func:`read_batch` needs, snapshotted under the buffer's lock."""

    count: int  # the batch size n
    hit_positions: torch.Tensor  # batch positions the cache serves (int64)
    cached: dict[str, torch.Tensor]  # their rows, {key: [hits, ...]}
    schema: Schema
    misses: RowGroups  # the other rows, grouped by trajectory
    pending: list[Mapping[str, torch.Tensor] | None]  # per group: its pending flat rows


_NOTHING = np.empty(0, dtype=np.int64)
_NO_MISSES = RowGroups([], _NOTHING, _NOTHING, np.zeros(1, dtype=np.int64))


def all_cached(cached: dict[str, torch.Tensor], schema: Schema) -> MissPlan:
    """The plan of a batch the cache serves whole: ``cached`` holds its rows in batch order."""
    count = len(next(iter(cached.values())))
    return MissPlan(count, torch.arange(count), cached, schema, _NO_MISSES, [])


def plan_misses(
    ids: torch.Tensor,
    rows: torch.Tensor,
    hit: torch.Tensor,
    cached: dict[str, torch.Tensor],
    schema: Schema,
    entries: Mapping[int, Entry],
    pending: Mapping[int, Mapping[str, torch.Tensor]],
    window: Sequence[Entry] | None = None,
    slots: torch.Tensor | None = None,
) -> MissPlan:
    """Group a batch's missed rows by trajectory, with their entries (call under the lock).

    With ``window`` (the entries drawn from, in window order) and ``slots`` (each row's
    trajectory position in it) the groups carry their window positions, so that the store
    finds each trajectory's handles by position.
    """
    hit_np = hit.numpy()
    miss = np.flatnonzero(~hit_np)
    miss_ids = ids.numpy()[miss]
    # By trajectory, and by row inside each: every shard is then read in address order
    # (~1.7x faster gathers than random order, measured on 4,096 state rows).
    order = np.argsort(_sort_keys(rows.numpy()[miss]), kind="stable")
    order = order[np.argsort(_sort_keys(miss_ids[order]), kind="stable")]
    positions = miss[order]
    sorted_ids = miss_ids[order]
    bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
    bounds = np.concatenate(([0], bounds, [len(sorted_ids)])) if len(sorted_ids) else bounds[:1]
    firsts = sorted_ids[bounds[:-1]].tolist()
    picked = rows.numpy()[positions].astype(np.int64, copy=False)
    if window is None or slots is None:
        misses = RowGroups([entries[tid] for tid in firsts], picked, positions, bounds)
    else:
        group_slots = slots.numpy()[positions[bounds[:-1]]]
        drawn = list(map(window.__getitem__, group_slots.tolist()))
        misses = RowGroups(drawn, picked, positions, bounds, window=window, slots=group_slots)
    return MissPlan(
        count=len(hit_np),
        hit_positions=torch.from_numpy(np.flatnonzero(hit_np)),
        cached=cached,
        schema=schema,
        misses=misses,
        pending=[pending.get(tid) for tid in firsts] if pending else [None] * len(firsts),
    )


def _sort_keys(ids: np.ndarray) -> np.ndarray:
    """Keys that sort like ``ids``: as ``uint16`` offsets where their span allows (numpy
    sorts those with a radix sort, ~6x faster than int64 for a batch)."""
    if len(ids) == 0:
        return ids
    low = ids.min()
    return (ids - low).astype(np.uint16) if int(ids.max()) - int(low) < 1 << 16 else ids


def read_batch(plan: MissPlan, store: TrajectoryLayout | None) -> dict[str, torch.Tensor]:
    """The flat batch ``{key: [n, ...]}`` of ``plan`` (``store`` is needed for stored misses)."""
    if len(plan.hit_positions) == plan.count:
        return dict(plan.cached)  # all from the cache, already in batch order
    out = {
        key: torch.empty((plan.count, *trailing), dtype=dtype_from_name(dtype))
        for key, (dtype, trailing) in plan.schema.items()
    }
    misses = plan.misses
    # Usually no trajectory drawn is still being written: no loop over the groups then.
    writing = plan.pending.count(None) < len(plan.pending)
    if writing:
        stored = [flats is None for flats in plan.pending]
        keep = np.repeat(stored, np.diff(misses.bounds))
        bounds = np.zeros(sum(stored) + 1, dtype=np.int64)
        np.cumsum(np.diff(misses.bounds)[stored], out=bounds[1:])
        entries = [entry for entry, own in zip(misses.entries, stored, strict=True) if own]
        misses = RowGroups(entries, misses.rows[keep], misses.positions[keep], bounds)
    if len(misses):  # first: the read may write the other rows, which are filled below
        assert store is not None
        store.read_groups_into(replace(misses, others_scratch=True), list(plan.schema), out)
    if len(plan.hit_positions):
        for key, tensor in out.items():
            tensor.index_copy_(0, plan.hit_positions, plan.cached[key])
    for g, flats in enumerate(plan.pending if writing else []):
        if flats is not None:
            rows, positions = (torch.from_numpy(a) for a in plan.misses.group(g))
            for key, tensor in out.items():
                tensor.index_copy_(0, positions, flats[key].index_select(0, rows))
    return out
