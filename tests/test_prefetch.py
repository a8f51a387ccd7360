"""Prefetch draws ahead but hands batches out in order: the draws with it equal those without.

``TrajectoryReplayBuffer(prefetch=N)`` discards what it drew ahead whenever the window or the
generator changes, so its batches equal no prefetch's whatever happens between calls.
``ReplayDataset`` and RLinf's preloading dataset sample on a thread: their batches are drawn
from the window as it was when the thread drew them.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import (
    PreloadReplayBufferDataset,
    ReplayBufferDataset,
    ReplayDataset,
    StorageUnavailableError,
    TrajectoryReplayBuffer,
    open_buffer,
)
from rbzarr.data.datasets import derive_seed
from rbzarr.storage.zarr import remote


def numbers(batch: dict[str, Any]) -> list[int]:
    return assert_rows_consistent(batch).tolist()


def store_buffer(path: Path, prefetch: int = 0, **options: Any) -> TrajectoryReplayBuffer:
    """A buffer whose samples read the store (no cache): what prefetch overlaps."""
    return TrajectoryReplayBuffer(
        seed=7,
        enable_cache=False,
        sample_window_size=3,
        auto_save=True,
        auto_save_path=path,
        prefetch=prefetch,
        **options,
    )


# One call of a training loop: sample n rows, add a trajectory, or reseed the generator.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("sample"), st.sampled_from([5, 5, 5, 12])),
        st.tuples(st.just("add"), st.integers(0, 9)),
        st.tuples(st.just("reseed"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=14,
)


def run_steps(buffer: TrajectoryReplayBuffer, script: list[tuple[str, int]]) -> list[list[int]]:
    batches = []
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    for kind, value in script:
        if kind == "sample":
            batches.append(numbers(buffer.sample(value)))
        elif kind == "add":
            buffer.add_trajectories([make_trajectory(4, 2, 1000 * (value + 1))])
        else:
            buffer.generator.manual_seed(value)
    return batches


@settings(max_examples=12, deadline=None)
@given(script=steps, depth=st.integers(1, 3))
def test_buffer_prefetch_hands_out_the_batches_of_no_prefetch(script, depth):
    with tempfile.TemporaryDirectory() as root:
        with store_buffer(Path(root) / "plain") as plain:
            expected = run_steps(plain, script)
        with store_buffer(Path(root) / "ahead", prefetch=depth) as ahead:
            assert run_steps(ahead, script) == expected


def test_prefetch_keeps_the_stream_of_explicit_generators_apart(tmp_path):
    with (
        store_buffer(tmp_path / "plain") as plain,
        store_buffer(tmp_path / "ahead", prefetch=2) as ahead,
    ):
        for buffer in (plain, ahead):
            buffer.add_trajectories([make_trajectory(4, 2, 0), make_trajectory(4, 2, 100)])
        mine = [torch.Generator().manual_seed(3) for _ in range(2)]
        got, want = [], []
        for _ in range(3):
            want += [numbers(plain.sample(6)), numbers(plain.sample(6, generator=mine[0]))]
            got += [numbers(ahead.sample(6)), numbers(ahead.sample(6, generator=mine[1]))]
        assert got == want
        assert torch.equal(ahead.generator.get_state(), plain.generator.get_state())


def test_prefetch_while_another_thread_adds(tmp_path):
    # Rollouts added from another thread while the trainer samples: every batch holds
    # consistent rows of trajectories in the window, and nothing deadlocks.
    with store_buffer(tmp_path / "store", prefetch=3) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, 0)])

        def add() -> None:
            for i in range(1, 21):
                buffer.add_trajectories([make_trajectory(4, 2, 1000 * i)])

        adder = threading.Thread(target=add)
        adder.start()
        seen = [numbers(buffer.sample(6)) for _ in range(60)]
        adder.join(timeout=60)
        assert not adder.is_alive()
        assert min(numbers(buffer.sample(6))) >= 18_000  # the window is the last three
    assert all(len(rows) == 6 for rows in seen)


def test_checkpoint_after_prefetched_batches_continues_exactly(tmp_path):
    trajectories = [make_trajectory(4, 2, 1000 * i) for i in range(3)]
    with store_buffer(tmp_path / "plain") as plain:
        plain.add_trajectories(trajectories)
        uninterrupted = [numbers(plain.sample(5)) for _ in range(7)]
    with store_buffer(tmp_path / "ahead", prefetch=3) as ahead:
        ahead.add_trajectories(trajectories)
        first = [numbers(ahead.sample(5)) for _ in range(3)]  # 3 more drawn ahead
        ahead.save_checkpoint(tmp_path / "checkpoint")
        assert [numbers(ahead.sample(5)) for _ in range(4)] == uninterrupted[3:]
    with store_buffer(tmp_path / "restored", prefetch=3) as restored:
        restored.load_checkpoint(tmp_path / "checkpoint")
        rest = [numbers(restored.sample(5)) for _ in range(4)]
    assert first + rest == uninterrupted
    # A buffer that drew ahead from another window and generator state before loading.
    with TrajectoryReplayBuffer(seed=1, sample_window_size=3, prefetch=3) as in_memory:
        in_memory.add_trajectories([make_trajectory(4, 2, 9000)])
        in_memory.sample(5)
        in_memory.load_checkpoint(tmp_path / "checkpoint")
        assert [numbers(in_memory.sample(5)) for _ in range(4)] == rest


@pytest.fixture
def ranged_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are read by byte ranges, every batch: no shard is held whole or inline."""
    monkeypatch.setattr(remote, "WHOLE_SHARD_BYTES", 0)
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)


