"""write_file writes a file's parts in order with few system calls, short writes included."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr.storage.io import files


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    parts=st.lists(st.binary(max_size=40), max_size=12),
    limit=st.integers(min_value=1, max_value=64),
)
def test_the_parts_land_in_order_whatever_each_writev_takes(
    tmp_path_factory: pytest.TempPathFactory, parts: list[bytes], limit: int
) -> None:
    folder = tmp_path_factory.mktemp("parts")
    real = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[Any]) -> int:
        # A real writev of at most ``limit`` bytes: the kernel may write less than asked.
        calls.append(len(buffers))
        kept, room = [], limit
        for buffer in buffers:
            view = memoryview(buffer).cast("B")[:room]
            kept.append(view)
            room -= view.nbytes
            if not room:
                break
        return real(fd, kept)

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "writev", short)
    try:
        files.write_file(str(folder / "f"), parts, atomic=False)
    finally:
        mp.undo()
    assert (folder / "f").read_bytes() == b"".join(parts)
    if len(parts) > 1 and sum(map(len, parts)) <= limit:
        assert len(calls) <= 1  # no short write: every part in one call


def test_a_shard_of_more_parts_than_one_writev_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.writev
    sizes: list[int] = []

    def counted(fd: int, buffers: list[Any]) -> int:
        sizes.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(os, "writev", counted)
    count = 2100  # more than IOV_MAX (1024 on Linux) buffers
    frames = [np.full(5, i % 251, np.uint8) for i in range(count)]
    files.write_file(str(tmp_path / "shard"), [*frames, b"index"])
    assert (tmp_path / "shard").read_bytes() == b"".join(f.tobytes() for f in frames) + b"index"
    assert sum(sizes) == count + 1  # every part once
    assert 2 <= len(sizes) <= 3  # a few calls, none past the kernel's limit
    assert max(sizes) <= os.sysconf("SC_IOV_MAX")


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(parts=st.lists(st.binary(max_size=40), min_size=2, max_size=12))
def test_no_writev_asks_for_more_bytes_than_one_call_may_take(
    tmp_path_factory: pytest.TempPathFactory, parts: list[bytes]
) -> None:
    # os.write clamps its count where a larger one fails (macOS, Windows: INT_MAX);
    # os.writev does not, so write_file keeps each call under WRITEV_BYTES (here 7).
    folder = tmp_path_factory.mktemp("capped")
    real = os.writev
    asked: list[int] = []

    def counted(fd: int, buffers: list[Any]) -> int:
        asked.append(sum(memoryview(b).nbytes for b in buffers))
        return real(fd, buffers)

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "writev", counted)
    mp.setattr(files, "WRITEV_BYTES", 7)
    try:
        files.write_file(str(folder / "f"), parts, atomic=False)
    finally:
        mp.undo()
    assert (folder / "f").read_bytes() == b"".join(parts)
    assert asked and max(asked) <= 7


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(size=st.integers(0, 40), cap=st.integers(1, 9))
def test_one_part_is_written_in_calls_of_at_most_writev_bytes(
    tmp_path_factory: pytest.TempPathFactory, size: int, cap: int
) -> None:
    # The kernel sizes page-cache folios by a write's length: a large shard goes out in
    # calls of WRITEV_BYTES (64 KiB; here ``cap``), not one call of its whole size.
    folder = tmp_path_factory.mktemp("one-part")
    real = os.write
    asked: list[int] = []

    def counted(fd: int, data: Any) -> int:
        asked.append(memoryview(data).nbytes)
        return real(fd, data)

    data = bytes(range(size))
    mp = pytest.MonkeyPatch()
    mp.setattr(os, "write", counted)
    mp.setattr(files, "WRITEV_BYTES", cap)
    try:
        files.write_file(str(folder / "f"), [data], atomic=False)
    finally:
        mp.undo()
    assert (folder / "f").read_bytes() == data
    assert all(n <= cap for n in asked) and sum(asked) == size


@pytest.mark.parametrize("links", [True, False])
def test_create_file_never_replaces_a_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    if not links:  # a filesystem without hard links: the checked rename
        monkeypatch.setattr(os, "link", lambda *_: (_ for _ in ()).throw(PermissionError(1, "no")))
    target = tmp_path / "zarr.json"
    assert files.create_file(str(target), [b"first", b" write"])
    assert not files.create_file(str(target), [b"second"])
    assert target.read_bytes() == b"first write"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zarr.json"]


def test_create_file_that_fails_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, parts: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_parts", full)
    with pytest.raises(OSError, match="No space"):
        files.create_file(str(tmp_path / "zarr.json"), [b"{}"])
    assert list(tmp_path.iterdir()) == []
