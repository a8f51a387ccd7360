"""Prioritized replay: the distribution against a plain model, updates, and stored priorities."""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from faults import KINDS, Faults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.priorities import chi_square_p, priorities_targets
from rbzarr import (
    CorruptStoreError,
    EmptyBufferError,
    PrioritizedReplay,
    StorageUnavailableError,
    Trajectory,
    TrajectoryReplayBuffer,
)
from rbzarr.analysis.view import open_buffer
from rbzarr.data.datasets import ReplayDataset
from rbzarr.sampling import priorities as priorities_module
from rbzarr.sampling.priorities import NUMBA_FOUND, WindowPriorities
from rbzarr.storage.index import priorities as priority_files
from rbzarr.storage.io.location import Location

ROOT = Path(__file__).resolve().parents[1]


# The compiled kernels (numba) and the numpy path: each must follow the model.
PATHS = [
    pytest.param(True, id="compiled", marks=pytest.mark.skipif(not NUMBA_FOUND, reason="numba")),
    pytest.param(False, id="numpy"),
]


@contextlib.contextmanager
def path_of(compiled: bool) -> Iterator[None]:
    """Buffers made in this block draw and update with the compiled kernels or numpy."""
    with mock.patch.object(priorities_module, "NUMBA_FOUND", compiled):
        yield


def prioritized_buffer(**options) -> TrajectoryReplayBuffer:
    settings_ = options.pop("prioritized", PrioritizedReplay(alpha=0.7, beta=0.5, eps=0.01))
    return TrajectoryReplayBuffer(prioritized=settings_, **{"seed": 3, **options})


def index_of(trajectory_id: int, row: int) -> int:
    return (trajectory_id << 32) | row


def window_indices(buffer: TrajectoryReplayBuffer, base: int = 0) -> torch.Tensor:
    """The global indices of the window's rows (``base``: the ids given out before a clear)."""
    entries = buffer.index_entries
    window = buffer.trajectory_ids[-buffer.sample_window_size :]
    return torch.tensor(
        [index_of(base + i, r) for i in window for r in range(entries[i]["num_samples"])]
    )


