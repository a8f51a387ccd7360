"""The staging pool: memory lent for staged copies comes back only once nothing holds it."""

from __future__ import annotations

import gc

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr.trajectory.model import Trajectory
from rbzarr.trajectory.staging import BLOCK_BYTES, MIN_POOLED_BYTES, StagingPool
from rbzarr.trajectory.validated import ValidatedTrajectory


def _address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


def test_a_block_is_lent_again_only_after_its_last_view_and_tensor_are_gone() -> None:
    pool = StagingPool(idle_bytes=8 * BLOCK_BYTES)
    first = pool.lend(BLOCK_BYTES + 1000)
    where = _address(first)
    view = first[10:20]
    tensor = torch.from_numpy(first[:400]).view(torch.int32)
    del first
    gc.collect()
    assert pool.kept == 0  # the view and the tensor still hold it
    other = pool.lend(BLOCK_BYTES + 1000)
    assert _address(other) != where
    del view
    gc.collect()
    assert pool.kept == 0
    del tensor
    gc.collect()
    assert pool.kept == 2 * BLOCK_BYTES
    again = pool.lend(2 * BLOCK_BYTES)  # the same size class
    assert _address(again) == where
    assert pool.kept == 0
    del other, again


def test_the_pool_keeps_no_more_idle_bytes_than_it_may() -> None:
    pool = StagingPool(idle_bytes=2 * BLOCK_BYTES)
    lent = [pool.lend(BLOCK_BYTES) for _ in range(3)]
    del lent
    gc.collect()
    assert pool.kept == 2 * BLOCK_BYTES  # the third block was unmapped
    assert pool.release_idle() == 2 * BLOCK_BYTES
    assert pool.kept == 0
    assert pool.lend(BLOCK_BYTES).nbytes == BLOCK_BYTES  # a new block, back at once
    gc.collect()
    assert pool.kept == BLOCK_BYTES
    small = pool.lend(MIN_POOLED_BYTES - 1)  # the allocator's own memory, never pooled
    del small
    gc.collect()
    assert pool.kept == BLOCK_BYTES


def test_blocks_below_a_huge_page_are_pooled_in_their_own_classes() -> None:
    pool = StagingPool(idle_bytes=8 * BLOCK_BYTES)
    first = pool.lend(MIN_POOLED_BYTES + 1)
    where = _address(first)
    del first
    gc.collect()
    assert pool.kept == 2 * MIN_POOLED_BYTES
    other = pool.lend(3 * MIN_POOLED_BYTES)  # another class: a new block
    again = pool.lend(2 * MIN_POOLED_BYTES)
    assert _address(other) != where
    assert _address(again) == where and again.nbytes == 2 * MIN_POOLED_BYTES
    assert pool.kept == 0
    del other, again


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3 * BLOCK_BYTES), min_size=1, max_size=6),  # every kind
    keep=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_memory_in_use_is_never_lent_twice(sizes: list[int], keep: list[bool]) -> None:
    pool = StagingPool(idle_bytes=16 * BLOCK_BYTES)
    held: list[tuple[np.ndarray, int]] = []
    for round_, nbytes in enumerate(sizes):
        array = pool.lend(nbytes)
        assert array.nbytes == nbytes and array.flags.writeable
        array[:] = round_ % 251
        held.append((array, round_ % 251))
        if not keep[round_]:
            held.pop(0)
            gc.collect()
        for kept, value in held:  # nothing lent since overwrote what is still held
            assert kept[0] == value and kept[-1] == value


DTYPES = [torch.bool, torch.uint8, torch.int16, torch.int64, torch.float16, torch.float32]
DTYPES += [torch.bfloat16, torch.complex64]  # copied by torch: numpy lacks or differs


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    frames=st.integers(1, 3),
    size=st.sampled_from(["small", "large", "huge"]),
    transposed=st.booleans(),
)
def test_a_staged_clone_holds_the_values_in_memory_of_its_own(
    dtype: torch.dtype, frames: int, size: str, transposed: bool
) -> None:
    """Small tensors and staged large ones (below and above GIL_COPY_BYTES), of every kind
    of dtype, contiguous or not: the copy has the dtype, shape and values given, shares no
    memory with them, and only the large ones have a staging buffer (holding the copy's
    bytes first)."""
    T, B = 4, 2
    large = size != "small"
    # 4*2*96*96*3 bytes and more: staged; 4*2*192*192*3 and more: more than GIL_COPY_BYTES
    side = {"small": 4, "large": 96, "huge": 192}[size]
    source = torch.arange(T * B * side * side * 3 * frames).reshape(T, B, side, side, 3 * frames)
    value = source.to(dtype)
    if transposed:
        value = value.transpose(2, 3)
    trajectory = Trajectory(rewards=torch.ones(T, B), curr_obs={"image": value})
    copied = ValidatedTrajectory.check(trajectory, copy=True)
    image = copied.trajectory.tensors()["curr_obs/image"]
    expected = value.clone()
    value.zero_()  # the caller reuses its tensor: the copy keeps what it was given
    assert image.dtype == dtype and image.shape == expected.shape
    assert torch.equal(image, expected)
    assert set(copied.staging) == ({"curr_obs/image"} if large else set())
    if large:  # the staging buffer holds the copy's bytes, first
        assert copied.staging["curr_obs/image"].ctypes.data == image.data_ptr()
    # The copy's numpy array (where numpy holds the dtype) is the copy's own memory.
    if dtype in (torch.bfloat16, torch.complex64):
        assert "curr_obs/image" not in copied.arrays
    else:
        array = copied.arrays["curr_obs/image"]
        assert array.ctypes.data == image.data_ptr() and array.shape == tuple(image.shape)
        assert np.array_equal(array, expected.numpy())
