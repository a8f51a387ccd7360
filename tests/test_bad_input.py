"""Bad input: every malformed trajectory is a ``ValueError`` that leaves everything unchanged.

A buffer holding two good trajectories (so it has a schema) is offered one call of
``[good, bad]``; the whole call must be refused with an error naming the bad field, and the
buffer's counters, index, sampler state and store files must be exactly as before.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import InvalidTrajectoryError, Trajectory, TrajectoryReplayBuffer

pytestmark = pytest.mark.timeout(120)

T, B = 4, 3
# flat key -> (attribute, key inside the dict or None)
SAMPLED = {
    "actions": ("actions", None),
    "rewards": ("rewards", None),
    "prev_logprobs": ("prev_logprobs", None),
    "dones": ("dones", None),
    "curr_obs/state": ("curr_obs", "state"),
    "next_obs/state": ("next_obs", "state"),
    "forward_inputs/tokens": ("forward_inputs", "tokens"),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8]
DTYPES += [torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


def get(traj: Trajectory, key: str) -> Any:
    attribute, inner = SAMPLED[key]
    value = getattr(traj, attribute)
    return value if inner is None else value[inner]


def put(traj: Trajectory, key: str, value: Any) -> Trajectory:
    attribute, inner = SAMPLED[key]
    if inner is None:
        setattr(traj, attribute, value)
    else:
        getattr(traj, attribute)[inner] = value
    return traj


def resized(value: torch.Tensor, rows: int, envs: int) -> torch.Tensor:
    return torch.zeros((rows, envs, *value.shape[2:]), dtype=value.dtype)


@st.composite
def bad_trajectories(draw: st.DrawFn) -> tuple[Trajectory, list[str]]:
    """A trajectory that must be refused, and strings its error must contain."""
    traj = make_trajectory(T, B, 5000)
    key = draw(st.sampled_from(sorted(SAMPLED)))
    value = get(traj, key)
    kind = draw(
        st.sampled_from(
            ["T", "B", "dtype", "trailing", "non_tensor", "nested_dict", "absurd", "empty"]
        )
    )
    if kind == "T":
        valid = {T, T + 1, T + 2, T + 4} if key == "dones" else {T}
        rows = draw(st.integers(1, 12).filter(lambda r: r not in valid))
        bad = resized(value, rows, B)
        # A reset-row field with a bad epoch count is reported by its row count; T and B are
        # those most fields agree on, so the field at fault is the one named.
        shape = f"got {rows}" if key == "dones" else str(tuple(bad.shape))
        return put(traj, key, bad), [key, shape]
    if kind == "B":
        envs = draw(st.integers(1, 8).filter(lambda b: b != B))
        bad = resized(value, value.shape[0], envs)
        return put(traj, key, bad), [key, str(tuple(bad.shape))]
    if kind == "dtype":
        dtype = draw(st.sampled_from([d for d in DTYPES if d != value.dtype]))
        return put(traj, key, value.to(dtype)), [key, str(dtype).removeprefix("torch.")]
    if kind == "trailing":
        shapes = [(), (1,), (2,), (3,), (2, 2)]
        trailing = draw(st.sampled_from([s for s in shapes if s != tuple(value.shape[2:])]))
        bad = torch.zeros((*value.shape[:2], *trailing), dtype=value.dtype)
        return put(traj, key, bad), [key]
    if kind == "non_tensor":
        other = draw(st.sampled_from(["list", "numpy", "int", "str"]))
        bad_value = {
            "list": value.tolist(),
            "numpy": value.to(torch.float64).numpy(),
            "int": 3,
            "str": "oops",
        }[other]
        return put(traj, key, bad_value), [key, "torch.Tensor"]
    if kind == "nested_dict":
        return put(traj, key, {"inner": value}), [key]
    if kind == "absurd":
        # A huge, consistent-looking view that costs no memory: validation must not copy it.
        rows = draw(st.sampled_from([10**9, 2**40]))
        bad = torch.zeros(1, dtype=value.dtype).expand(rows, B, *value.shape[2:])
        return put(traj, key, bad), [key, str(rows)]
    # empty: zero rows or zero environments everywhere
    empty = make_trajectory(0, B, 0) if draw(st.booleans()) else make_trajectory(T, 0, 0)
    return empty, ["prev_logprobs", "no samples"]


def file_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def snapshot(buffer: TrajectoryReplayBuffer, root: Path) -> tuple:
    buffer.flush()
    return (
        len(buffer),
        buffer.total_samples,
        buffer.trajectory_counter,
        buffer.get_stats(),
        buffer.index_entries,
        buffer.trajectory_ids,
        buffer.generator.get_state().tolist(),
        file_hashes(root),
    )


def populated(root: Path, mode: str) -> TrajectoryReplayBuffer:
    if mode == "memory":
        buffer = TrajectoryReplayBuffer(sample_window_size=0)
    else:
        buffer = TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=root / "s", trajectory_format=mode, cache_size=1
        )
    buffer.add_trajectories([make_trajectory(T, B, 0), make_trajectory(T, B, 100, epochs=2)])
    return buffer


@pytest.mark.parametrize("mode", ["memory", "zarr", "pt"])
def test_bad_trajectories_are_refused_and_change_nothing(tmp_path, mode):
    buffer = populated(tmp_path, mode)
    before = snapshot(buffer, tmp_path)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(case=bad_trajectories(), bad_first=st.booleans())
    def check(case: tuple[Trajectory, list[str]], bad_first: bool) -> None:
        bad, names = case
        good = make_trajectory(T, B, 9000)
        with pytest.raises(InvalidTrajectoryError) as info:
            buffer.add_trajectories([bad, good] if bad_first else [good, bad])
        assert isinstance(info.value, ValueError)
        for name in names:
            assert name in str(info.value), (name, str(info.value))
        assert snapshot(buffer, tmp_path) == before

    check()
    numbers = assert_rows_consistent(buffer.sample(64))
    assert set(numbers.tolist()) <= set(range(12)) | set(range(100, 112))
    buffer.add_trajectories([make_trajectory(T, B, 200)])
    assert buffer.trajectory_counter == 3
    buffer.close()


@pytest.mark.parametrize(
    "item", [None, 3, "trajectory", {"rewards": torch.zeros(2, 2)}, torch.zeros(4, 3)]
)
def test_non_trajectories_are_refused(tmp_path, item):
    buffer = populated(tmp_path, "zarr")
    before = snapshot(buffer, tmp_path)
    with pytest.raises(InvalidTrajectoryError, match="expected a Trajectory"):
        buffer.add_trajectories([make_trajectory(T, B, 9000), item])
    assert snapshot(buffer, tmp_path) == before
    buffer.close()


def test_wrong_nesting_of_dict_fields_is_refused(tmp_path):
    buffer = populated(tmp_path, "memory")
    before = snapshot(buffer, tmp_path)
    cases: list[tuple[str, Any]] = [
        ("curr_obs", torch.zeros(T, B, 3)),  # a tensor where a dict is expected
        ("curr_obs", {"state": {"state": torch.zeros(T, B, 3, dtype=torch.float64)}}),
        ("next_obs", {}),  # a whole dict missing
        ("forward_inputs", {"tokens": np.zeros((T, B, 2), dtype=np.int32)}),
        ("forward_inputs", {1: torch.zeros(T, B, 2, dtype=torch.int32)}),
        ("forward_inputs", {"": torch.zeros(T, B, 2, dtype=torch.int32)}),
    ]
    for attribute, value in cases:
        bad = make_trajectory(T, B, 5000)
        setattr(bad, attribute, value)
        with pytest.raises(InvalidTrajectoryError, match=attribute):
            buffer.add_trajectories([bad])
        assert snapshot(buffer, tmp_path) == before


def test_dones_epochs_must_divide_T(tmp_path):
    buffer = populated(tmp_path, "memory")
    bad = make_trajectory(T, B, 5000)
    bad.dones = torch.zeros(T + 3, B, 1, dtype=torch.int64)  # E=3 does not divide T=4
    with pytest.raises(InvalidTrajectoryError, match=r"'dones'.*7"):
        buffer.add_trajectories([bad])
    assert len(buffer) == 2


def test_a_trajectory_without_samples_is_refused_even_first():
    buffer = TrajectoryReplayBuffer()
    bare = Trajectory(actions=torch.zeros(T, B, 2))
    with pytest.raises(InvalidTrajectoryError, match="no samples"):
        buffer.add_trajectories([bare])
    assert len(buffer) == 0 and buffer.trajectory_counter == 0