class Model:
    """The distribution in plain Python: a priority per (global id, row) of the window.

    Global ids never restart: after a clear the buffer's ids start at 0 again (as RLinf's)
    and ``base`` is the global id of its id 0.
    """

    def __init__(self, window: int, settings_: PrioritizedReplay) -> None:
        self.window = window
        self.settings = settings_
        self.ids: list[int] = []
        self.priorities: dict[tuple[int, int], float] = {}
        self.max_priority = 1.0
        self.stale = 0
        self.next_id = 0
        self.base = 0

    def clear(self) -> None:
        self.ids, self.priorities, self.base = [], {}, self.next_id

    def add(self, rows: int) -> None:
        self.ids.append(self.next_id)
        for r in range(rows):
            self.priorities[(self.next_id, r)] = self.max_priority
        self.next_id += 1
        for gone in self.ids[: -self.window]:
            for key in [k for k in self.priorities if k[0] == gone]:
                del self.priorities[key]
        self.ids = self.ids[-self.window :]

    def update(self, keys: list[tuple[int, int]], values: list[float]) -> None:
        for key, value in zip(keys, values, strict=True):
            if key in self.priorities:
                self.priorities[key] = float(np.float32(value))
                self.max_priority = max(self.max_priority, float(np.float32(value)))
            else:
                self.stale += 1

    def mass(self, key: tuple[int, int]) -> float:
        return (self.priorities[key] + self.settings.eps) ** self.settings.alpha

    def weight(self, key: tuple[int, int]) -> float:
        least = min(self.mass(k) for k in self.priorities)
        return (self.mass(key) / least) ** -self.settings.beta


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3), st.integers(1, 3)),
        st.tuples(st.just("sample"), st.integers(1, 6)),
        st.tuples(
            st.just("update"),
            st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=5),
            st.floats(0, 50, allow_nan=False, width=32),
        ),
        st.tuples(st.just("resume")),
        st.tuples(st.just("clear")),
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("compiled", PATHS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_draws_updates_evictions_and_resumes_follow_the_model(compiled, ops):
    settings_ = PrioritizedReplay(alpha=0.7, beta=0.6, eps=0.05)
    model = Model(3, settings_)
    with path_of(compiled), tempfile.TemporaryDirectory() as folder:
        buffer = prioritized_buffer(sample_window_size=3, prioritized=settings_)
        kernels = buffer.get_stats()["priority_kernels"]
        assert kernels == ("compiled" if compiled else "numpy")
        for step, op in enumerate(ops):
            if op[0] == "add":
                _, T, B = op
                buffer.add_trajectories([make_trajectory(T, B, 100 * model.next_id)])
                model.add(T * B)
            elif op[0] == "update":
                keys = [(i, r) for i, r in op[1] if i < model.next_id]
                if not keys:
                    continue
                # Rows past a trajectory in the window are bad input; outside it, stale.
                counts = buffer.index_entries
                keys = [
                    k
                    for k in keys
                    if k[0] not in model.ids or k[1] < counts[k[0] - model.base]["num_samples"]
                ]
                if not keys:
                    continue
                values = [op[2] + j for j in range(len(keys))]
                buffer.update_priority([index_of(*k) for k in keys], values)
                model.update(keys, values)
            elif op[0] == "sample" and model.ids:
                batch, info = buffer.sample(op[1], return_info=True)
                assert_rows_consistent(batch)
                for index, weight in zip(
                    info["index"].tolist(), info["weight"].tolist(), strict=True
                ):
                    key = (index >> 32, index & 0xFFFFFFFF)
                    assert key in model.priorities  # only rows of the window are drawn
                    assert weight == pytest.approx(model.weight(key), rel=1e-5)
            elif op[0] == "resume" and model.ids:
                path = f"{folder}/{step}"
                buffer.save_checkpoint(path)
                buffer = prioritized_buffer(sample_window_size=3, prioritized=settings_)
                buffer.load_checkpoint(path)
            elif op[0] == "clear":
                buffer.clear()
                model.clear()
            if model.ids:
                got = buffer.get_priority(window_indices(buffer, model.base)).tolist()
                want = [model.priorities[(i, r)] for i, r in sorted(model.priorities)]
                assert got == pytest.approx(want)
                assert buffer.get_stats()["stale_priority_updates"] == model.stale
                assert buffer.get_stats()["max_priority"] == pytest.approx(model.max_priority)


def test_drawn_frequencies_match_the_proportional_probabilities():
    settings_ = PrioritizedReplay(alpha=0.8, beta=0.4, eps=0.0)
    buffer = prioritized_buffer(sample_window_size=0, prioritized=settings_)
    buffer.add_trajectories([make_trajectory(10, 10, 100 * k) for k in range(10)])
    priorities = np.random.default_rng(0).pareto(1.5, size=1000).astype(np.float32) + 0.01
    buffer.update_priority(window_indices(buffer), priorities)
    counts = np.zeros(1000)
    for _ in range(10):
        _, info = buffer.sample(10_000, return_info=True)
        index = info["index"].numpy()
        np.add.at(counts, (index >> 32) * 100 + (index & 0xFFFFFFFF), 1)
    mass = priorities.astype(np.float64) ** 0.8
    assert chi_square_p(counts, mass / mass.sum() * counts.sum())[1] >= 0.01


def test_a_seed_gives_the_same_draws_and_a_checkpoint_resumes_them(tmp_path):
    def run() -> TrajectoryReplayBuffer:
        buffer = prioritized_buffer(sample_window_size=4)
        buffer.add_trajectories([make_trajectory(4, 3, 100 * k) for k in range(6)])
        _, info = buffer.sample(16, return_info=True)
        buffer.update_priority(info["index"], torch.linspace(0.1, 9.0, 16))
        return buffer

    first, second = run(), run()
    assert torch.equal(
        first.sample(32, return_info=True)[1]["index"],
        second.sample(32, return_info=True)[1]["index"],
    )
    first.save_checkpoint(tmp_path / "ck")
    resumed = prioritized_buffer(sample_window_size=4)
    resumed.load_checkpoint(tmp_path / "ck")
    for _ in range(3):
        want, want_info = first.sample(8, return_info=True)
        got, got_info = resumed.sample(8, return_info=True)
        assert torch.equal(got_info["index"], want_info["index"])
        assert torch.equal(got_info["weight"], want_info["weight"])
        assert torch.equal(got["rewards"], want["rewards"])
        seq_want = first.sample_sequences(4, 3, return_info=True)[1]
        seq_got = resumed.sample_sequences(4, 3, return_info=True)[1]
        assert torch.equal(seq_got["index"], seq_want["index"])


def test_stale_updates_are_ignored_and_counted():
    buffer = prioritized_buffer(sample_window_size=2)
    buffer.add_trajectories([make_trajectory(2, 2, 0), make_trajectory(2, 2, 10)])
    buffer.add_trajectories([make_trajectory(2, 2, 20)])  # trajectory 0 leaves the window
    buffer.update_priority([index_of(0, 1), index_of(1, 1), index_of(0, 2)], [5.0, 6.0, 7.0])
    assert buffer.get_stats()["stale_priority_updates"] == 2
    assert buffer.get_priority([index_of(1, 1), index_of(0, 1)]).tolist()[0] == 6.0
    assert np.isnan(buffer.get_priority([index_of(0, 1)]).item())


def test_new_rows_enter_at_the_largest_priority():
    buffer = prioritized_buffer(sample_window_size=0)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.update_priority([index_of(0, 0), index_of(0, 1)], [9.0, 0.5])
    buffer.add_trajectories([make_trajectory(2, 2, 10)])
    assert buffer.get_priority([index_of(1, r) for r in range(4)]).tolist() == [9.0] * 4


@pytest.mark.parametrize(
    ("indices", "priorities"),
    [
        ([index_of(0, 0)], [-1.0]),
        ([index_of(0, 0)], [float("nan")]),
        ([index_of(0, 0), index_of(0, 1)], [1.0, 2.0, 3.0]),
        ([index_of(0, 4)], [1.0]),  # row past the trajectory's 4 rows
        ([-1], [1.0]),
        ([0.5], [1.0]),
    ],
)
def test_bad_updates_change_nothing(indices, priorities):
    buffer = prioritized_buffer(sample_window_size=0)
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    before = buffer.get_priority(window_indices(buffer))
    with pytest.raises(ValueError):
        buffer.update_priority(indices, priorities)
    assert torch.equal(buffer.get_priority(window_indices(buffer)), before)
    assert buffer.get_stats()["stale_priority_updates"] == 0


def test_prioritization_off_refuses_updates_and_keeps_the_uniform_output():
    plain = TrajectoryReplayBuffer(seed=3)
    plain.add_trajectories([make_trajectory(2, 2, 0)])
    with pytest.raises(ValueError, match="prioritized"):
        plain.update_priority([0], [1.0])
    batch = plain.sample(4)
    assert isinstance(batch, dict) and "index" not in batch
    again = TrajectoryReplayBuffer(seed=3)
    again.add_trajectories([make_trajectory(2, 2, 0)])
    got, info = again.sample(4, return_info=True)
    assert torch.equal(got["rewards"], batch["rewards"])
    assert info["weight"].tolist() == [1.0] * 4
    assert (info["index"] & 0xFFFFFFFF).tolist() == got["rewards"][:, 0].long().tolist()
    assert "stale_priority_updates" not in again.get_stats()
    with pytest.raises(ValueError, match="prefetch"):
        prioritized_buffer(prefetch=2)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplay(alpha=-1.0)


def test_zero_priorities_are_never_drawn_and_all_zero_raises():
    buffer = prioritized_buffer(
        sample_window_size=0, prioritized=PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)
    )
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.update_priority([index_of(0, r) for r in range(4)], [0.0, 0.0, 3.0, 0.0])
    _, info = buffer.sample(50, return_info=True)
    assert set(info["index"].tolist()) == {index_of(0, 2)}
    buffer.update_priority([index_of(0, 2)], [0.0])
    with pytest.raises(EmptyBufferError, match="priority 0"):
        buffer.sample(1)


