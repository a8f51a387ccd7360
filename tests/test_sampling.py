"""Sampling is RLinf's draw, bit for bit, from the cache, from storage, or a mix.

RLinf's own buffer (``rlinf_oracle``) is the oracle of every draw here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import RLINF_BATCH_ORDER, assert_rows_consistent, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_oracle import (
    RLinfBuffer,
    assert_batches_equal,
    expected_numbers,
    rlinf_copy,
    rlinf_window,
    wait_for_rlinf_files,
)

from rbzarr import TrajectoryReplayBuffer, open_buffer
from rbzarr.analysis.view import BufferView
from rbzarr.sampling.window import draw
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.trajectory import tree

SIZES = [(4, 3), (2, 5), (6, 2), (3, 3), (5, 1), (1, 7), (8, 4)]


def fill(buffer: TrajectoryReplayBuffer | RLinfBuffer, sizes: list[tuple[int, int]]) -> None:
    base = 0
    for T, B in sizes:
        traj = make_trajectory(T, B, base)
        buffer.add_trajectories(
            [traj if isinstance(buffer, TrajectoryReplayBuffer) else rlinf_copy(traj)]
        )
        base += T * B


@pytest.mark.parametrize("window", [0, 1, 2, 100])
@pytest.mark.parametrize("mode", ["cache", "storage", "mixed"])
def test_sample_matches_rlinf_draw(tmp_path, window, mode):
    cache_size = {"cache": 100, "storage": 0, "mixed": 3}[mode]
    settings = {
        "seed": 7,
        "sample_window_size": window,
        "auto_save": True,
        "enable_cache": cache_size > 0,
        "cache_size": cache_size,
    }
    rlinf = RLinfBuffer(auto_save_path=str(tmp_path / "rlinf"), **settings)
    fill(rlinf, SIZES)
    wait_for_rlinf_files(rlinf)
    with TrajectoryReplayBuffer(auto_save_path=tmp_path / "store", **settings) as buffer:
        fill(buffer, SIZES)
        buffer.flush()
        for n in (17, 64, 5):
            batch = buffer.sample(n)
            assert_rows_consistent(batch)
            assert_batches_equal(batch, rlinf.sample(n))
    rlinf.close()


@pytest.mark.parametrize("window", [0, 2, 100])
def test_sample_without_auto_save(window):
    buffer = TrajectoryReplayBuffer(seed=3, sample_window_size=window)
    rlinf = RLinfBuffer(seed=3, sample_window_size=rlinf_window(window, len(SIZES)))
    fill(buffer, SIZES)
    fill(rlinf, SIZES)
    assert_batches_equal(buffer.sample(40), rlinf.sample(40))
    rlinf.close()


def test_batch_layout_keys_dtypes_and_order():
    buffer = TrajectoryReplayBuffer(seed=1)
    fill(buffer, [(4, 2)])
    batch = buffer.sample(6)
    assert list(batch) == [*RLINF_BATCH_ORDER, "forward_inputs"]
    assert batch["actions"].shape == (6, 2) and batch["actions"].dtype == torch.int64
    assert batch["prev_logprobs"].shape == (6,)
    assert batch["forward_inputs"]["tokens"].dtype == torch.int32
    assert "versions" not in batch  # 1-D tensors are not sampled


def test_num_chunks_is_clamped_to_window_total():
    buffer = TrajectoryReplayBuffer(seed=1)
    fill(buffer, [(2, 2)])
    assert buffer.sample(100)["rewards"].shape[0] == 4


def test_sample_errors():
    buffer = TrajectoryReplayBuffer()
    with pytest.raises(RuntimeError, match="empty buffer"):
        buffer.sample(4)
    fill(buffer, [(2, 2)])
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_chunks must be a positive int"):
            buffer.sample(bad)


def test_draw_is_pure_and_seeded():
    counts = torch.tensor([6, 2, 9])
    a = draw(50, counts, torch.Generator().manual_seed(5))
    b = draw(50, counts, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert bool((a[1] < counts[a[0]]).all()) and bool((a[1] >= 0).all())


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(1, 60),
    trajectories=st.integers(1, 30),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**31),
)
def test_a_draw_over_equal_counts_divides_to_the_searched_rows(count, trajectories, n, seed):
    # Equal counts skip the search (a division): the same positions and rows for a seed.
    counts = torch.full((trajectories,), count, dtype=torch.int64)
    ends = np.cumsum(counts.numpy())
    searched = draw(n, counts, torch.Generator().manual_seed(seed))
    divided = draw(n, counts, torch.Generator().manual_seed(seed), ends, count)
    assert torch.equal(searched[0], divided[0]) and torch.equal(searched[1], divided[1])


def test_seed_none_and_no_global_reseed():
    torch.manual_seed(99)
    before = torch.get_rng_state()
    np.random.seed(5)
    np_before = np.random.get_state()[1].copy()
    buffer = TrajectoryReplayBuffer(seed=None)
    fill(buffer, [(3, 3)])
    buffer.sample(4)
    assert torch.equal(torch.get_rng_state(), before)
    assert (np.random.get_state()[1] == np_before).all()


def test_clear_resets_window():
    buffer = TrajectoryReplayBuffer(seed=2, sample_window_size=2)
    fill(buffer, [(2, 2), (2, 2)])
    buffer.clear()
    assert len(buffer) == 0 and buffer.total_samples == 0 and buffer.trajectory_counter == 0
    with pytest.raises(RuntimeError):
        buffer.sample(1)
    buffer.add_trajectories([make_trajectory(2, 2, 1000)])
    numbers = assert_rows_consistent(buffer.sample(8))
    assert bool((numbers >= 1000).all())


@pytest.mark.parametrize("auto_save", [False, True])
def test_caller_generator_replaces_the_buffer_stream_for_that_call(tmp_path, auto_save):
    def make(name: str) -> TrajectoryReplayBuffer:
        path = tmp_path / name if auto_save else ""
        return TrajectoryReplayBuffer(
            seed=7, sample_window_size=0, auto_save=auto_save, auto_save_path=path
        )

    with make("plain") as plain, make("mixed") as mixed:
        fill(plain, SIZES)
        fill(mixed, SIZES)
        own = torch.Generator().manual_seed(11)
        via_generator = mixed.sample(30, generator=own)
        # The caller's generator drew what RLinf's buffer seeded 11 draws ...
        want = expected_numbers(11, SIZES, 0, [30])[0]
        assert torch.equal(assert_rows_consistent(via_generator), want)
        # ... and left the buffer's own stream where it was.
        for n in (17, 64):
            assert torch.equal(
                assert_rows_consistent(mixed.sample(n)), assert_rows_consistent(plain.sample(n))
            )


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
@pytest.mark.parametrize("window", [0, 2])
def test_view_sample_equals_buffer_sample(tmp_path, fmt, window):
    path = tmp_path / "store"
    with TrajectoryReplayBuffer(
        seed=5,
        sample_window_size=window,
        auto_save=True,
        auto_save_path=path,
        trajectory_format=fmt,
    ) as buffer:
        fill(buffer, SIZES)
        buffer.flush()
        view = open_buffer(path, seed=5, sample_window_size=window)
        for n in (9, 40):
            got, want = view.sample(n), buffer.sample(n)
            assert list(tree.flatten(got)) == list(tree.flatten(want))
            for key, value in tree.flatten(want).items():
                assert torch.equal(tree.flatten(got)[key], value), key
                assert tree.flatten(got)[key].dtype == value.dtype
        generator = torch.Generator().manual_seed(3)
        numbers = assert_rows_consistent(view.sample(12, generator=generator))
        assert torch.equal(numbers, expected_numbers(3, SIZES, window, [12])[0])


def test_view_sample_errors(tmp_path):
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
        fill(buffer, [(2, 2)])
    view = open_buffer(tmp_path / "s")
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_chunks must be a positive int"):
            view.sample(bad)
    empty = TrajectoryIndex().to_documents("zarr", {})
    with pytest.raises(RuntimeError, match="no committed trajectory"):
        BufferView(view.layout, empty).sample(1)
