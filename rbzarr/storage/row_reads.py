"""The miss-read path of sampling: rows that are not in the cache, read from storage.

A sampled batch is a list of ``(trajectory id, flat row)`` pairs, some served by the cache
(*hits*), the rest (*misses*) by a trajectory still waiting for its write (*pending*) or by
the store.  :func:`plan_misses` runs under the buffer's lock and snapshots what the read
needs (index entries, pending trajectories); :func:`read_batch` then runs without the lock:
it reads the missed rows and assembles the batch into preallocated ``[n, ...]`` tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rbzarr.dtypes import dtype_from_name
from rbzarr.storage.layout import Entry, TrajectoryLayout
from rbzarr.trajectory import Schema

__all__ = ["MissPlan", "plan_misses", "read_batch"]


@dataclass(frozen=True)
class _Group:
    """The missed rows of one trajectory: where they go in the batch, which rows they are."""

    where: torch.Tensor
    entry: Entry
    rows: torch.Tensor
    pending: Mapping[str, torch.Tensor] | None


@dataclass(frozen=True)
class MissPlan:
    """Everything :func:`read_batch` needs, snapshotted under the buffer's lock.

    ``count`` is the batch size, ``hit`` the batch positions served by the cache and
    ``cached`` their rows (``{key: [hits, ...]}``, empty when there are none).
    """

    count: int
    hit: torch.Tensor
    cached: dict[str, torch.Tensor]
    schema: Schema
    groups: list[_Group]


def plan_misses(
    ids: torch.Tensor,
    rows: torch.Tensor,
    hit: torch.Tensor,
    cached: dict[str, torch.Tensor],
    schema: Schema,
    entries: Mapping[int, Entry],
    pending: Mapping[int, Mapping[str, torch.Tensor]],
) -> MissPlan:
    """Group the missed rows of a batch by trajectory (call under the buffer's lock).

    Parameters
    ----------
    ids, rows
        Trajectory id and flat row of every sampled position (int64, length ``n``).
    hit
        Boolean mask of the positions the cache serves; ``cached`` holds their rows.
    schema
        The buffer's schema (flat key -> dtype name and trailing shape).
    entries
        Index entries by trajectory id; every missed id must be present.
    pending
        Flat rows (``{key: [T*B, ...]}``) of trajectories accepted but not yet written,
        by id: their rows are read from memory, with no re-validation.

    Returns
    -------
    MissPlan
        The plan for :func:`read_batch`.
    """
    groups = []
    miss_positions = (~hit).nonzero().squeeze(1)
    miss_ids = ids[miss_positions]
    for trajectory_id in torch.unique(miss_ids).tolist():
        where = miss_positions[miss_ids == trajectory_id]
        groups.append(
            _Group(where, entries[trajectory_id], rows[where], pending.get(trajectory_id))
        )
    return MissPlan(len(ids), hit, cached, schema, groups)


def read_batch(plan: MissPlan, store: TrajectoryLayout | None) -> dict[str, torch.Tensor]:
    """Read the missed rows of ``plan`` and assemble the flat batch (without the lock).

    Parameters
    ----------
    plan
        From :func:`plan_misses`.
    store
        The layout holding the written trajectories; needed when any missed trajectory
        is not pending.

    Returns
    -------
    dict
        ``{flat key: tensor[n, ...]}`` in schema order, fresh tensors.
    """
    return _assemble(plan, _read_misses(plan, store))


def _read_misses(
    plan: MissPlan, store: TrajectoryLayout | None
) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    keys = list(plan.schema)
    reads = []
    stored = []
    for group in plan.groups:
        if group.pending is None:
            stored.append(group)
            continue
        flat = group.pending
        reads.append((group.where, {k: flat[k].index_select(0, group.rows) for k in keys}))
    if stored:
        assert store is not None
        requests = [(group.entry, group.rows) for group in stored]
        values = store.read_rows_many(requests, keys)
        reads.extend((group.where, v) for group, v in zip(stored, values, strict=True))
    return reads


def _assemble(
    plan: MissPlan, reads: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]
) -> dict[str, torch.Tensor]:
    out = {
        key: torch.empty((plan.count, *trailing), dtype=dtype_from_name(dtype))
        for key, (dtype, trailing) in plan.schema.items()
    }
    hit_positions = plan.hit.nonzero().squeeze(1)
    for key, tensor in out.items():
        if plan.cached:
            tensor.index_copy_(0, hit_positions, plan.cached[key])
        for where, values in reads:
            tensor.index_copy_(0, where, values[key])
    return out