def steps_trajectory(trajectory_id: int, T: int = 6, B: int = 2) -> Trajectory:
    """``state`` = 1000 * id + flat row; no episode ends (the next id continues each env)."""
    rows = 1000 * trajectory_id + torch.arange(T * B, dtype=torch.float64).reshape(T, B)
    return Trajectory(rewards=rows.unsqueeze(-1), dones=torch.zeros(T, B, 1, dtype=torch.bool))


def test_sequences_start_by_priority():
    buffer = prioritized_buffer(
        sample_window_size=0, prioritized=PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)
    )
    buffer.add_trajectories([steps_trajectory(k) for k in range(3)])
    buffer.update_priority(window_indices(buffer), 0.0)
    buffer.update_priority([index_of(1, 2), index_of(2, 9)], [1.0, 3.0])
    batch, info = buffer.sample_sequences(400, 3, return_info=True)
    starts = info["index"].tolist()
    assert set(starts) == {index_of(1, 2), index_of(2, 9)}
    assert 0.6 < starts.count(index_of(2, 9)) / 400 < 0.9
    first = batch["rewards"][:, 0, 0].long()
    assert torch.equal(first, (info["index"] & 0xFFFFFFFF) + 1000 * (info["index"] >> 32))
    assert info["weight"][info["index"] == index_of(1, 2)].unique().tolist() == [1.0]
    heavy = info["weight"][info["index"] == index_of(2, 9)].unique().tolist()
    assert heavy == [pytest.approx(1 / 3)]
    # strict: only starts with 3 steps ahead (row 9 is t=4 of the last 6 steps: 2 ahead)
    _, strict = buffer.sample_sequences(50, 3, strict_length=True, return_info=True)
    assert set(strict["index"].tolist()) == {index_of(1, 2)}


