"""ReplayDataset / ReplayLoader: prefetching, errors, seeds, demo mixing."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from rbzarr.data.datasets import ReplayDataset, concat_batches, derive_seed


class CountingBuffer:
    """``sample(n)`` returns rows tagged with the buffer's ``tag`` and a running call count."""

    def __init__(self, tag: float = 0.0, fail_on_call: int | None = None) -> None:
        self.tag = tag
        self.fail_on_call = fail_on_call
        self.calls = 0
        self.lock = threading.Lock()

    def sample(self, num_chunks: int) -> dict[str, Any]:
        with self.lock:
            self.calls += 1
            call = self.calls
        if call == self.fail_on_call:
            raise KeyError(f"sampler broke on call {call}")
        return {
            "rewards": torch.full((num_chunks, 1), self.tag),
            "curr_obs": {"call": torch.full((num_chunks, 2), float(call))},
        }


class SeededBuffer:
    """A buffer whose ``sample`` accepts a generator: rows are draws from it."""

    def sample(self, num_chunks: int, generator: torch.Generator | None = None) -> dict[str, Any]:
        return {"ids": torch.randint(0, 1 << 30, (num_chunks,), generator=generator)}


def test_yields_num_batches_then_stops() -> None:
    buffer = CountingBuffer()
    with ReplayDataset(buffer, batch_size=4, num_batches=3) as dataset:
        batches = list(dataset)
    assert [b["curr_obs"]["call"][:, 0].tolist() for b in batches] == [
        [1.0] * 4,
        [2.0] * 4,
        [3.0] * 4,
    ]
    assert all(b["rewards"].shape == (4, 1) for b in batches)
    assert buffer.calls == 3


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch", [1, 2, 5])
def test_sampler_error_reaches_the_consumer(prefetch: int) -> None:
    dataset = ReplayDataset(CountingBuffer(fail_on_call=3), batch_size=2, prefetch=prefetch)
    loader = iter(dataset)
    assert next(loader)["curr_obs"]["call"][0, 0] == 1.0
    assert next(loader)["curr_obs"]["call"][0, 0] == 2.0
    with pytest.raises(KeyError, match="sampler broke on call 3"):
        next(loader)
    assert not loader.is_running
    with pytest.raises(StopIteration):
        next(loader)


@pytest.mark.timeout(30)
def test_error_on_first_sample() -> None:
    with (
        ReplayDataset(CountingBuffer(fail_on_call=1), batch_size=2, prefetch=1) as dataset,
        pytest.raises(KeyError, match="call 1"),
    ):
        next(iter(dataset))


@pytest.mark.timeout(30)
def test_close_stops_an_endless_loader() -> None:
    buffer = CountingBuffer()
    dataset = ReplayDataset(buffer, batch_size=1, prefetch=2)
    loaders = [iter(dataset), iter(dataset)]
    next(loaders[0])
    with loaders[1]:
        next(loaders[1])
    assert not loaders[1].is_running
    assert loaders[0].is_running
    dataset.close()
    assert not loaders[0].is_running
    with pytest.raises(StopIteration):
        next(loaders[0])
    calls = buffer.calls
    dataset.close()
    assert buffer.calls == calls


def test_seeds_per_rank_and_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pinned: a change of derive_seed changes every seeded run's streams.
    assert derive_seed(7, 0, 0) == 4474668370826950401
    assert derive_seed(7, 3, 0) == 7443599362937997628
    assert derive_seed(7, 1, 2) == 3725288599296678794
    assert derive_seed(7, 1, 2, 1) == 1974998814027136257  # epoch 1
    dataset = ReplayDataset(SeededBuffer(), batch_size=3, num_batches=2, seed=7)
    with iter(dataset) as first, iter(dataset) as second:
        assert first.seed == 4474668370826950401
        assert torch.equal(next(first)["ids"], next(second)["ids"])
        # The second batch of torch.Generator().manual_seed(4474668370826950401).
        assert next(first)["ids"].tolist() == [378660024, 328248599, 461795818]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    with iter(dataset) as ranked:
        assert ranked.seed == 7443599362937997628
    seeds = {derive_seed(7, rank, worker) for rank in range(4) for worker in range(4)}
    assert len(seeds) == 16


