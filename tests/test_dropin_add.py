"""``add_trajectories`` with RLinf's own ``Trajectory`` objects and with dict keys in any order."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_oracle import RLinfTrajectory, make_rlinf_trajectory

from rbzarr import InvalidTrajectoryError, TrajectoryReplayBuffer
from rbzarr.trajectory.model import as_trajectory

MODES = ["memory", "zarr", "pt"]


def new_buffer(root: Path, mode: str, seed: int = 3) -> TrajectoryReplayBuffer:
    if mode == "memory":
        return TrajectoryReplayBuffer(seed=seed, sample_window_size=0)
    return TrajectoryReplayBuffer(
        seed=seed,
        auto_save=True,
        auto_save_path=root / "s",
        trajectory_format=mode,
        cache_size=1,
        sample_window_size=0,
    )


def files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("mode", MODES)
def test_rlinf_trajectories_sample_like_ours(tmp_path, mode):
    ours = new_buffer(tmp_path / "ours", mode)
    theirs = new_buffer(tmp_path / "theirs", mode)
    shapes = [(4, 3, 0, 2), (2, 2, 100, 1), (3, 1, 200, 3)]
    ours.add_trajectories([make_trajectory(*s) for s in shapes])
    theirs.add_trajectories([make_rlinf_trajectory(*s) for s in shapes])
    for _ in range(3):
        want, got = ours.sample(40), theirs.sample(40)
        assert_rows_consistent(got)
        assert torch.equal(got["prev_logprobs"], want["prev_logprobs"])
        assert list(got) == list(want) and list(got["curr_obs"]) == list(want["curr_obs"])
    ours.close()
    theirs.close()


@pytest.mark.parametrize("mode", MODES)
def test_caller_may_mutate_an_rlinf_trajectory_after_add(tmp_path, mode):
    buffer = new_buffer(tmp_path, mode)
    traj = make_rlinf_trajectory(3, 2, 0, epochs=3)
    buffer.add_trajectories([traj, make_rlinf_trajectory(2, 2, 6)])
    for value in (traj.rewards, traj.prev_logprobs, traj.dones, traj.curr_obs["state"]):
        value.fill_(-5)
    traj.curr_obs["state"] = torch.zeros(3, 2, 3)
    buffer.flush()
    for _ in range(5):
        assert set(assert_rows_consistent(buffer.sample(16)).tolist()) <= set(range(10))
    buffer.close()


def broken(kind: str) -> RLinfTrajectory:
    traj = make_rlinf_trajectory(2, 2, 50)
    if kind == "shape":
        traj.actions = torch.zeros(3, 2, 2, dtype=torch.int64)
    elif kind == "dtype":
        traj.curr_obs = {"state": traj.curr_obs["state"].float()}
    elif kind == "missing":
        traj.rewards = traj.prev_logprobs = None
    elif kind == "extra_key":
        traj.next_obs = {**traj.next_obs, "extra": torch.zeros(2, 2)}
    return traj


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("shape", "trajectory 1 of this call: field 'actions': expected T=2, B=2"),
        ("dtype", "field 'curr_obs/state': expected dtype float64"),
        ("missing", "no samples"),
        ("extra_key", "unexpected \\['next_obs/extra'\\]"),
    ],
)
def test_bad_rlinf_trajectories_change_nothing(tmp_path, mode, kind, message):
    buffer = new_buffer(tmp_path, mode)
    buffer.add_trajectories([make_rlinf_trajectory(2, 2, 0)])
    buffer.flush()
    before = (len(buffer), buffer.total_samples, buffer.trajectory_counter, buffer.get_stats())
    stored = files(tmp_path)
    with pytest.raises(InvalidTrajectoryError, match=message):
        buffer.add_trajectories([make_rlinf_trajectory(2, 2, 4), broken(kind)])
    buffer.flush()
    after = (len(buffer), buffer.total_samples, buffer.trajectory_counter, buffer.get_stats())
    assert after == before and files(tmp_path) == stored
    assert set(assert_rows_consistent(buffer.sample(16)).tolist()) <= set(range(4))
    buffer.close()


# -- dict keys are matched by name ------------------------------------------------------
KEYS = ("a", "b", "c")
INNER = ("x", "y")


def keyed(number: torch.Tensor, index: int) -> torch.Tensor:
    """The value of key ``index`` for rows numbered ``number``: ``10 * number + index``."""
    return (10 * number + index).to(torch.float64).unsqueeze(-1)


def permuted_dict(number: torch.Tensor, order: list[int], inner: list[int]) -> dict:
    out: dict = {}
    for k in order:
        out[KEYS[k]] = keyed(number, k)
        if k == 0:  # a nested dict, permuted too
            out["nest"] = {INNER[i]: keyed(number, 5 + i) for i in inner}
    return out


@st.composite
def key_orders(draw: st.DrawFn) -> list[tuple[list[int], list[int]]]:
    count = draw(st.integers(2, 5))
    orders = st.permutations(range(len(KEYS)))
    inner = st.permutations(range(len(INNER)))
    return [(list(draw(orders)), list(draw(inner))) for _ in range(3 * count)]


def keyed_trajectory(position: int, orders: list[tuple[list[int], list[int]]]):
    T, B = 2, 3
    number = (100 * position + torch.arange(T * B)).reshape(T, B)
    curr, following, forward = orders[3 * position : 3 * position + 3]
    traj = RLinfTrajectory(
        rewards=number.to(torch.float64).unsqueeze(-1),
        prev_logprobs=number.to(torch.float64),
        curr_obs=permuted_dict(number, *curr),
        next_obs=permuted_dict(number, *following),
        forward_inputs=permuted_dict(number, *forward),
    )
    return traj if position % 2 else as_trajectory(traj)


def check_keyed(batch: dict) -> None:
    number = batch["prev_logprobs"].to(torch.int64)
    for field in ("curr_obs", "next_obs", "forward_inputs"):
        for k, key in enumerate(KEYS):
            assert torch.equal(batch[field][key][:, 0], (10 * number + k).double()), (field, key)
        for i, key in enumerate(INNER):
            got = batch[field]["nest"][key][:, 0]
            assert torch.equal(got, (10 * number + 5 + i).double()), (field, key)


@settings(max_examples=15, deadline=None)
@given(key_orders(), st.sampled_from(MODES))
def test_dict_keys_are_matched_by_name_never_by_order(orders, mode):
    count = len(orders) // 3
    trajectories = [keyed_trajectory(p, orders) for p in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        buffer = new_buffer(root, mode)
        buffer.add_trajectories(trajectories[:1])
        buffer.add_trajectories(trajectories[1:])
        for _ in range(3):
            batch = buffer.sample(64)
            check_keyed(batch)
            # a batch lists keys in the first trajectory's order, as RLinf's does
            assert list(batch["curr_obs"]) == list(trajectories[0].curr_obs)
        buffer.save_checkpoint(root / "ckpt")
        buffer.close()
        loaded = new_buffer(root / "other", "memory")
        loaded.load_checkpoint(root / "ckpt")
        check_keyed(loaded.sample(64))
        loaded.add_trajectories([keyed_trajectory(count, orders + orders[:3])])
        check_keyed(loaded.sample(64))
        loaded.close()
