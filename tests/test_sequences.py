"""sample_sequences: exact rows against a plain-Python oracle, episodes across trajectories."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rbzarr
from rbzarr import EmptyBufferError, Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.zarr.layout import ZarrLayout


def code(trajectory: int, env: int, step: int) -> int:
    return 1_000_000 * trajectory + 1_000 * env + step


@dataclass(frozen=True)
class Spec:
    """A trajectory of the tests: its id, T, B and the (t, env) steps that end an episode."""

    trajectory_id: int
    T: int
    B: int
    ends: frozenset[tuple[int, int]]


def make(spec: Spec) -> Trajectory:
    """obs = 1e6 * id + 1e3 * env + step; rewards = -obs; dones from ``spec.ends``."""
    T, B = spec.T, spec.B
    step = torch.arange(T).view(T, 1).expand(T, B)
    env = torch.arange(B).view(1, B).expand(T, B)
    obs = (1_000_000 * spec.trajectory_id + 1_000 * env + step).double()
    dones = torch.zeros(T, B, 1, dtype=torch.bool)
    for t, b in spec.ends:
        dones[t, b] = True
    return Trajectory(
        rewards=-obs.float().unsqueeze(-1),
        dones=dones,
        curr_obs={"state": torch.stack([obs, obs + 0.5], dim=-1)},
    )


def oracle(window: list[Spec], start: tuple[int, int, int], length: int):
    """The expected codes and mask of the sequence starting at ``(id, env, t)``."""
    by_id = {s.trajectory_id: i for i, s in enumerate(window)}
    p, b, t = by_id[start[0]], start[1], start[2]
    codes, mask, alive = [], [], True
    for _ in range(length):
        if not alive:
            codes.append(codes[-1])
            mask.append(False)
            continue
        spec = window[p]
        codes.append(code(spec.trajectory_id, b, t))
        mask.append(True)
        ended = (t, b) in spec.ends
        t += 1
        if t == spec.T:
            following = window[p + 1] if p + 1 < len(window) else None
            if (
                following is not None
                and following.trajectory_id == spec.trajectory_id + 1
                and following.B == spec.B
            ):
                p, t = p + 1, 0
            else:
                alive = False
        alive = alive and not ended
    return codes, mask


def decode(value: float) -> tuple[int, int, int]:
    v = int(value)
    return v // 1_000_000, (v % 1_000_000) // 1_000, v % 1_000


def check_batch(batch: dict, window: list[Spec], length: int) -> list[tuple[int, int, int]]:
    """Every sequence of ``batch`` is the oracle's for its first step; return the starts."""
    state = batch["curr_obs"]["state"]
    n = state.shape[0]
    assert state.shape == (n, length, 2) and state.dtype == torch.float64
    assert batch["rewards"].shape == (n, length, 1)
    assert batch["dones"].shape == (n, length, 1)
    assert batch["mask"].shape == (n, length) and batch["mask"].dtype == torch.bool
    starts = []
    for i in range(n):
        start = decode(state[i, 0, 0])
        codes, mask = oracle(window, start, length)
        expected = torch.tensor(codes, dtype=torch.float64)
        assert torch.equal(state[i, :, 0], expected), (start, state[i, :, 0], codes)
        assert torch.equal(state[i, :, 1], expected + 0.5)
        assert torch.equal(batch["rewards"][i, :, 0], -expected.float())
        assert batch["mask"][i].tolist() == mask, (start, batch["mask"][i], mask)
        starts.append(start)
    return starts


def all_starts(window: list[Spec]) -> set[tuple[int, int, int]]:
    return {(s.trajectory_id, b, t) for s in window for b in range(s.B) for t in range(s.T)}


# Three trajectories of one run (B=2), then one of another width: episodes cross 0 -> 1 -> 2.
SPECS = [
    Spec(0, 4, 2, frozenset({(1, 0)})),
    Spec(1, 3, 2, frozenset({(2, 1)})),
    Spec(2, 5, 2, frozenset({(0, 0), (3, 1)})),
    Spec(3, 4, 3, frozenset({(3, 2)})),
]