def test_unseeded_loaders_differ() -> None:
    dataset = ReplayDataset(SeededBuffer(), batch_size=4, num_batches=1)
    with iter(dataset) as first, iter(dataset) as second:
        assert first.seed != second.seed


@pytest.mark.timeout(120)
def test_dataloader_workers_share_num_batches() -> None:
    dataset = ReplayDataset(SeededBuffer(), batch_size=2, num_batches=5, seed=1)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    batches = [batch["ids"] for batch in loader]
    assert len(batches) == 5
    streams = {}
    for worker in range(2):
        generator = torch.Generator().manual_seed(derive_seed(1, 0, worker))
        streams[worker] = torch.randint(0, 1 << 30, (6,), generator=generator)
    # DataLoader interleaves workers: 0, 1, 0, 1, 0 (worker 0 makes the extra batch)
    assert torch.equal(torch.cat(batches[0::2]), streams[0])
    assert torch.equal(torch.cat(batches[1::2]), streams[1][:4])


@settings(max_examples=40, deadline=None)
@given(batch_size=st.integers(1, 64), fraction=st.floats(0.0, 1.0))
def test_demo_mix_sizes_sum_to_batch_size(batch_size: int, fraction: float) -> None:
    dataset = ReplayDataset(
        CountingBuffer(tag=0.0),
        batch_size=batch_size,
        num_batches=1,
        demo_buffer=CountingBuffer(tag=1.0),
        demo_fraction=fraction,
    )
    with iter(dataset) as loader:
        batch = next(loader)
    tags = batch["rewards"][:, 0]
    assert tags.shape == (batch_size,)
    demo_rows = round(batch_size * fraction)
    assert tags.tolist() == [0.0] * (batch_size - demo_rows) + [1.0] * demo_rows
    assert batch["curr_obs"]["call"].shape == (batch_size, 2)


@pytest.mark.timeout(30)
def test_demo_mix_with_different_keys_fails_in_the_consumer() -> None:
    class Other:
        def sample(self, num_chunks: int) -> dict[str, Any]:
            return {"actions": torch.zeros(num_chunks)}

    dataset = ReplayDataset(CountingBuffer(), batch_size=4, demo_buffer=Other(), demo_fraction=0.5)
    with iter(dataset) as loader, pytest.raises(ValueError, match="different keys"):
        next(loader)


def test_concat_batches() -> None:
    first = {"a": torch.zeros(2, 1), "o": {"x": torch.zeros(2)}}
    second = {"a": torch.ones(1, 1), "o": {"x": torch.ones(1)}}
    mixed = concat_batches(first, second)
    assert mixed["a"][:, 0].tolist() == [0.0, 0.0, 1.0]
    assert mixed["o"]["x"].tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be > 0, got 0"),
        ({"batch_size": 2, "num_batches": -1}, "num_batches must be >= 0"),
        ({"batch_size": 2, "prefetch": 0}, "prefetch must be > 0"),
        ({"batch_size": 2, "demo_fraction": 1.5}, r"demo_fraction must be in \[0, 1\]"),
        ({"batch_size": 2, "demo_fraction": 0.5}, "needs a demo_buffer"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayDataset(CountingBuffer(), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_pin_memory_without_cuda_warns() -> None:
    with pytest.warns(UserWarning, match="no CUDA device"):
        dataset = ReplayDataset(CountingBuffer(), batch_size=2, pin_memory=True)
    assert not dataset.pin_memory


def test_dataset_pickles_without_its_loaders() -> None:
    dataset = ReplayDataset(SeededBuffer(), batch_size=2, num_batches=1, seed=3)
    with iter(dataset):
        copy = pickle.loads(pickle.dumps(dataset))
    assert [batch["ids"].shape for batch in copy] == [(2,)]
