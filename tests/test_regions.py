"""Small-row shards mapped at bays of reserved address ranges: rows equal zarr's own read
after window churn, across rewrite and delete, in a forked child, and past the map budget."""

from __future__ import annotations

import gc
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from conftest import index_entry, make_trajectory

from rbzarr.storage.io.location import Location
from rbzarr.storage.row_groups import RowGroups
from rbzarr.storage.zarr import regions
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.storage.zarr.rows import reset_row_elements
from rbzarr.trajectory.dtypes import to_numpy

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform != "linux", reason="regions map with Linux's mmap"),
]

KEYS = ["actions", "rewards", "dones", "prev_logprobs", "curr_obs/state", "next_obs/state"]
# Shards a trajectory maps when it opens: every [T, B, ...] field, sampled or not.
MAPPED = sum(value.dim() >= 2 for value in make_trajectory(2, 1, 0).tensors().values())


def _entry(tid: int, T: int, B: int) -> dict[str, Any]:
    return index_entry(tid, T, B, 1)


def _write(layout: ZarrLayout, tid: int, T: int, B: int, base: int, epochs: int = 1) -> Any:
    entry = _entry(tid, T, B)
    layout.write(entry, make_trajectory(T, B, base, epochs=epochs))
    return entry


def _batch(layout: ZarrLayout, entries: list[Any], seed: int) -> tuple[dict[str, Any], list[Any]]:
    """One batch over ``entries`` (random rows, interleaved positions), read into one block."""
    generator = np.random.default_rng(seed)
    picks = [
        generator.integers(0, e["num_samples"], int(generator.integers(1, 9))) for e in entries
    ]
    count = sum(len(p) for p in picks)
    order = generator.permutation(count)
    shapes = make_trajectory(1, 1, 0).tensors()
    out = {
        key: torch.empty((count, *shapes[key].shape[2:]), dtype=shapes[key].dtype) for key in KEYS
    }
    requests, start = [], 0
    for entry, rows in zip(entries, picks, strict=True):
        positions = torch.from_numpy(order[start : start + len(rows)])
        requests.append((entry, torch.from_numpy(rows), positions))
        start += len(rows)
    layout.read_groups_into(RowGroups.of(requests), KEYS, out)
    return out, requests


def _assert_equals_zarr(root: Path, out: dict[str, Any], requests: list[Any]) -> None:
    """Every row read equals the same row of zarr's own read of the array."""
    group = zarr.open_group(str(root), mode="r")
    for entry, rows, positions in requests:
        T, B = entry["shape"][:2]
        for key in KEYS:
            trajectory = group[f"trajectories/{entry['trajectory_id']}"]
            assert isinstance(trajectory, zarr.Group)
            array = np.asarray(trajectory[key][...])
            elements = reset_row_elements(rows.numpy(), T, B, array.shape[0] - T)
            want = array.reshape(array.shape[0] * B, *array.shape[2:])[elements]
            np.testing.assert_array_equal(to_numpy(out[key][positions]), want, err_msg=key)


def _released() -> None:
    gc.collect()


def test_rows_equal_zarrs_read_through_window_churn(tmp_path: Path) -> None:
    layout = ZarrLayout(Location.from_url(tmp_path), handle_cache_size=4)
    _released()  # bays of earlier tests' layouts go first
    held = regions.MAP_BUDGET.held
    shapes = [(8, 3, 1), (8, 3, 2), (6, 5, 1), (12, 2, 3)]  # several bay sizes and epochs
    entries = [_write(layout, t, *shapes[t % 4][:2], 1000 * t, shapes[t % 4][2]) for t in range(14)]
    for start in range(0, 11, 2):  # a window of 4 sliding over 14: bays freed and reused
        window = entries[start : start + 4]
        out, requests = _batch(layout, window, seed=start)
        _assert_equals_zarr(tmp_path, out, requests)
        _released()
        # at most the cached trajectories' small keys hold bays
        assert regions.MAP_BUDGET.held - held <= 4 * MAPPED * regions.BAY_MAPS
    assert regions.MAP_BUDGET.held > held  # the reads went through bays
    del layout
    _released()
    assert regions.MAP_BUDGET.held == held  # every bay handed back


def test_rewrite_and_delete_drop_the_slots(tmp_path: Path) -> None:
    layout = ZarrLayout(Location.from_url(tmp_path))
    _released()  # bays of earlier tests' layouts go first
    held = regions.MAP_BUDGET.held
    entries = [_write(layout, t, 8, 3, 100 * t) for t in range(3)]
    out, requests = _batch(layout, entries, seed=1)
    _assert_equals_zarr(tmp_path, out, requests)
    entries[1] = _write(layout, 1, 6, 4, 7000)  # same id and uuid, another shape
    layout.delete(entries[2])
    _released()
    assert regions.MAP_BUDGET.held == held + MAPPED * regions.BAY_MAPS  # trajectory 0 only
    out, requests = _batch(layout, entries[:2], seed=2)
    _assert_equals_zarr(tmp_path, out, requests)
    assert set(out["prev_logprobs"][requests[1][2]].to(torch.int64).tolist()) <= set(
        range(7000, 7024)
    )