def test_flushed_priorities_survive_a_kill_and_resume(tmp_path):
    store = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import torch
        from conftest import make_trajectory
        from rbzarr import PrioritizedReplay, TrajectoryReplayBuffer
        buffer = TrajectoryReplayBuffer(
            seed=1, sample_window_size=3, auto_save=True, auto_save_path={str(store)!r},
            prioritized=PrioritizedReplay(alpha=0.6, beta=0.4, eps=0.01),
        )
        buffer.add_trajectories([make_trajectory(3, 2, 100 * k) for k in range(4)])
        _, info = buffer.sample(12, return_info=True)
        buffer.update_priority(info["index"], torch.arange(12, dtype=torch.float32) / 7)
        buffer.flush()
        index = torch.tensor([(i << 32) | r for i in (1, 2, 3) for r in range(6)])
        print(",".join(repr(v) for v in buffer.get_priority(index).tolist()), flush=True)
        buffer.update_priority(index, 99.0)  # not flushed: lost with the process
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr
    flushed = [float(v) for v in done.stdout.strip().split(",")]
    resumed = prioritized_buffer(
        sample_window_size=3, prioritized=PrioritizedReplay(alpha=0.6, beta=0.4, eps=0.01)
    )
    resumed.load_checkpoint(store)
    index = torch.tensor([index_of(i, r) for i in (1, 2, 3) for r in range(6)])
    assert resumed.get_priority(index).tolist() == flushed


def test_a_failed_priority_write_loses_nothing_and_the_next_flush_writes_it(tmp_path):
    store = tmp_path / "store"
    buffer = prioritized_buffer(sample_window_size=0, auto_save=True, auto_save_path=store)
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(3)])
    buffer.update_priority([index_of(k, 1) for k in range(3)], [2.0, 3.0, 4.0])
    buffer.flush()
    buffer.update_priority([index_of(k, 2) for k in range(3)], [5.0, 6.0, 7.0])
    # A folder where trajectory 1's priority file goes: its write fails, for real.
    blocker = store / "priorities" / "1.f32"
    blocker.unlink()
    blocker.mkdir()
    (blocker / "user.txt").write_text("in the way")
    with pytest.raises(StorageUnavailableError):
        buffer.flush()
    (blocker / "user.txt").unlink()
    blocker.rmdir()
    buffer.flush()  # the write that failed is made now
    buffer.close()
    resumed = prioritized_buffer(sample_window_size=0)
    resumed.load_checkpoint(store)
    assert resumed.get_priority(window_indices(resumed)).tolist() == [
        1.0,
        2.0,
        5.0,
        1.0,
        1.0,
        3.0,
        6.0,
        1.0,
        1.0,
        4.0,
        7.0,
        1.0,
    ]


def test_rank_shards_load_their_priorities(tmp_path):
    buffer = prioritized_buffer(sample_window_size=0)
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(4)])
    buffer.update_priority(window_indices(buffer), torch.arange(16, dtype=torch.float32))
    buffer.save_checkpoint(tmp_path / "ck")
    for rank, ids in ((0, [0, 1]), (1, [2, 3])):
        shard = prioritized_buffer(sample_window_size=0)
        shard.load_checkpoint(tmp_path / "ck", is_distributed=True, local_rank=rank, world_size=2)
        assert shard.trajectory_ids == ids
        assert shard.get_priority(window_indices(shard)).tolist() == list(
            range(4 * ids[0], 4 * ids[-1] + 4)
        )


def test_a_damaged_priority_file_is_refused_naming_it(tmp_path):
    buffer = prioritized_buffer(sample_window_size=0, auto_save=True, auto_save_path=tmp_path / "s")
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.close()
    (tmp_path / "s" / "priorities" / "0.f32").write_bytes(b"RBZPRI\x00\x01" + b"\x00" * 3)
    with pytest.raises(CorruptStoreError, match=r"0\.f32"):
        prioritized_buffer(sample_window_size=0).load_checkpoint(tmp_path / "s")


