"""The buffer against a plain-Python model: add / sample / save / load / clear, any order.

The model keeps the insertion-ordered list of trajectories and the id counter; RLinf's own
buffer holding the model's trajectories (rebuilt, its generator carried over, whenever a
load or a clear replaces the list) is the oracle of every ``sample()``, tensor for tensor.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from rlinf_oracle import RLinfBuffer, assert_batches_equal, rlinf_copy, rlinf_window

from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import read_documents

SEED = 11
STEPS = 30  # rules per program: no program adds more trajectories
Listing = list[tuple[int, Trajectory]]  # (id, trajectory) in insertion order


class BufferModel(RuleBasedStateMachine):
    """Each instance runs one random program on a fresh buffer and a fresh model."""

    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.saved = 0
        self.buffer: TrajectoryReplayBuffer | None = None
        self.oracle: RLinfBuffer | None = None

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
        self.listed: Listing = []
        self.rebuild_oracle(torch.Generator().manual_seed(SEED).get_state())
        self.counter = 0
        self.stored = 0  # with auto_save: one past the highest id the store holds
        self.added: list[int] = []  # every id ever handed out, in order

    def windowed(self) -> Listing:
        return self.listed if self.window <= 0 else self.listed[-self.window :]

    def rebuild_oracle(self, generator_state: torch.Tensor) -> None:
        """RLinf's buffer over ``self.listed``, drawing on from ``generator_state``."""
        if self.oracle is not None:
            self.oracle.close()
        self.oracle = RLinfBuffer(seed=SEED, sample_window_size=rlinf_window(self.window, STEPS))
        self.oracle.add_trajectories([rlinf_copy(traj) for _, traj in self.listed])
        self.oracle.random_generator.set_state(generator_state)

    @rule(T=st.integers(1, 4), B=st.integers(1, 3))
    def add(self, T: int, B: int) -> None:
        assert self.buffer is not None and self.oracle is not None
        traj = make_trajectory(T, B, base=1000 * self.counter)
        self.buffer.add_trajectories([traj])
        self.oracle.add_trajectories([rlinf_copy(traj)])
        self.listed.append((self.counter, traj))
        self.added.append(self.counter)
        self.counter += 1
        self.stored = max(self.stored, self.counter) if self.auto_save else 0

    @rule(n=st.integers(1, 40))
    def sample(self, n: int) -> None:
        assert self.buffer is not None and self.oracle is not None
        if not self.listed:
            for buffer in (self.buffer, self.oracle):
                with pytest.raises(RuntimeError):
                    buffer.sample(n)
            return
        batch = self.buffer.sample(n)
        assert_rows_consistent(batch)
        assert_batches_equal(batch, self.oracle.sample(n))

    @rule(target=checkpoints)
    def save(self) -> tuple[Path, Listing, int, torch.Tensor]:
        assert self.buffer is not None and self.oracle is not None
        path = self.root / f"ckpt-{self.saved}"
        self.saved += 1
        self.buffer.save_checkpoint(path)
        return path, list(self.windowed()), self.counter, self.oracle.random_generator.get_state()

    @rule(checkpoint=checkpoints)
    def load(self, checkpoint: tuple[Path, Listing, int, torch.Tensor]):
        assert self.buffer is not None
        path, listed, counter, state = checkpoint
        self.buffer.load_checkpoint(path)
        # With auto_save the store keeps every id: new ones continue past all of them.
        self.listed, self.counter = list(listed), max(counter, self.stored)
        self.rebuild_oracle(state)

    @rule()
    def clear(self) -> None:
        assert self.buffer is not None and self.oracle is not None
        self.buffer.clear()
        # clear() keeps the auto-save store, so its ids are never handed out again.
        self.listed, self.counter = [], self.stored
        self.rebuild_oracle(self.oracle.random_generator.get_state())

    @invariant()
    def counters_agree(self) -> None:
        if self.buffer is None:
            return
        assert len(self.buffer) == len(self.listed)
        assert self.oracle is not None and len(self.oracle) == len(self.listed)
        assert self.buffer.total_samples == self.oracle.total_samples
        assert self.buffer.trajectory_counter == self.counter

    def teardown(self) -> None:
        try:
            if self.oracle is not None:
                self.oracle.close()
            if self.buffer is not None:
                self.buffer.close()
                if self.auto_save and self.added:
                    # The store holds every trajectory ever added, each id once.
                    documents = read_documents(Location.from_url(self.root / "store"))
                    assert documents.trajectory_index["trajectory_id_list"] == self.added
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


BufferModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=STEPS, deadline=None, derandomize=True
)
TestBufferModel = BufferModel.TestCase
