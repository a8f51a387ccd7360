"""The buffer against a plain-Python model: add / sample / save / load / clear, any order.

The model keeps the insertion-ordered list of trajectories, the id counter and its own
generator, so every ``sample()`` is checked row for row against RLinf's draw computed here.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from rbzarr import TrajectoryReplayBuffer
from rbzarr.storage.documents import read_documents
from rbzarr.storage.location import Location

SEED = 11


class BufferModel(RuleBasedStateMachine):
    """Each instance runs one random program on a fresh buffer and a fresh model."""

    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.saved = 0
        self.buffer: TrajectoryReplayBuffer | None = None

    @initialize(
        window=st.integers(0, 4), fmt=st.sampled_from(["zarr", "pt"]), auto_save=st.booleans()
    )
    def start(self, window: int, fmt: str, auto_save: bool) -> None:
        self.window = window
        self.auto_save = auto_save
        self.buffer = TrajectoryReplayBuffer(
            seed=SEED,
            sample_window_size=window,
            trajectory_format=fmt,
            auto_save=auto_save,
            auto_save_path=self.root / "store" if auto_save else "",
            cache_size=2,
        )
        self.generator = torch.Generator().manual_seed(SEED)
        self.listed: list[tuple[int, int, int]] = []  # (id, T, B) in insertion order
        self.counter = 0
        self.stored = 0  # with auto_save: one past the highest id the store holds
        self.added: list[int] = []  # every id ever handed out, in order

    def windowed(self) -> list[tuple[int, int, int]]:
        return self.listed if self.window <= 0 else self.listed[-self.window :]

    @rule(T=st.integers(1, 4), B=st.integers(1, 3))
    def add(self, T: int, B: int) -> None:
        assert self.buffer is not None
        self.buffer.add_trajectories([make_trajectory(T, B, base=1000 * self.counter)])
        self.listed.append((self.counter, T, B))
        self.added.append(self.counter)
        self.counter += 1
        self.stored = max(self.stored, self.counter) if self.auto_save else 0

    @rule(n=st.integers(1, 40))
    def sample(self, n: int) -> None:
        assert self.buffer is not None
        window = self.windowed()
        if not window:
            return
        counts = torch.tensor([T * B for _, T, B in window])
        ends = torch.cumsum(counts, 0)
        draws = torch.randint(0, int(ends[-1]), (min(n, int(ends[-1])),), generator=self.generator)
        which = torch.bucketize(draws, ends, right=True)
        rows = draws - (ends - counts)[which]
        expected = torch.tensor([1000 * window[w][0] for w in which.tolist()]) + rows
        assert torch.equal(assert_rows_consistent(self.buffer.sample(n)), expected)

    @rule(target=checkpoints)
    def save(self) -> tuple[Path, list[tuple[int, int, int]], int, torch.Tensor]:
        assert self.buffer is not None
        path = self.root / f"ckpt-{self.saved}"
        self.saved += 1
        self.buffer.save_checkpoint(path)
        return path, list(self.windowed()), self.counter, self.generator.get_state()

    @rule(checkpoint=checkpoints)
    def load(self, checkpoint: tuple[Path, list[tuple[int, int, int]], int, torch.Tensor]):
        assert self.buffer is not None
        path, listed, counter, state = checkpoint
        self.buffer.load_checkpoint(path)
        # With auto_save the store keeps every id: new ones continue past all of them.
        self.listed, self.counter = list(listed), max(counter, self.stored)
        self.generator.set_state(state)

    @rule()
    def clear(self) -> None:
        assert self.buffer is not None
        self.buffer.clear()
        # clear() keeps the auto-save store, so its ids are never handed out again.
        self.listed, self.counter = [], self.stored

    @invariant()
    def counters_agree(self) -> None:
        if self.buffer is None:
            return
        assert len(self.buffer) == len(self.listed)
        assert self.buffer.total_samples == sum(T * B for _, T, B in self.listed)
        assert self.buffer.trajectory_counter == self.counter

    def teardown(self) -> None:
        try:
            if self.buffer is not None:
                self.buffer.close()
                if self.auto_save and self.added:
                    # The store holds every trajectory ever added, each id once.
                    documents = read_documents(Location.from_url(self.root / "store"))
                    assert documents.trajectory_index["trajectory_id_list"] == self.added
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


BufferModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, derandomize=True
)
TestBufferModel = BufferModel.TestCase
