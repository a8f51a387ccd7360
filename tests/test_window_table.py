"""Rows read from the store by window position stay right as the window changes.

The zarr layout keeps the handles and row plans of the window drawn from in a table by
window position (:mod:`rbzarr.storage.zarr.window_table`).  Every sampled row here is
checked against the trajectory its index names, across the changes that move what a
position means: adds that grow or slide the window, ``clear()``, a reload.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbzarr import PrioritizedReplay, Retention, TrajectoryReplayBuffer, open_buffer
from rbzarr.analysis.view import BufferView
from rbzarr.distributed import commit_notices
from rbzarr.sampling.priorities import split_index
from rbzarr.storage.zarr.layout import ZarrLayout

STRIDE = 1000  # trajectory k's rows encode k * STRIDE + row


def add(buffer: TrajectoryReplayBuffer, k: int, T: int = 4, B: int = 3) -> None:
    buffer.add_trajectories([make_trajectory(T, B, k * STRIDE)])


def check_batch(
    buffer: TrajectoryReplayBuffer | BufferView, bases: dict[int, int], n: int = 64
) -> set[int]:
    """Sample ``n`` rows; each row must hold what its index names.  The ids drawn."""
    batch, info = buffer.sample(n, return_info=True)
    numbers = assert_rows_consistent(batch).numpy()
    ids, rows = split_index(info["index"].numpy())
    want = [bases[int(i)] + int(r) for i, r in zip(ids, rows, strict=True)]
    assert numbers.tolist() == want
    return set(ids.tolist())


@pytest.mark.parametrize("window", [0, 3])
def test_rows_follow_the_window_through_adds_clear_and_reload(tmp_path, window):
    store = str(tmp_path / "store")
    bases: dict[int, int] = {}
    options = {"seed": 3, "cache_size": 0, "sample_window_size": window}
    with TrajectoryReplayBuffer(**options, auto_save=True, auto_save_path=store) as buffer:
        for round_, k in enumerate(range(6)):
            add(buffer, k, T=4 + round_ % 2)
            buffer.flush()
            bases[buffer.trajectory_counter - 1] = k * STRIDE
            for _ in range(3):
                check_batch(buffer, bases)
        buffer.clear()
        added = set()
        for k in range(10, 13):
            add(buffer, k, B=2)
            buffer.flush()
            added.add(buffer.trajectory_counter - 1)
            bases[buffer.trajectory_counter - 1] = k * STRIDE
        assert check_batch(buffer, bases, 256) <= added
    with TrajectoryReplayBuffer(**options, auto_save=True, auto_save_path=store) as again:
        again.load_checkpoint(store)
        check_batch(again, bases)


@pytest.mark.parametrize("window", [0, 2])
def test_a_view_reads_right_rows_as_the_writer_moves_its_window(tmp_path, window):
    # The view's layout writes nothing: only the window itself tells its table is stale.
    store = str(tmp_path / "store")
    bases: dict[int, int] = {}
    with TrajectoryReplayBuffer(seed=1, auto_save=True, auto_save_path=store) as writer:
        add(writer, 0)
        writer.flush()
        bases[0] = 0
        view = open_buffer(store, seed=2, sample_window_size=window)
        for k in range(1, 5):
            check_batch(view, bases)
            add(writer, k, T=3 + k)
            writer.flush()
            bases[k] = k * STRIDE
            view.refresh()
            drawn = check_batch(view, bases, 256)
            assert k in drawn


def test_rows_stay_right_as_retention_removes_ids(tmp_path):
    # Retention takes ids out of the index while the layout keeps the others' handles.
    bases: dict[int, int] = {}
    with TrajectoryReplayBuffer(
        seed=4,
        cache_size=0,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=tmp_path / "store",
        retention=Retention(last=2),
    ) as buffer:
        for k in range(6):
            add(buffer, k, T=3 + k % 2)
            buffer.flush()
            bases[buffer.trajectory_counter - 1] = k * STRIDE
            drawn = check_batch(buffer, bases, 128)
            assert drawn <= set(buffer.trajectory_ids) and k in drawn
        assert 0 not in buffer.trajectory_ids  # retention did remove ids


def _flat(batch: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    shapes=st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2])),
        min_size=1,
        max_size=4,
    ),
    n=st.integers(1, 40),
    prioritized=st.booleans(),
)
def test_batches_read_by_window_position_equal_grouped_reads_and_memory(
    seed, shapes, n, prioritized
):
    # The same seed and trajectories: a buffer reading every row from the store (by window
    # position once its table is filled, else grouped) draws and returns what a buffer
    # holding them in memory does, reset rows (two epochs) included.
    options = {"seed": seed, "sample_window_size": 0}
    if prioritized:
        options["prioritized"] = PrioritizedReplay(alpha=0.6, beta=0.4, eps=0.01)
    served = []
    read_drawn_into = ZarrLayout.read_drawn_into

    def spy(self, *args):
        served.append(read_drawn_into(self, *args))
        return served[-1]

    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        patch.setattr(ZarrLayout, "read_drawn_into", spy)
        stored = TrajectoryReplayBuffer(
            **options, cache_size=0, auto_save=True, auto_save_path=f"{root}/store"
        )
        memory = TrajectoryReplayBuffer(**options)
        with stored, memory:
            for k, (steps, width, epochs) in enumerate(shapes):
                trajectory = make_trajectory(2 * steps, width, k * STRIDE, epochs=epochs)
                stored.add_trajectories([trajectory])
                memory.add_trajectories([trajectory])
            stored.flush()
            # A first batch (its own stream) reads grouped and fills the table with the
            # trajectories it draws (a fixed stream: not always every one).
            _, first = stored.sample(
                2000, generator=torch.Generator().manual_seed(0), return_info=True
            )
            seen = set(split_index(first["index"].numpy())[0].tolist())
            expected = [False]
            for _ in range(3):
                got, got_info = stored.sample(n, return_info=True)
                want, want_info = memory.sample(n, return_info=True)
                got, want = _flat(got), _flat(want)
                assert got.keys() == want.keys()
                for key in want:
                    assert torch.equal(got[key], want[key]), key
                assert torch.equal(got_info["index"], want_info["index"])
                assert torch.equal(got_info["weight"], want_info["weight"])
                # By window position exactly when an earlier batch read every trajectory
                # this one draws (a grouped read fills their slots).
                drawn = set(split_index(got_info["index"].numpy())[0].tolist())
                expected.append(drawn <= seen)
                seen |= drawn
    assert served == expected  # grouped first, then by position once filled


def test_cache_cells_follow_the_cache_while_the_window_stays(tmp_path):
    # Cells are kept by window position per cache version: trajectories added by reference
    # are read into the cache after the batch that meets them, the window unchanged; the
    # next batch must find them cached (no store read) and right.
    store = str(tmp_path / "store")
    bases: dict[int, int] = {}
    with TrajectoryReplayBuffer(seed=0, auto_save=True, auto_save_path=store) as writer:
        for k in range(3):
            add(writer, k)
            writer.flush()
            bases[k] = k * STRIDE
        notices = commit_notices(writer, writer.trajectory_ids)
    reads: list[str] = []
    with (
        pytest.MonkeyPatch.context() as patch,
        TrajectoryReplayBuffer(seed=1, auto_save=True, auto_save_path=store) as learner,
    ):
        add(learner, 9)  # one cached trajectory: the batch looks up the cache's cells
        bases[learner.trajectory_ids[-1]] = 9 * STRIDE
        learner.add_committed(notices)
        for name in ("read_drawn_into", "read_groups_into"):
            patch.setattr(ZarrLayout, name, _counted(getattr(ZarrLayout, name), reads))
        assert {0, 1, 2} <= check_batch(learner, bases, 512)  # met all: read, then cached
        assert reads
        reads.clear()
        check_batch(learner, bases, 64)
        assert reads == []


def _counted(method, calls):
    def counted(self, *args):
        calls.append(method.__name__)
        return method(self, *args)

    return counted