@pytest.mark.parametrize("compiled", PATHS)
@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=12),
    st.integers(1, 12),
    st.data(),
)
def test_the_tree_follows_windows_that_slide_and_grow(compiled, counts, window, data):
    priorities = WindowPriorities(PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0), compiled)
    model: dict[tuple[int, int], float] = {}
    for end in range(1, len(counts) + 1):
        ids = list(range(max(0, end - window), end))
        priorities.sync(ids, [counts[i] for i in ids])
        model = {k: v for k, v in model.items() if k[0] in ids}
        for i in ids:
            for r in range(counts[i]):
                model.setdefault((i, r), priorities.max_priority)
        keys = data.draw(st.lists(st.sampled_from(sorted(model)), max_size=5))
        values = np.array(
            data.draw(
                st.lists(st.floats(0.5, 9, width=32), min_size=len(keys), max_size=len(keys))
            ),
            dtype=np.float32,
        )
        priorities.update(np.array([index_of(*k) for k in keys], dtype=np.int64), values)
        for key, value in zip(keys, values.tolist(), strict=True):
            model[key] = value
            priorities.max_priority = max(priorities.max_priority, value)
        got = priorities.get(np.array([index_of(*k) for k in sorted(model)], dtype=np.int64))
        assert got.tolist() == [model[k] for k in sorted(model)]
        positions, rows, weights = priorities.draw(64, torch.Generator().manual_seed(end))
        least = min(model.values())
        for p, r, w in zip(positions.tolist(), rows.tolist(), weights.tolist(), strict=True):
            assert w == pytest.approx(least / model[(ids[p], r)], rel=1e-6)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_draw_by_the_flushed_priorities(tmp_path, context):
    settings_ = PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)
    buffer = prioritized_buffer(
        sample_window_size=0, auto_save=True, auto_save_path=tmp_path / "s", prioritized=settings_
    )
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(4)])
    buffer.update_priority(window_indices(buffer), 0.0)
    buffer.update_priority([index_of(1, 3), index_of(2, 0)], [1.0, 4.0])
    buffer.flush()
    dataset = ReplayDataset(buffer, batch_size=64, num_batches=4, seed=5, max_staleness=0.0)
    loader = dataset.data_loader(num_workers=2, multiprocessing_context=context)
    for batch in loader:
        info = batch["sample_info"]
        assert set(info["index"].tolist()) <= {index_of(1, 3), index_of(2, 0)}
        assert_rows_consistent({k: v for k, v in batch.items() if k != "sample_info"})
        weights = dict(zip(info["index"].tolist(), info["weight"].tolist(), strict=True))
        assert weights.get(index_of(1, 3), 1.0) == 1.0
        assert weights.get(index_of(2, 0), 0.25) == 0.25
        # The trainer routes the updates to the buffer, the one owner of the priorities.
        buffer.update_priority(info["index"], 2.0)
    assert buffer.get_priority([index_of(1, 3), index_of(2, 0)]).tolist() == [2.0, 2.0]
    buffer.update_priority([index_of(3, 1)], [8.0])
    buffer.update_priority([index_of(1, 3), index_of(2, 0)], [0.0, 0.0])
    buffer.flush()
    for batch in dataset.data_loader(num_workers=2, multiprocessing_context=context):
        assert set(batch["sample_info"]["index"].tolist()) == {index_of(3, 1)}
    buffer.close()


def test_a_dataset_without_workers_sees_the_updates_after_its_prefetch():
    buffer = prioritized_buffer(
        sample_window_size=0, prioritized=PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)
    )
    buffer.add_trajectories([make_trajectory(2, 2, 0)])
    buffer.update_priority(window_indices(buffer), [0.0, 1.0, 0.0, 0.0])
    dataset = ReplayDataset(buffer, batch_size=8, num_batches=3, seed=1, prefetch=1)
    drawn = []
    for step, batch in enumerate(dataset):
        drawn.append(set(batch["sample_info"]["index"].tolist()))
        if step == 0:
            buffer.update_priority([index_of(0, 1), index_of(0, 2)], [0.0, 1.0])
    # Batch 1 may have been drawn ahead, before the update; batch 2 is drawn after it.
    assert drawn[0] == {index_of(0, 1)}
    assert drawn[1] in ({index_of(0, 1)}, {index_of(0, 2)})
    assert drawn[2] == {index_of(0, 2)}


def test_the_chi_square_p_value_is_the_textbook_one():
    # 2 degrees of freedom: p = exp(-statistic / 2).
    statistic, p = chi_square_p(np.array([10.0, 20.0, 30.0]), np.array([20.0, 20.0, 20.0]))
    assert statistic == 10.0
    assert p == pytest.approx(np.exp(-5.0))