_CHILD: list[Any] = []


def _read_in_child(root: str, queue: Any) -> None:
    try:
        layout, entries = _CHILD
        extra = _write(layout, 9, 4, 2, 9000)  # a new bay in the child
        out, requests = _batch(layout, [*entries, extra], seed=3)
        _assert_equals_zarr(Path(root), out, requests)
        queue.put("ok")
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


def test_bays_stay_valid_in_a_forked_child(tmp_path: Path) -> None:
    layout = ZarrLayout(Location.from_url(tmp_path))
    entries = [_write(layout, t, 8, 3, 100 * t) for t in range(3)]
    _batch(layout, entries, seed=0)  # maps every shard in the parent
    _CHILD[:] = [layout, entries]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(str(tmp_path), queue))
    child.start()
    assert queue.get(timeout=60) == "ok"
    child.join(timeout=60)
    out, requests = _batch(layout, entries, seed=4)  # the parent's bays are untouched
    _assert_equals_zarr(tmp_path, out, requests)
    _CHILD.clear()


def _maps_of(root: Path) -> int:
    """This process's mappings of files below ``root``."""
    with open("/proc/self/maps") as file:
        return sum(str(root) in line for line in file)


def test_past_the_map_budget_shards_are_read_with_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = regions.MapBudget(MAPPED * regions.BAY_MAPS + 3)  # a trajectory's bays and a few
    monkeypatch.setattr(regions, "MAP_BUDGET", budget)
    layout = ZarrLayout(Location.from_url(tmp_path))
    entries = [_write(layout, t, 8, 3, 100 * t) for t in range(6)]
    out, requests = _batch(layout, entries, seed=5)
    assert budget.held == budget.limit
    assert MAPPED < _maps_of(tmp_path) <= budget.limit  # the other shards are read with pread
    _assert_equals_zarr(tmp_path, out, requests)
    del layout
    _released()
    assert budget.held == 0


def test_the_budget_is_half_the_kernels_map_limit() -> None:
    with open("/proc/sys/vm/max_map_count") as file:
        assert regions.MAP_BUDGET.limit == int(file.read()) // 2


def _resident_bytes(root: Path) -> int:
    """Bytes of this process's mappings of files below ``root`` held in its page tables."""
    resident, inside = 0, False
    with open("/proc/self/smaps") as file:
        for line in file:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = str(root) in line
            elif inside and head[0] == "Rss:":
                resident += int(head[1]) * 1024
    return resident


def test_shards_are_populated_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ZarrLayout(Location.from_url(tmp_path))
    entries = [_write(writer, t, 4096, 4, 10_000 * t) for t in range(3)]
    resident = []
    for limit in (0, 1 << 30):  # none populated, then all: the same files, the same rows
        populated = regions.MapBudget(limit)
        monkeypatch.setattr(regions, "POPULATED", populated)
        layout = ZarrLayout(Location.from_url(tmp_path))
        out, requests = _batch(layout, entries, seed=6)  # 1 to 8 rows of each
        _assert_equals_zarr(tmp_path, out, requests)
        resident.append(_resident_bytes(tmp_path))
        assert populated.held == 0 if not limit else resident[-1] >= populated.held > 0
        del layout
        _released()
        assert populated.held == 0  # handed back with the bays
    assert resident[1] > resident[0]


def test_a_populate_the_kernel_refuses_leaves_the_rows_to_fault_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    populated = regions.MapBudget(1 << 30)
    monkeypatch.setattr(regions, "POPULATED", populated)
    monkeypatch.setattr(regions, "_MADV_POPULATE_READ", -1)  # EINVAL: as an older kernel
    layout = ZarrLayout(Location.from_url(tmp_path))
    entries = [_write(layout, t, 64, 4, 1000 * t) for t in range(3)]
    out, requests = _batch(layout, entries, seed=7)
    _assert_equals_zarr(tmp_path, out, requests)
    assert populated.held == 0  # every refused populate handed its bytes back


def test_a_bay_map_that_fails_once_falls_back_and_later_maps_go_to_bays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = regions._call_mmap
    failed: list[int] = []

    def fails_once(address: int, length: int, prot: int, flags: int, fd: int) -> int:
        if fd >= 0 and not failed:  # the first shard's map: as a kernel out of map slots
            failed.append(fd)
            raise OSError(12, "Cannot allocate memory")
        return real(address, length, prot, flags, fd)

    monkeypatch.setattr(regions, "_call_mmap", fails_once)
    layout = ZarrLayout(Location.from_url(tmp_path))
    _released()
    held = regions.MAP_BUDGET.held
    entries = [_write(layout, t, 64, 4, 1000 * t) for t in range(3)]
    out, requests = _batch(layout, entries, seed=8)
    assert failed  # the failure happened, and its shard was read all the same
    _assert_equals_zarr(tmp_path, out, requests)
    # the failed bay handed its budget back: its shard has a map of its own, the others bays
    assert regions.MAP_BUDGET.held == held + (3 * MAPPED - 1) * regions.BAY_MAPS + 1
    out, requests = _batch(layout, entries, seed=9)
    _assert_equals_zarr(tmp_path, out, requests)
