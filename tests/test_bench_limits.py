"""The benchmarks' write limits and how sides alternate and pair up."""

from __future__ import annotations

import mmap
import resource
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks.limits import (
    alternate,
    copy_arrays,
    paired_ratio,
    retire,
    settle_memory,
    spread,
    write_files,
)


def test_sides_alternate_in_abba_order() -> None:
    calls: list[str] = []

    def side(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value

        return run

    found = alternate([side("a", 1.0), side("b", 2.0), side("c", 3.0)], 3)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert found == [[1.0] * 3, [2.0] * 3, [3.0] * 3]


def test_ratios_pair_the_sides_of_one_round() -> None:
    # a slow spell in round 2 hits both sides: the paired ratio does not move
    ratio = paired_ratio([10.0, 5.0, 12.0], [20.0, 10.0, 24.0])
    assert ratio == {"min": 0.5, "median": 0.5, "max": 0.5, "runs": [0.5, 0.5, 0.5]}
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "runs": [3, 1, 2]}
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_the_write_limit_writes_every_byte_into_new_files_then_retires_them(
    tmp_path: Path,
) -> None:
    arrays = [np.arange(1000, dtype=np.int32), np.ones((3, 5, 7), dtype=np.uint8)]
    assert write_files(arrays, tmp_path / "limit") > 0
    # moved aside, not removed: the next round's creates do not scan freed inodes
    assert not (tmp_path / "limit").exists()
    (retired,) = (tmp_path / ".retired").iterdir()
    assert retired.name.startswith("limit-")
    written = {p.name: p.read_bytes() for p in retired.iterdir()}
    assert written == {"0.bin": arrays[0].tobytes(), "1.bin": arrays[1].tobytes()}
    assert write_files(arrays, tmp_path / "limit") > 0  # the name is free again
    assert len(list((tmp_path / ".retired").iterdir())) == 2
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):  # fresh files only
        write_files(arrays, tmp_path / "taken")
    retire(tmp_path / "never-made")  # nothing to move
    assert copy_arrays(arrays) > 0


@pytest.mark.parametrize("threads", [2, 3])
def test_the_write_limit_on_several_threads_writes_every_array_once(
    tmp_path: Path, threads: int
) -> None:
    arrays = [np.full(100 + i, i, dtype=np.uint8) for i in range(5)]
    assert write_files(arrays, tmp_path / "limit", threads) > 0
    (retired,) = (tmp_path / ".retired").iterdir()
    written = {p.name: p.read_bytes() for p in retired.iterdir()}
    assert written == {f"{i}.bin": array.tobytes() for i, array in enumerate(arrays)}


def test_before_runs_ahead_of_every_side_of_every_round() -> None:
    calls: list[str] = []

    def side(name: str) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return 1.0

        return run

    alternate([side("a"), side("b")], 2, before=lambda: calls.append("settle"))
    assert calls == ["settle", "a", "settle", "b", "settle", "b", "settle", "a"]


def test_settling_touches_every_page_of_the_memory_asked_for() -> None:
    pages = 2048
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    settle_memory(pages * mmap.PAGESIZE + 1)  # not a whole number of pages: one more
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults >= pages  # each page faulted in (then unmapped with the block)
