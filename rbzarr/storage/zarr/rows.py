"""Sampled rows of zarr-layout trajectories, read into preallocated batch blocks.

Rows of several trajectories land in one call: shards through the layout's
:class:`~rbzarr.storage.zarr.byte_source.ByteSource` (memory-map gathers here, ``pread`` or
one round of byte ranges through a :class:`~rbzarr.storage.zarr.sharded.RowBatch`), arrays
that zarr reads (layout 1, or kind ``"zarr"``) through :func:`rbzarr.storage.zarr.arrays.read_rows`,
all of them in one concurrent round.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.core.array import AsyncArray

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.deadlines import sync
from rbzarr.storage.io.location import Location
from rbzarr.storage.row_groups import RowGroups
from rbzarr.storage.zarr import arrays
from rbzarr.storage.zarr.byte_source import ByteSource
from rbzarr.storage.zarr.handles import trajectory_id
from rbzarr.storage.zarr.local import PREFETCH_ROW_BYTES, LocalShard
from rbzarr.storage.zarr.regions import Region, record_dtype
from rbzarr.storage.zarr.sharded import RowBatch, ShardedTrajectory
from rbzarr.trajectory.dtypes import byte_rows

__all__ = [
    "RowPlans",
    "check_keys",
    "read_drawn_into",
    "read_rows_into",
    "reset_row_elements",
    "row_plans",
    "zarr_arrays",
]


def read_rows_into(
    location: Location,
    opened: Sequence[ShardedTrajectory],
    groups: RowGroups,
    keys: Sequence[str],
    out: Mapping[str, np.ndarray],
    out_dtypes: Mapping[str, str],
    source: ByteSource,
    range_gap: int,
    planned: RowPlans | None = None,
) -> None:
    """Fill rows ``groups.positions`` of ``out[key]`` with the grouped rows, for every key.

    ``out`` holds numpy arrays (the bits of dtype ``out_dtypes[key]``, as
    :func:`~rbzarr.trajectory.dtypes.to_numpy` holds them); a caller with tensors passes
    their numpy views, so torch stays at the buffer's side of the call.

    ``opened`` holds the handles of each group's trajectory, ``planned`` (when known) their
    :func:`row_plans`.  Keys whose shards sit in region bays
    (:mod:`rbzarr.storage.zarr.regions`) are read with one gather per key and region for the
    whole batch; other keys with at most one gather or one batch of pieces per (trajectory,
    key), every remote range in one round.  Every row is checked before any is read.
    Remote ranges of one object at most ``range_gap`` bytes apart are fetched as one.
    """
    if not len(groups):
        return
    plans, table = planned or row_plans(opened, keys, out, out_dtypes, location.url)
    views = {key: byte_rows(out[key]) for key in keys}
    which = groups.which()
    _check_rows(groups, table[:, 0] * table[:, 1], which)
    _gather_in_bays(plans, table, groups, which, views, source)
    if table[:, -1].any():  # some trajectory has keys in no bay
        _read_others(location, opened, plans, groups, out, views, source, range_gap)


def read_drawn_into(
    regions: Sequence[Region | None],
    numbers: np.ndarray,
    rows: np.ndarray,
    views: Mapping[str, np.ndarray],
    source: ByteSource,
) -> bool:
    """Fill row ``i`` of every ``views[key]`` with flat row ``rows[i]`` of the trajectory
    whose plan numbers are ``numbers[i]``, if every key of every row's trajectory sits in
    ``regions`` (one region per key, rows under a page): one gather per key, in file
    order, with no grouping.  ``False`` (nothing read) otherwise, or for a row outside its
    trajectory (the grouped read names it)."""
    count = len(views)
    bays = numbers[:, 2]
    if (
        not len(rows)
        or None in regions
        or any(region.row_bytes >= PREFETCH_ROW_BYTES for region in regions)  # type: ignore[union-attr]
        or numbers[:, -1].any()
        or (bays != bays[0]).any()
    ):
        return False
    if ((rows < 0) | (rows >= numbers[:, 0] * numbers[:, 1])).any():
        return False
    # In file order: by bay (a trajectory's shard), and by row inside each.
    order = np.argsort(numbers[:, 3] + rows, kind="stable")
    numbers, rows = numbers[order], rows[order]
    epochs = numbers[:, 3 + count : 3 + 2 * count]
    if epochs.any():  # reset rows to skip: per key
        chosen = numbers[:, 3 : 3 + count].T.copy()
        for column in range(count):
            chosen[column] += _reset_elements(rows, numbers, epochs[:, column])
    else:  # every key's region rows at once
        chosen = (numbers[:, 3 : 3 + count] + rows[:, None]).T.copy()
    for column, (view, region) in enumerate(zip(views.values(), regions, strict=True)):
        assert region is not None
        rows_of = byte_rows(view)
        records = rows_of.view(record_dtype(rows_of.shape[1])).reshape(-1)
        records[order] = source.gather(region.records, chosen[column])
    return True


# Each trajectory's row plan, and their ``numbers`` as one int64 table (a row each).
RowPlans = tuple[Sequence["_RowPlan"], np.ndarray]


def row_plans(
    opened: Sequence[ShardedTrajectory],
    keys: Sequence[str],
    out: Mapping[str, np.ndarray],
    out_dtypes: Mapping[str, str],
    url: str,
) -> RowPlans:
    """How ``keys`` of each of ``opened`` are read into ``out`` (kept on the handles)."""
    wanted = tuple(keys)
    plans: list[_RowPlan] = [
        handles.plans.get(wanted) or _first_plan(handles, keys, out, out_dtypes, url)
        for handles in opened
    ]
    # One row of numbers per trajectory, joined as bytes: one pass, no per-row numpy call.
    joined = b"".join([plan.numbers for plan in plans])
    return plans, np.frombuffer(joined, np.int64).reshape(len(plans), -1)


def _first_plan(
    handles: ShardedTrajectory,
    keys: Sequence[str],
    out: Mapping[str, np.ndarray],
    out_dtypes: Mapping[str, str],
    url: str,
) -> _RowPlan:
    """The plan of a trajectory's first batch of ``keys``, kept on its handles, once its rows
    are those of ``out`` (dtype named by ``out_dtypes``, trailing shape: else the store's
    schema says one thing, this trajectory's data another)."""
    check_keys(handles, keys, url, sampled=True)
    for key in keys:
        trailing = tuple(handles.shape(key)[2:])
        if handles.dtypes[key] != out_dtypes[key] or trailing != tuple(out[key].shape[1:]):
            raise CorruptStoreError(
                f"{url}/{handles.group}: field {key!r} holds {handles.dtypes[key]} rows of "
                f"{list(trailing)}, the store's schema says {out_dtypes[key]} rows of "
                f"{list(out[key].shape[1:])}"
            )
    plan = handles.plans[tuple(keys)] = _row_plan(handles, keys)
    return plan


def _read_others(
    location: Location,
    opened: Sequence[ShardedTrajectory],
    plans: Sequence[_RowPlan],
    groups: RowGroups,
    out: Mapping[str, np.ndarray],
    views: dict[str, np.ndarray],
    source: ByteSource,
    range_gap: int,
) -> None:
    """Rows of the keys in no region bay: per (trajectory, key) a gather, ``pread`` pieces,
    remote ranges (one round for all) or zarr's own read."""
    batch = RowBatch(views, source, range_gap)
    plain: list[Any] = []
    deferred: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for g, (plan, handles) in enumerate(zip(plans, opened, strict=True)):
        if not plan.others:
            continue
        flat, positions = groups.group(g)
        T, B = plan.T, plan.B
        elements = {0: flat}
        for key, local, epochs, array in plan.others:
            if array is not None:
                raw = reset_row_elements(flat // B, T, 1, int(array.shape[0]) - T)
                plain.append((array, key, raw, flat % B, positions))
                continue
            if epochs not in elements:
                elements[epochs] = reset_row_elements(flat, T, B, epochs)
            chosen = elements[epochs]
            if handles.member:  # a pack member's rows, where they are in its pack
                chosen = chosen + handles.first_element(key)
            if local is None or local.rows is None:
                batch.add(handles, key, chosen, positions)
            elif local.prefetches:
                local.prefetch(chosen)
                deferred.append((views[key], positions, local.rows, chosen))
            else:
                views[key][positions] = source.gather(local.rows, chosen)
    for view, chosen_targets, mapped, chosen in deferred:  # after every prefetch was issued
        view[chosen_targets] = source.gather(mapped, chosen)
    batch.run(location.fs)
    _read_plain(plain, out, location.url)


@dataclass(frozen=True, eq=False)
class _RowPlan:
    """How one trajectory's keys are read.

    Per key of the batch: the region holding its shard (``None`` if in no bay), the
    region row of its row 0 and its reset epochs; then the keys read otherwise, as ``(key,
    local shard or None (read by pieces when unmapped), reset epochs, zarr array or None)``.
    ``numbers`` is ``(T, B, bays, *first_rows, *epochs, others)`` as int64 bytes, one row of
    a batch's table; ``bays`` numbers the tuple of regions (0: no key in a bay), equal for
    trajectories whose keys sit in the same regions; ``others`` is 1 when some key is read
    otherwise.
    """

    T: int
    B: int
    regions: tuple[Region | None, ...]
    numbers: bytes
    others: list[tuple[str, LocalShard | None, int, Any]]


def _gather_in_bays(
    plans: Sequence[_RowPlan],
    table: np.ndarray,
    groups: RowGroups,
    which: np.ndarray,
    views: Mapping[str, np.ndarray],
    source: ByteSource,
) -> None:
    """Rows of every key in a bay: per key and region, one gather for all its trajectories.

    ``table`` holds the plans' ``numbers``, ``which`` the group of each row.  Where every
    trajectory's key is in one region and the batch's other rows are scratch, the gather
    lands straight in batch order (the other rows get the first row, to be overwritten).
    """
    bays = table[:, 2]
    if not bays.any():
        return
    count, flat, positions = len(views), groups.rows, groups.positions
    first_rows = table[:, 3 : 3 + count].T.copy()
    epochs = table[:, 3 + count : 3 + 2 * count].T.copy()
    same = bool((bays == bays[0]).all())
    elements: dict[bytes, np.ndarray] = {}  # by the epochs of every plan: one per kind of key
    reads: list[tuple[str, Region, np.ndarray, np.ndarray | None]] = []  # targets None: in order
    for column, key in enumerate(views):
        found = elements.get(epochs[column].tobytes())
        if found is None:
            found = _reset_elements(flat, table, epochs[column], which)
            elements[epochs[column].tobytes()] = found
        chosen = first_rows[column][which]
        chosen += found
        if same:
            region = plans[0].regions[column]
            if region is not None and groups.others_scratch and len(chosen):
                ordered = np.full(len(views[key]), chosen[0], dtype=np.int64)
                ordered[positions] = chosen
                reads.append((key, region, ordered, None))
            elif region is not None:
                reads.append((key, region, chosen, positions))
            continue
        regions = [plan.regions[column] for plan in plans]
        for region in {id(r): r for r in regions if r is not None}.values():
            mask = np.array([r is region for r in regions])[which]
            reads.append((key, region, chosen[mask], positions[mask]))
    for _, region, chosen, _ in reads:  # every prefetch is issued before any gather
        if region.row_bytes >= PREFETCH_ROW_BYTES:
            region.prefetch(chosen)
    for key, region, chosen, targets in reads:
        records = views[key].view(record_dtype(views[key].shape[1])).reshape(-1)
        if targets is None:
            source.gather_into(region.records, chosen, records)
        else:
            records[targets] = source.gather(region.records, chosen)


def _reset_elements(
    flat: np.ndarray, table: np.ndarray, epochs: np.ndarray, which: np.ndarray | None = None
) -> np.ndarray:
    """:func:`reset_row_elements` of rows of several trajectories: row ``i`` of one with
    ``T, B = table[which[i], :2]`` and ``epochs[which[i]]`` reset epochs (``table[i]`` and
    ``epochs[i]`` without ``which``)."""
    if not epochs.any():
        return flat
    if which is not None:
        table, epochs = table[which], epochs[which]
    T, B = table[:, 0], table[:, 1]
    shifted = flat + (flat // B // (T // np.maximum(epochs, 1)) + 1) * B
    return np.where(epochs > 0, shifted, flat)


def _row_plan(handles: ShardedTrajectory, keys: Sequence[str]) -> _RowPlan:
    """How ``keys`` of one trajectory are read."""
    by_zarr = zarr_arrays(handles, keys)
    regions: list[Region | None] = []
    first_rows: list[int] = []
    all_epochs: list[int] = []
    others: list[tuple[str, LocalShard | None, int, Any]] = []
    for key in keys:
        local = handles.local.get(key)
        bay = None if local is None or key in by_zarr else local.bay
        epochs = 0 if key in by_zarr else handles.shape(key)[0] - handles.T
        regions.append(None if bay is None else bay.region)
        first_rows.append(0 if bay is None else bay.first_row + handles.first_element(key))
        all_epochs.append(epochs if bay is not None else 0)
        if key in by_zarr:
            others.append((key, None, 0, by_zarr[key]))
        elif bay is None:
            others.append((key, local, epochs, None))
    bays = _BAYS.setdefault(tuple(map(id, regions)), next(_BAY_NUMBERS)) if any(regions) else 0
    numbers = np.array(
        [handles.T, handles.B, bays, *first_rows, *all_epochs, int(bool(others))], dtype=np.int64
    )
    return _RowPlan(handles.T, handles.B, tuple(regions), numbers.tobytes(), others)


# The number of each tuple of regions (by identity: regions live as long as the process).
_BAYS: dict[tuple[int, ...], int] = {}
_BAY_NUMBERS = itertools.count(1)  # unique even when two threads add at once


def reset_row_elements(flat: np.ndarray, T: int, B: int, epochs: int) -> np.ndarray:
    """Elements ``raw_t * B + b`` of flat rows in a field with ``T + epochs`` raw rows.

    The numpy counterpart of :func:`rbzarr.trajectory.model.raw_time_rows`: each of the
    ``epochs`` episodes of ``T // epochs`` steps has one extra (reset) row.
    """
    if epochs <= 0:
        return flat
    steps = flat // B
    return flat + (steps // (T // epochs) + 1) * B


def _read_plain(reads: list[Any], out: Mapping[str, np.ndarray], url: str) -> None:
    """Rows of the arrays zarr reads, every array's selection in one concurrent round."""
    if not reads:
        return
    blocks = sync(
        arrays.gather(
            *(
                arrays.read_rows(array, raw, envs, f"{url}/{array.path}")
                for array, _, raw, envs, _ in reads
            )
        )
    )
    for (_, key, _, _, where), block in zip(reads, blocks, strict=True):
        out[key][where] = block


def check_keys(
    opened: ShardedTrajectory, keys: Sequence[str], url: str, sampled: bool = False
) -> None:
    """Refuse keys the trajectory lacks, and (``sampled``) keys without ``[T, B]`` rows."""
    for key in keys:
        if key not in opened.dtypes:
            raise CorruptStoreError(
                f"{url}/{opened.group} has no field {key!r}; it holds {sorted(opened.dtypes)}"
            )
        shape = opened.shape(key)
        if sampled and len(shape) < 2:
            raise ValueError(
                f"field {key!r} of {url}/{opened.group} has shape {shape}; only [T, B, ...] "
                "fields can be read by rows"
            )


def zarr_arrays(opened: ShardedTrajectory, keys: Sequence[str]) -> dict[str, AsyncArray[Any]]:
    """The handles of those ``keys`` that zarr reads."""
    return {key: opened.arrays[key] for key in keys if key in opened.arrays}


def _check_rows(groups: RowGroups, limits: np.ndarray, which: np.ndarray) -> None:
    """Refuse rows outside their trajectory's ``[0, T * B)`` (``limits[g]`` of group ``g``,
    the group of each row in ``which``)."""
    flat = groups.rows
    bad = (flat < 0) | (flat >= limits[which])
    if bad.any():
        at = int(which[np.argmax(bad)])
        rows, _ = groups.group(at)
        raise IndexError(
            f"trajectory {trajectory_id(groups.entries[at])}: rows must be in [0, {limits[at]}), "
            f"got min {int(rows.min())}, max {int(rows.max())}"
        )