@pytest.mark.s3
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ranged_reads")
def test_prefetched_s3_reads_happen_before_the_caller_asks(s3_bucket, s3_options, s3_proxy):
    # The proxy's log shows the reads of the two batches after the first one done while
    # the caller trains: once they are logged the store goes down, and the next two
    # sample() calls still hand out the right batches, with no request of their own.
    with store_buffer(f"s3://{s3_bucket}/store", prefetch=2, storage_options=s3_options) as buffer:
        buffer.add_trajectories([make_trajectory(8, 2, 0)])
        buffer.flush()
        buffer.sample(4, generator=torch.Generator())  # opens the arrays; the stream stays
        # The next three batches of the stream, drawn with a copy of it (no read-ahead),
        # and the requests their reads make.
        copy = torch.Generator()
        copy.set_state(buffer.generator.get_state())
        want, requests = [], 0
        for _ in range(3):
            s3_proxy.reset_log()
            want.append(numbers(buffer.sample(4, generator=copy)))
            requests += len(s3_proxy.requests)
        s3_proxy.reset_log()
        got = [numbers(buffer.sample(4))]  # its own read; the next two are drawn and read
        deadline = time.monotonic() + 60  # liveness only
        while len(s3_proxy.requests) < requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(s3_proxy.requests) == requests  # the three batches' reads, nothing else
        s3_proxy.go_down()
        got += [numbers(buffer.sample(4)) for _ in range(2)]  # read before they were asked
        s3_proxy.go_up()
    assert got == want


@pytest.mark.s3
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ranged_reads")
def test_a_failed_prefetched_read_is_raised_in_order_and_later_batches_read_again(
    s3_bucket, s3_options, s3_proxy
):
    trajectories = [make_trajectory(8, 2, 1000 * i) for i in range(1)]
    with store_buffer(Path(tempfile.mkdtemp()) / "plain") as plain:
        plain.add_trajectories(trajectories)
        reference = [numbers(plain.sample(4)) for _ in range(8)]
    path = f"s3://{s3_bucket}/store"
    with store_buffer(path, prefetch=2, storage_options=s3_options) as buffer:
        buffer.add_trajectories(trajectories)
        buffer.flush()
        got = [numbers(buffer.sample(4))]
        s3_proxy.fail_with(503)
        # Batches read before the failure are still handed out; the first that needs the
        # store raises, and its draw is spent as a failed call without prefetch spends it.
        with pytest.raises(StorageUnavailableError):
            while True:
                got.append(numbers(buffer.sample(4)))
        failed = len(got)
        s3_proxy.fail_with(None)
        got += [numbers(buffer.sample(4)) for _ in range(7 - failed)]
    assert 1 <= failed <= 3
    assert got == reference[:failed] + reference[failed + 1 :]


def test_prefetch_is_refused_when_negative_and_off_after_close(tmp_path):
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        TrajectoryReplayBuffer(prefetch=-1)
    buffer = store_buffer(tmp_path / "store", prefetch=2)
    plain = TrajectoryReplayBuffer(seed=7, sample_window_size=3)
    for b in (buffer, plain):
        b.add_trajectories([make_trajectory(4, 2, 0)])
    assert (buffer.prefetch, plain.prefetch) == (2, 0)
    assert numbers(buffer.sample(3)) == numbers(plain.sample(3))
    buffer.close()
    assert numbers(buffer.sample(3)) == numbers(plain.sample(3))


@pytest.mark.parametrize("cls", [ReplayBufferDataset, PreloadReplayBufferDataset])
def test_rlinf_datasets_over_a_prefetching_buffer_draw_rlinfs_batches(tmp_path, cls):
    def batches(prefetch: int) -> list[list[int]]:
        with store_buffer(tmp_path / f"store-{prefetch}", prefetch=prefetch) as buffer:
            buffer.add_trajectories([make_trajectory(4, 2, 1000 * i) for i in range(3)])
            dataset = cls(buffer, None, 6, 1, 0)
            iterator = iter(dataset)
            out = [numbers(next(iterator)) for _ in range(5)]
            dataset.close()
            return out

    assert batches(3) == batches(0)