def test_the_benchmark_targets_read_a_run_and_say_why_the_peer_is_missing():

    case = {"ours": {"p50_ms": 0.5, "rows": 10}, "torchrl": {"p50_ms": 1.0}}
    results = {
        "hot": case,
        "cached": case,
        "disk": {**case, "torchrl": {"unavailable": "no torchrl here"}},
        "uniform": {**case, "ours": {"p50_ms": 1.6, "rows": 10}},
        "sequences": case,
        "torchrl_versions": {"torchrl": "0.14.1"},
        "distribution": {"draws": 10, "rows": 2, "p_value": 0.5, "max_weight_error": 0.0},
        "kill": {"killed": True, "equal": True},
        "memory": {"rows": 10, "bytes": 60, "float32_bytes": 40, "float64_bytes": 80},
    }
    found = {t["target"].split(" (")[0]: t for t in priorities_targets(results)}
    met = [True, True, None, False, True, True, True, True, True]
    assert [t["met"] for t in found.values()] == met
    assert found["uniform sample(256) from disk vs LazyMemmapStorage"]["threshold"] == 1.5
    assert "no torchrl here" in found["the same, rows from disk, vs LazyMemmapStorage"]["reason"]


@pytest.mark.skipif(not NUMBA_FOUND, reason="numba is not installed")
@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=8),
    st.sampled_from([(0.6, 0.4, 1e-6), (1.0, 1.0, 0.0), (0.0, 0.5, 0.1), (0.9, 0.0, 0.01)]),
    st.data(),
)
def test_the_compiled_and_numpy_paths_draw_the_same_rows_weights_and_tree(counts, rule, data):
    """Same seed, same updates: identical draws, weights, raw priorities, sums and minima."""
    both = [WindowPriorities(PrioritizedReplay(*rule), compiled) for compiled in (True, False)]
    assert [p.compiled for p in both] == [True, False]
    ids = list(range(len(counts)))
    for step in range(4):
        window = ids[step % 2 :] or ids  # slides, then grows back
        for priorities in both:
            priorities.sync(window, [counts[i] for i in window])
        keys = data.draw(
            st.lists(st.tuples(st.sampled_from(ids), st.integers(0, 299)), max_size=40)
        )
        keys = [(i, r) for i, r in keys if r < counts[i]]
        values = np.array(
            data.draw(
                st.lists(st.floats(0, 1e4, width=32), min_size=len(keys), max_size=len(keys))
            ),
            dtype=np.float32,
        )
        index = np.array([index_of(*k) for k in keys], dtype=np.int64)
        assert both[0].update(index, values) == both[1].update(index, values)
        draws = [p.draw(300, torch.Generator().manual_seed(step)) for p in both]
        for got, want in zip(*draws, strict=True):
            assert torch.equal(got, want)
        trees = [p.tree for p in both]
        for name in ("leaves", "sums", "mins"):
            assert np.array_equal(getattr(trees[0], name), getattr(trees[1], name), equal_nan=True)
        assert both[0].max_priority == both[1].max_priority


@pytest.mark.parametrize("compiled", PATHS)
def test_alpha_zero_draws_only_the_rows_of_the_window(compiled):
    """Empty leaves have no mass even where ``0 ** 0`` would give them 1."""
    priorities = WindowPriorities(PrioritizedReplay(alpha=0.0, beta=1.0, eps=0.0), compiled)
    priorities.sync([4, 9], [3, 2])
    positions, rows, weights = priorities.draw(2000, torch.Generator().manual_seed(0))
    drawn = set(zip(positions.tolist(), rows.tolist(), strict=True))
    assert drawn == {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)}
    assert weights.tolist() == [1.0] * 2000


# Drawn in proportion to the raw priorities: a row of priority 0 is never drawn.
ONE_HOT = PrioritizedReplay(alpha=1.0, beta=1.0, eps=0.0)


def one_hot_store(store: Path, count: int, hot: tuple[int, int]) -> TrajectoryReplayBuffer:
    """A store of ``count`` trajectories whose flushed priorities are 0 but ``hot``'s."""
    buffer = prioritized_buffer(
        sample_window_size=0, auto_save=True, auto_save_path=store, prioritized=ONE_HOT
    )
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(count)])
    buffer.update_priority(window_indices(buffer), 0.0)
    buffer.update_priority([index_of(*hot)], [1.0])
    buffer.flush()
    return buffer


def drawn_keys(view, n: int = 64) -> set[tuple[int, int]]:
    _, info = view.sample(n, return_info=True, generator=torch.Generator().manual_seed(0))
    return {(i >> 32, i & 0xFFFFFFFF) for i in info["index"].tolist()}


