"""A sampled batch's rows: the cache's hits placed, its misses planned and read from storage.

A sampled batch is a list of ``(trajectory id, flat row)`` pairs, some served by the cache
(*hits*), the rest (*misses*) by a trajectory still waiting for its write (*pending*: its
flat rows ``{key: [T*B, ...]}`` are read from memory, with no re-validation) or by the
store.  :func:`plan_misses` runs under the buffer's lock: one stable sort groups the
misses by trajectory (rows ascending inside each), as one
:class:`~rbzarr.storage.row_groups.RowGroups`, and it snapshots what the read needs (index
entries, pending trajectories).  :func:`read_batch` then runs without the lock: every row
lands straight at its place in one preallocated ``[n, ...]`` tensor per key.  The store's
rows go first, and may write the other rows (a key held in one region is gathered straight
into the batch in its order, with no copy to scatter); the cached and pending rows are put
over them after, with one ``index_copy_`` per key.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.row_groups import DrawnRows, RowGroups
from rbzarr.trajectory.dtypes import dtype_from_name
from rbzarr.trajectory.model import Schema

__all__ = ["MissPlan", "all_cached", "plan_misses", "read_batch"]


@dataclass(frozen=True)
class MissPlan:
    """What :func:`read_batch` needs, snapshotted under the buffer's lock.

    A batch whose rows all come from the store keeps its draw (window, positions, rows) and
    groups it only when asked (:attr:`misses`, without the lock): a layout that reads rows
    by window position (:meth:`~rbzarr.storage.layout.TrajectoryLayout.read_drawn_into`)
    never needs the groups.
    """

    count: int  # the batch size n
    hit_positions: torch.Tensor  # batch positions the cache serves (int64)
    cached: dict[str, torch.Tensor]  # their rows, {key: [hits, ...]}
    schema: Schema
    grouped: tuple[RowGroups, list[Mapping[str, torch.Tensor] | None]] | None
    drawn: DrawnRows | None = None

    @property
    def misses(self) -> RowGroups:
        """The rows the cache does not serve, grouped by trajectory."""
        return self._grouped[0]

    @property
    def pending(self) -> list[Mapping[str, torch.Tensor] | None]:
        """Per group of :attr:`misses`: its pending flat rows (``None``: stored)."""
        return self._grouped[1]

    @functools.cached_property
    def _grouped(self) -> tuple[RowGroups, list[Mapping[str, torch.Tensor] | None]]:
        if self.grouped is not None:
            return self.grouped
        assert self.drawn is not None
        drawn = self.drawn
        misses = _groups(drawn.slots, drawn.rows, None, drawn.window)
        return misses, [None] * len(misses)


_NOTHING = np.empty(0, dtype=np.int64)
_NO_MISSES = RowGroups([], _NOTHING, _NOTHING, np.zeros(1, dtype=np.int64))


def all_cached(cached: dict[str, torch.Tensor], schema: Schema) -> MissPlan:
    """The plan of a batch the cache serves whole: ``cached`` holds its rows in batch order."""
    count = len(next(iter(cached.values())))
    return MissPlan(count, torch.arange(count), cached, schema, (_NO_MISSES, []))


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
    trajectory position in it) the groups are in window order and carry their window
    positions, so that the store finds each trajectory's handles by position; without,
    they are in id order.  A batch with no hit and nothing pending is grouped when first
    needed, outside the lock (the window's entries do not change).
    """
    hit_np = hit.numpy()
    hits = np.flatnonzero(hit_np)
    if window is not None and slots is not None and not len(hits) and not pending:
        drawn = DrawnRows(window, slots.numpy(), rows.numpy())
        return MissPlan(len(hit_np), torch.from_numpy(hits), cached, schema, None, drawn)
    miss = np.flatnonzero(~hit_np) if len(hits) else None
    if window is None or slots is None:
        misses = _groups(ids.numpy(), rows.numpy(), miss, None, entries)
        firsts = [int(entry["trajectory_id"]) for entry in misses.entries]
    else:
        misses = _groups(slots.numpy(), rows.numpy(), miss, window)
        firsts = ids.numpy()[misses.positions[misses.bounds[:-1]]].tolist() if pending else []
    held: list[Mapping[str, torch.Tensor] | None] = [pending.get(tid) for tid in firsts]
    if not pending:
        held = [None] * len(misses)
    return MissPlan(len(hit_np), torch.from_numpy(hits), cached, schema, (misses, held))


def _groups(
    owners: np.ndarray,
    flat: np.ndarray,
    miss: np.ndarray | None,
    window: Sequence[Entry] | None,
    entries: Mapping[int, Entry] | None = None,
) -> RowGroups:
    """The rows ``miss`` (``None``: all) grouped by their ``owners``: window positions in
    ``window``, or ids of ``entries``."""
    if miss is not None:
        owners, flat = owners[miss], flat[miss]
    # By trajectory, and by row inside each: every shard is then read in address order
    # (~1.7x faster gathers than random order, measured on 4,096 state rows).
    order = _file_order(owners, flat)
    positions = order if miss is None else miss[order]
    sorted_owners = owners[order]
    bounds = np.flatnonzero(sorted_owners[1:] != sorted_owners[:-1]) + 1
    bounds = np.concatenate(([0], bounds, [len(order)])) if len(order) else bounds[:1]
    picked = flat[order].astype(np.int64, copy=False)
    group_owners = sorted_owners[bounds[:-1]].astype(np.int64, copy=False)
    if window is None:
        assert entries is not None
        drawn = [entries[tid] for tid in group_owners.tolist()]
        return RowGroups(drawn, picked, positions, bounds, True)
    drawn = list(map(window.__getitem__, group_owners.tolist()))
    return RowGroups(drawn, picked, positions, bounds, True, window, group_owners)


def _file_order(owners: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The order that sorts rows by ``owners`` and by row inside each (stable): one sort
    of the keys ``owner << 32 | row`` where their spans allow, else two."""
    if len(owners) == 0:
        return np.zeros(0, dtype=np.int64)
    low = int(owners.min())
    if int(owners.max()) - low < 1 << 31 and int(rows.min()) >= 0 and int(rows.max()) < 1 << 32:
        return np.argsort(((owners - low) << 32) | rows, kind="stable")
    order = np.argsort(rows, kind="stable")
    return order[np.argsort(owners[order], kind="stable")]


def read_batch(plan: MissPlan, store: TrajectoryLayout | None) -> dict[str, torch.Tensor]:
    """The flat batch ``{key: [n, ...]}`` of ``plan`` (``store`` is needed for stored misses)."""
    if len(plan.hit_positions) == plan.count:
        return dict(plan.cached)  # all from the cache, already in batch order
    keys = list(plan.schema)
    out = {
        key: torch.empty((plan.count, *trailing), dtype=dtype_from_name(dtype))
        for key, (dtype, trailing) in plan.schema.items()
    }
    drawn = plan.drawn
    if drawn is not None and store is not None and store.read_drawn_into(drawn, keys, out):
        return out
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
        if not misses.others_scratch:
            misses = replace(misses, others_scratch=True)
        store.read_groups_into(misses, keys, out)
    if len(plan.hit_positions):
        for key, tensor in out.items():
            tensor.index_copy_(0, plan.hit_positions, plan.cached[key])
    for g, flats in enumerate(plan.pending if writing else []):
        if flats is not None:
            rows, positions = (torch.from_numpy(a) for a in plan.misses.group(g))
            for key, tensor in out.items():
                tensor.index_copy_(0, positions, flats[key].index_select(0, rows))
    return out