def dataset_reference(buffer: Any, seed: int, worker: int, count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(derive_seed(seed, 0, worker, 0))
    return [numbers(buffer.sample(6, generator=generator)) for _ in range(count)]


def test_replay_dataset_batches_do_not_depend_on_prefetch():
    buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=4)
    buffer.add_trajectories([make_trajectory(4, 2, 1000 * i) for i in range(4)])
    got = {}
    for prefetch in (1, 4):
        with ReplayDataset(buffer, 6, num_batches=8, prefetch=prefetch, seed=5) as dataset:
            got[prefetch] = [numbers(b) for b in dataset]
    assert got[1] == got[4] == dataset_reference(buffer, 5, 0, 8)


def test_replay_dataset_batch_sees_the_window_as_it_was_when_drawn():
    prefetch, before = 3, 2
    trajectories = [make_trajectory(4, 2, 1000 * i) for i in range(3)]
    buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=2)
    buffer.add_trajectories(trajectories[:2])
    with ReplayDataset(buffer, 6, prefetch=prefetch, seed=5) as dataset:
        loader = iter(dataset)
        got = [numbers(next(loader)) for _ in range(before)]
        deadline = time.monotonic() + 30
        while loader.batches_ready < prefetch:  # the thread has drawn all it may
            assert time.monotonic() < deadline
            time.sleep(0.005)
        buffer.add_trajectories(trajectories[2:])
        got += [numbers(next(loader)) for _ in range(prefetch + 3)]
    # The reference draws in the caller's thread: the batches drawn before the add, then after.
    reference = TrajectoryReplayBuffer(seed=0, sample_window_size=2)
    reference.add_trajectories(trajectories[:2])
    generator = torch.Generator().manual_seed(derive_seed(5, 0, 0, 0))
    want = [numbers(reference.sample(6, generator=generator)) for _ in range(before + prefetch)]
    reference.add_trajectories(trajectories[2:])
    want += [numbers(reference.sample(6, generator=generator)) for _ in range(3)]
    assert got == want
    assert min(got[-1]) >= 1000


@pytest.mark.timeout(120)
def test_replay_dataset_in_fork_workers_draws_the_same_with_any_prefetch(tmp_path):
    with store_buffer(tmp_path / "store", prefetch=2) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, 1000 * i) for i in range(3)])
        buffer.flush()
        buffer.sample(4)  # the buffer's read-ahead threads are running when the workers fork
        got = {}
        for prefetch in (1, 3):
            dataset = ReplayDataset(buffer, 6, num_batches=6, prefetch=prefetch, seed=2)
            loader = dataset.data_loader(num_workers=2, multiprocessing_context="fork")
            got[prefetch] = [numbers(b) for b in loader]
    view = open_buffer(str(tmp_path / "store"), sample_window_size=3)
    # DataLoader takes the workers' batches in turn: 0, 1, 0, 1, ...
    per_worker = [dataset_reference(view, 2, worker, 3) for worker in (0, 1)]
    want = [batch for pair in zip(*per_worker, strict=True) for batch in pair]
    assert got[1] == got[3] == want


def test_training_bench_suite_reports_steps_and_the_ratio(memory_url):
    from click.testing import CliRunner  # noqa: PLC0415

    from benchmarks.__main__ import main  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as out:
        result = CliRunner().invoke(
            main,
            [
                "--quick",
                "--suites",
                "training",
                "--training-store",
                memory_url,
                "--training-buffer-option",
                "cache_size=0",
                "--out",
                out,
            ],
        )
        assert result.exit_code == 0, result.output
        document = json.loads((Path(out) / "training.json").read_text())
    entry = document["results"]["image"]
    assert entry["buffer_options"] == {"cache_size": 0}
    for store in ("local", "s3"):
        assert [entry[store][mode]["prefetch"] for mode in ("no_prefetch", "prefetch")] == [0, 2]
        assert all(entry[store][mode]["steps"] >= 1 for mode in ("no_prefetch", "prefetch"))
    ratio = entry["s3"]["prefetch"]["steps_s"] / entry["local"]["prefetch"]["steps_s"]
    assert entry["s3_vs_local"]["prefetch"] == pytest.approx(ratio)
    (found,) = document["targets"]
    assert found["target"] == "training: 10 ms step with prefetch, S3 steps/s >= 0.9x local"
    assert found["value"] == round(ratio, 3)
    assert "requests/step" not in result.output  # no proxy: requests are not counted