def test_a_view_refresh_reads_only_the_priority_files_that_changed(tmp_path, monkeypatch):
    store = tmp_path / "s"
    buffer = one_hot_store(store, 40, (3, 2))
    view = open_buffer(store, prioritized=ONE_HOT)
    assert drawn_keys(view) == {(3, 2)}
    read: list[str] = []
    real_read = Location.read_bytes

    def read_bytes(location: Location, *names: str) -> bytes:
        if names[:1] == (priority_files.FOLDER,):
            read.append(names[-1])
        return real_read(location, *names)

    monkeypatch.setattr(Location, "read_bytes", read_bytes)
    view.refresh()
    assert read == ["changes.json"]  # nothing changed: the record alone
    buffer.update_priority([index_of(7, 1)], [1e9])
    buffer.flush()
    read.clear()
    view.refresh()
    assert read == ["changes.json", "7.f32"]  # 1 of 40 trajectories changed: 2 files
    assert drawn_keys(view) == {(7, 1)}
    for k in range(3):  # flushes the view did not see: their changes together
        buffer.update_priority([index_of(10 + k, 0)], [1e10 * (k + 1)])
        buffer.flush()
    read.clear()
    view.refresh()
    assert sorted(read) == ["10.f32", "11.f32", "12.f32", "changes.json"]
    assert (12, 0) in drawn_keys(view, 256)
    # Another writer (a resumed run) flushes: its record cannot say what changed since.
    buffer.close()
    resumed = prioritized_buffer(
        sample_window_size=0, auto_save=True, auto_save_path=store, prioritized=ONE_HOT
    )
    resumed.load_checkpoint(store)
    resumed.update_priority([index_of(12, 0)], [0.0])
    resumed.close()
    read.clear()
    view.refresh()
    assert len(read) == 41
    assert drawn_keys(view, 256) <= {(7, 1), (10, 0), (11, 0)}  # (12, 0) is 0 now


def test_a_damaged_change_record_costs_a_full_read_not_a_wrong_priority(tmp_path):
    store = tmp_path / "s"
    buffer = one_hot_store(store, 3, (0, 0))
    view = open_buffer(store, prioritized=ONE_HOT)
    buffer.update_priority([index_of(0, 0), index_of(2, 3)], [0.0, 1.0])
    buffer.flush()
    (store / "priorities" / "changes.json").write_bytes(b'{"writer": 3, "flush": [}')
    view.refresh()
    assert drawn_keys(view) == {(2, 3)}


@pytest.mark.parametrize("flushed_before_leaving", [True, False])
def test_a_trajectory_back_in_a_grown_window_keeps_its_priorities(tmp_path, flushed_before_leaving):
    store = tmp_path / "s"
    buffer = prioritized_buffer(sample_window_size=2, auto_save=True, auto_save_path=store)
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(2)])
    buffer.update_priority([index_of(0, 1), index_of(1, 2)], [0.25, 0.5])
    if flushed_before_leaving:
        buffer.flush()
    buffer.update_priority([index_of(1, 0)], [30.0])  # the largest priority now
    buffer.add_trajectories([make_trajectory(2, 2, 100 * k) for k in range(2, 4)])  # 0, 1 leave
    buffer.flush()  # writes what left unflushed too
    assert buffer.get_priority([index_of(0, 1)]).isnan().all()
    buffer.sample_window_size = 0  # 0 and 1 are back, with what they had, not 30
    want = [1.0, 0.25, 1.0, 1.0, 30.0, 1.0, 0.5, 1.0, *[30.0] * 8]
    assert buffer.get_priority(window_indices(buffer)).tolist() == want
    buffer.close()
    resumed = prioritized_buffer(sample_window_size=0)
    resumed.load_checkpoint(store)
    assert resumed.get_priority(window_indices(resumed)).tolist() == want


def test_a_trajectory_back_in_a_views_grown_window_keeps_its_stored_priorities(tmp_path):
    store = tmp_path / "s"
    one_hot_store(store, 3, (1, 1))
    view = open_buffer(store, prioritized=ONE_HOT, sample_window_size=2)
    assert drawn_keys(view) == {(1, 1)}
    view.sample_window_size = 0  # 0 is back with its stored 0s, not the largest priority
    assert drawn_keys(view) == {(1, 1)}