def memory_buffer(specs: list[Spec], window: int = 0, seed: int = 7) -> TrajectoryReplayBuffer:
    buffer = TrajectoryReplayBuffer(seed=seed, sample_window_size=window)
    buffer.add_trajectories([make(s) for s in specs])
    return buffer


def test_an_episode_crossing_two_trajectories_is_one_sequence() -> None:
    buffer = memory_buffer(SPECS)
    for _ in range(200):
        batch = buffer.sample_sequences(8, 6)
        for i, start in enumerate(check_batch(batch, SPECS, 6)):
            if start == (0, 0, 2):  # env 0 from step 2 of trajectory 0: across 1, into 2
                got = batch["curr_obs"]["state"][i, :, 0].long().tolist()
                assert got == [2, 3, 1_000_000, 1_000_001, 1_000_002, 2_000_000]
                assert batch["mask"][i].all()
                return
    pytest.fail("the start (0, 0, 2) was never drawn")


def test_every_start_of_the_window_is_drawn_and_nothing_older() -> None:
    window = SPECS[1:]
    buffer = memory_buffer(SPECS, window=3)
    batch = buffer.sample_sequences(3000, 4)
    starts = check_batch(batch, window, 4)
    assert set(starts) == all_starts(window)  # 3*2 + 5*2 + 4*3 = 28 starts, none of id 0


def test_strict_length_draws_only_starts_with_a_whole_sequence_ahead() -> None:
    buffer = memory_buffer(SPECS)
    length = 4
    batch = buffer.sample_sequences(3000, length, strict_length=True)
    starts = check_batch(batch, SPECS, length)
    assert batch["mask"].all()
    valid = {s for s in all_starts(SPECS) if all(oracle(SPECS, s, length)[1])}
    assert set(starts) == valid
    assert (0, 0, 2) in valid and (0, 0, 1) not in valid  # crossing counts, an end stops
    with pytest.raises(EmptyBufferError, match="strict_length"):
        buffer.sample_sequences(1, 20, strict_length=True)


def test_starts_are_uniform() -> None:
    buffer = memory_buffer(SPECS)
    firsts = buffer.sample_sequences(20_000, 1)["curr_obs"]["state"][:, 0, 0]
    tally: dict[tuple[int, int, int], int] = {}
    for value in firsts.tolist():
        tally[decode(value)] = tally.get(decode(value), 0) + 1
    expected = 20_000 / len(all_starts(SPECS))  # 40 starts: 500 each
    assert set(tally) == all_starts(SPECS)
    assert all(abs(c - expected) < 5 * expected**0.5 for c in tally.values())


def test_same_seed_same_sequences_and_sample_stream_untouched() -> None:
    first, second, plain = memory_buffer(SPECS), memory_buffer(SPECS), memory_buffer(SPECS)
    a, b = first.sample_sequences(16, 5), second.sample_sequences(16, 5)
    assert all(torch.equal(a[k], b[k]) for k in ("rewards", "dones", "mask"))
    # Sequences draw from their own stream: sample() still returns RLinf's rows.
    assert torch.equal(first.sample(32)["rewards"], plain.sample(32)["rewards"])


