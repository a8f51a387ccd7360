"""A batch's rows from the cache, pending writes and the store at once, grouped as flat arrays:
every row lands at its place, through the zarr layout's one-gather-per-key path and through a
layout with the default per-trajectory reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import index_entry, make_trajectory

from rbzarr.sampling.rows import plan_misses, read_batch
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.file_layout import PtLayout
from rbzarr.storage.row_groups import RowGroups
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

T, B = 8, 3
# Ids more than 2**16 apart: the grouping falls back from its uint16 sort keys.
IDS = [3, 70_000, 11, 12]
BASES = {tid: 1000 * (i + 1) for i, tid in enumerate(IDS)}


def _entry(tid: int) -> dict[str, object]:
    return index_entry(tid, T, B)


@pytest.mark.parametrize("layout_class", [ZarrLayout, PtLayout])
def test_hits_pending_and_stored_rows_land_in_batch_order(tmp_path: Path, layout_class) -> None:
    layout = layout_class(Location.from_url(tmp_path))
    trajectories = {tid: make_trajectory(T, B, BASES[tid]) for tid in IDS}
    spec = validate(trajectories[IDS[0]])
    flats = {tid: flatten_trajectory(t, validate(t)) for tid, t in trajectories.items()}
    entries = {tid: _entry(tid) for tid in IDS}
    for tid in IDS[:3]:  # the last one is still pending
        layout.write(entries[tid], trajectories[tid])
    generator = np.random.default_rng(5)
    ids = torch.from_numpy(generator.choice(IDS, 40))
    rows = torch.from_numpy(generator.integers(0, T * B, 40))
    hit = ids == IDS[2]  # trajectory 11 is cached as well as stored
    cached = {key: value[rows[hit]] for key, value in flats[IDS[2]].items()}
    pending = {IDS[3]: flats[IDS[3]]}
    plan = plan_misses(ids, rows, hit, cached, spec.schema, entries, pending)

    out = read_batch(plan, layout)

    want = torch.tensor([BASES[int(t)] for t in ids]) + rows
    assert torch.equal(out["prev_logprobs"].to(torch.int64), want)
    assert torch.equal(out["actions"], want.unsqueeze(-1).repeat(1, 2))
    assert torch.equal(out["dones"][:, 0], want)  # a key with a reset row per epoch
    assert torch.equal(out["next_obs/state"][:, 0], want.to(torch.float64) + 0.5)
    # grouped by trajectory, ids 3, 11 and 70,000 as three groups (11's hits are not misses)
    assert sorted(int(e["trajectory_id"]) for e in plan.misses.entries) == [3, 12, 70_000]


def test_groups_round_trip_through_requests() -> None:
    entries = [_entry(1), _entry(2), _entry(3)]
    requests = [
        (entries[0], torch.tensor([4, 0]), torch.tensor([1, 3])),
        (entries[1], torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)),
        (entries[2], torch.tensor([7]), torch.tensor([0])),
    ]
    groups = RowGroups.of(requests)
    assert groups.bounds.tolist() == [0, 2, 2, 3]
    assert groups.which().tolist() == [0, 0, 2]
    rows, positions = groups.group(2)
    assert (rows.tolist(), positions.tolist()) == ([7], [0])
    back = groups.requests()
    assert [entry for entry, _, _ in back] == entries
    for (_, rows_in, where_in), (_, rows_out, where_out) in zip(requests, back, strict=True):
        assert torch.equal(rows_in, rows_out) and torch.equal(where_in, where_out)