@pytest.mark.parametrize("kind", KINDS)
def test_a_priority_write_that_fails_or_hangs_loses_no_flushed_priority(
    tmp_path, monkeypatch, kind
):
    """Each storage call of a priority flush faults in turn; a reader meanwhile sees whole
    files only (the old or the new); after a second flush, resumes and views see every
    priority."""
    faults = Faults(monkeypatch)
    old = torch.arange(12, dtype=torch.float32)
    new = old + 100

    def flushed_once(store: Path) -> TrajectoryReplayBuffer:
        buffer = one_hot_store(store, 3, (0, 0))
        buffer.update_priority(window_indices(buffer), old)
        buffer.flush()
        buffer.update_priority(window_indices(buffer), new)
        return buffer

    def observe(store: Path) -> None:
        files = priority_files.PriorityFiles(Location.from_url(str(store)))
        resumed = prioritized_buffer(sample_window_size=0)
        resumed.load_checkpoint(store)  # refuses a damaged priority file
        for k in range(3):
            rows = files.read(resumed.index_entries[k])
            assert rows is not None
            assert rows.tolist() in (
                old[4 * k : 4 * k + 4].tolist(),
                new[4 * k : 4 * k + 4].tolist(),
            )

    buffer = flushed_once(tmp_path / "counted")
    faults.count()
    buffer.flush()
    faults.disarm()
    calls = len(faults.calls)
    assert faults.calls.count("write_bytes") >= 4  # 3 files and the change record
    for k in range(calls):
        store = tmp_path / f"{k}"
        buffer = flushed_once(store)
        view = open_buffer(store, prioritized=ONE_HOT)
        faults.on_fault = functools.partial(observe, store)
        faults.arm(k, kind)
        with contextlib.suppress(StorageUnavailableError):
            buffer.flush()
        faults.disarm()
        faults.on_fault = None
        assert faults.fired, (k, faults.calls)
        buffer.flush()  # storage healed: what failed is written now
        buffer.close()
        resumed = prioritized_buffer(sample_window_size=0)
        resumed.load_checkpoint(store)
        assert resumed.get_priority(window_indices(resumed)).tolist() == new.tolist()
        view.refresh()  # the change record lists every file the fault left to rewrite
        _, info = view.sample(2000, return_info=True, generator=torch.Generator().manual_seed(k))
        drawn = set(info["index"].tolist())
        assert drawn == set(window_indices(resumed).tolist())
        weights = dict(zip(info["index"].tolist(), info["weight"].tolist(), strict=True))
        assert weights[index_of(0, 0)] == pytest.approx(1.0)  # the least now: 100


def test_a_view_refresh_that_fails_reads_the_changes_again(tmp_path, monkeypatch):
    """Each storage call of a view's refresh fails in turn: the next refresh still draws by
    every change flushed (a failed read does not count the change record as read)."""
    faults = Faults(monkeypatch)
    store = tmp_path / "s"
    buffer = one_hot_store(store, 4, (0, 0))
    view = open_buffer(store, prioritized=ONE_HOT)

    def flush_hot(hot: tuple[int, int]) -> None:
        buffer.update_priority(window_indices(buffer), 0.0)
        buffer.update_priority([index_of(*hot)], [1.0])
        buffer.flush()

    flush_hot((3, 0))
    faults.count()
    view.refresh()  # the record and one file (and the index)
    faults.disarm()
    calls = len(faults.calls)
    for k in range(calls):
        hot = (k % 4, k % 3)
        flush_hot(hot)
        faults.arm(k, "fail")
        with contextlib.suppress(StorageUnavailableError):
            view.refresh()
        faults.disarm()
        assert faults.fired, (k, faults.calls)
        view.refresh()
        assert drawn_keys(view) == {hot}


def test_the_change_record_is_bounded_and_a_reader_too_far_behind_reads_all(tmp_path, monkeypatch):
    monkeypatch.setattr(priority_files, "HISTORY_IDS", 3)
    location = Location.from_url(str(tmp_path))
    writer, reader = (priority_files.PriorityChanges(location) for _ in range(2))
    assert reader.changed() is None  # nothing read yet: everything
    reader.read()
    assert reader.changed() == set()  # no record: no change
    writer.record([1, 2])
    assert reader.changed() is None  # a writer it never read
    reader.read()
    writer.record([3])
    writer.record([4])
    assert reader.changed() == {3, 4}
    assert reader.changed() == {3, 4}  # not read yet: asked again, the same
    reader.read()
    writer.record([5, 6])  # the record keeps [4], [5, 6]: flush 3 is gone
    assert reader.changed() == {5, 6}
    writer.record([7, 8])
    writer.record([9])
    assert reader.changed() is None  # flush 4 is gone too: it cannot say
    document = json.loads((tmp_path / "priorities" / "changes.json").read_bytes())
    assert document["flushes"] == [[5, [7, 8]], [6, [9]]]