def test_generator_is_an_independent_reproducible_stream() -> None:
    buffer, fresh = memory_buffer(SPECS), memory_buffer(SPECS)
    one = buffer.sample_sequences(16, 5, generator=torch.Generator().manual_seed(3))
    two = buffer.sample_sequences(16, 5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(one["rewards"], two["rewards"])
    assert torch.equal(
        buffer.sample_sequences(16, 5)["rewards"], fresh.sample_sequences(16, 5)["rewards"]
    )


def test_checkpoint_restores_the_sequence_stream(tmp_path) -> None:
    buffer = memory_buffer(SPECS)
    buffer.sample_sequences(4, 3)
    buffer.save_checkpoint(tmp_path / "ckpt")
    restored = TrajectoryReplayBuffer(seed=7, sample_window_size=0)
    restored.load_checkpoint(tmp_path / "ckpt")
    want, got = buffer.sample_sequences(32, 5), restored.sample_sequences(32, 5)
    assert torch.equal(want["curr_obs"]["state"], got["curr_obs"]["state"])
    assert torch.equal(want["mask"], got["mask"])


def test_cache_store_and_pending_rows_are_the_same_sequences(tmp_path, monkeypatch) -> None:
    oracle_buffer = memory_buffer(SPECS)
    gate = threading.Event()
    write = ZarrLayout.write

    def gated_write(self, entry, trajectory):
        gate.wait(timeout=30)
        return write(self, entry, trajectory)

    monkeypatch.setattr(ZarrLayout, "write", gated_write)
    buffer = TrajectoryReplayBuffer(
        seed=7, sample_window_size=0, auto_save=True, auto_save_path=tmp_path / "s", cache_size=1
    )
    buffer.add_trajectories([make(s) for s in SPECS])
    # Nothing is committed: the last trajectory is cached, the others pending.
    pending = buffer.sample_sequences(64, 6)
    assert buffer.get_stats()["pending_writes"] == len(SPECS)
    gate.set()
    buffer.flush()
    stored = buffer.sample_sequences(64, 6)  # the first three from the store, now
    for got in (pending, stored):
        want = oracle_buffer.sample_sequences(64, 6)
        check_batch(got, SPECS, 6)
        assert torch.equal(got["curr_obs"]["state"], want["curr_obs"]["state"])
        assert torch.equal(got["mask"], want["mask"])
    buffer.release_cache()
    oracle_buffer_again = memory_buffer(SPECS)
    oracle_buffer_again.sample_sequences(64, 6)
    oracle_buffer_again.sample_sequences(64, 6)
    cold = buffer.sample_sequences(64, 6)
    assert torch.equal(
        cold["curr_obs"]["state"], oracle_buffer_again.sample_sequences(64, 6)["curr_obs"]["state"]
    )
    # A view of the store draws what a buffer with the same seed draws.
    view = rbzarr.open_buffer(tmp_path / "s", seed=7)
    got = view.sample_sequences(64, 6)
    check_batch(got, SPECS, 6)
    assert torch.equal(got["mask"], memory_buffer(SPECS).sample_sequences(64, 6)["mask"])
    state = view.state_dict()
    again = view.sample_sequences(8, 6)
    view.load_state_dict(state)
    assert torch.equal(view.sample_sequences(8, 6)["rewards"], again["rewards"])
    buffer.close()


def test_bad_requests_are_clear_errors() -> None:
    empty = TrajectoryReplayBuffer(seed=0)
    with pytest.raises(EmptyBufferError):
        empty.sample_sequences(4, 3)
    buffer = memory_buffer(SPECS)
    with pytest.raises(ValueError, match="n must be positive"):
        buffer.sample_sequences(0, 3)
    with pytest.raises(ValueError, match="length must be positive"):
        buffer.sample_sequences(3, 0)
    no_dones = TrajectoryReplayBuffer(seed=0)
    no_dones.add_trajectories([Trajectory(rewards=torch.zeros(3, 2, 1))])
    with pytest.raises(ValueError, match="'dones'"):
        no_dones.sample_sequences(2, 2)


@st.composite
def runs(draw):
    """Up to four trajectories with consecutive ids; a change of B starts a new run."""
    specs = []
    for trajectory_id in range(draw(st.integers(1, 4))):
        T, B = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 3]))
        cells = st.tuples(st.integers(0, T - 1), st.integers(0, B - 1))
        specs.append(Spec(trajectory_id, T, B, frozenset(draw(st.sets(cells, max_size=4)))))
    return specs


@settings(max_examples=30, deadline=None)
@given(specs=runs(), length=st.integers(1, 7), seed=st.integers(0, 2**31))
def test_any_run_matches_the_oracle(specs: list[Spec], length: int, seed: int) -> None:
    buffer = memory_buffer(specs, seed=seed)
    starts = check_batch(buffer.sample_sequences(300, length), specs, length)
    assert set(starts) <= all_starts(specs)
