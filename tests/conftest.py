"""Shared fixtures: trajectories whose every field encodes its global sample number."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.io.location import Location

pytest_plugins = ["s3_fixtures"]


# The keys of a batch RLinf's sample returns for a trajectory with observations, in its order
# (written down from RLinf, not taken from rbzarr); ``forward_inputs`` follows when stored.
RLINF_BATCH_ORDER = ["actions", "rewards", "dones", "prev_logprobs", "curr_obs", "next_obs"]


def make_trajectory(T: int, B: int, base: int, epochs: int = 1, mwid: str = "w") -> Trajectory:
    """A trajectory where flat row ``i`` of every sampled field encodes ``base + i``.

    ``dones`` holds one reset row (-1) leading each of ``epochs`` epochs.
    """
    n = (base + torch.arange(T * B, dtype=torch.int64)).reshape(T, B)
    steps = n.reshape(epochs, T // epochs, B)
    resets = torch.full((epochs, 1, B), -1, dtype=torch.int64)
    dones = torch.cat([resets, steps], dim=1).reshape(T + epochs, B, 1)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=mwid,
        actions=n.unsqueeze(-1).repeat(1, 1, 2),
        rewards=n.to(torch.float64).unsqueeze(-1),
        dones=dones,
        prev_logprobs=n.to(torch.float64),
        versions=torch.zeros(T),
        forward_inputs={"tokens": n.to(torch.int32).unsqueeze(-1).repeat(1, 1, 2)},
        curr_obs={"state": n.to(torch.float64).unsqueeze(-1).repeat(1, 1, 3)},
        next_obs={"state": (n.to(torch.float64) + 0.5).unsqueeze(-1).repeat(1, 1, 3)},
    )


def assert_rows_consistent(batch: dict) -> torch.Tensor:
    """Check every field of every sampled row encodes the same number; return the numbers."""
    numbers = batch["prev_logprobs"].to(torch.int64)
    assert torch.equal(batch["rewards"][:, 0].to(torch.int64), numbers)
    assert torch.equal(batch["actions"], numbers.unsqueeze(-1).repeat(1, 2))
    assert torch.equal(batch["dones"][:, 0], numbers)
    assert torch.equal(batch["forward_inputs"]["tokens"][:, 0].to(torch.int64), numbers)
    assert torch.equal(batch["curr_obs"]["state"][:, 1].to(torch.int64), numbers)
    assert torch.equal(batch["next_obs"]["state"][:, 2], numbers.to(torch.float64) + 0.5)
    return numbers


def assert_same_trajectory(got: Trajectory, want: Trajectory) -> None:
    """Every field equal in key order, dtype, shape and value, and the scalar fields too."""
    got_fields, want_fields = got.tensors(), want.tensors()
    assert list(got_fields) == list(want_fields)
    for key, value in want_fields.items():
        assert got_fields[key].dtype == value.dtype, key
        assert got_fields[key].shape == value.shape, key
        assert torch.equal(got_fields[key], value), key
    assert got.max_episode_length == want.max_episode_length
    assert got.model_weights_id == want.model_weights_id


def assert_checkpoint_loads(path: Any, ids: list[int], made: Callable[[int], Trajectory]) -> None:
    """A fresh buffer loads exactly ``ids`` from the checkpoint at ``path``, trajectory
    ``i`` equal to ``made(i)``."""
    loaded = TrajectoryReplayBuffer(sample_window_size=0)
    loaded.load_checkpoint(path)
    assert loaded.trajectory_ids == ids
    for i in ids:
        assert_same_trajectory(loaded.trajectory(i), made(i))


@pytest.fixture
def memory_url(request: pytest.FixtureRequest):
    """A fresh ``memory://`` URL, emptied afterwards (the memory filesystem is global)."""
    fs = fsspec.filesystem("memory")
    root = f"/test-{request.node.name}".replace("[", "-").replace("]", "")
    yield f"memory://{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def sync_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every ``os.fsync`` (``("fsync", path)``), ``os.replace`` (``("replace", target)``) and
    ``os.link`` (``("link", target)``) this test makes, in order; each still runs."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source: str, target: str) -> None:
        events.append(("replace", str(target)))
        real_replace(source, target)

    def link(source: str, target: str) -> None:
        events.append(("link", str(target)))
        real_link(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    return events


def storage_buffer(
    url: Any, options: dict[str, Any] | None = None, seed: int | None = 1234, **kw: Any
) -> TrajectoryReplayBuffer:
    """A buffer saving to ``url`` that samples from storage (no cache, every trajectory in
    its window); ``kw``: further constructor arguments, or others than these."""
    kw = {"enable_cache": False, "cache_size": 0, "sample_window_size": 0, **kw}
    return TrajectoryReplayBuffer(
        seed=seed, auto_save=True, auto_save_path=url, storage_options=options, **kw
    )


def store_reader(
    url: Any, options: dict[str, Any] | None = None, seed: int | None = 1234, **kw: Any
) -> TrajectoryReplayBuffer:
    """A :func:`storage_buffer` of the store at ``url``, its trajectories loaded."""
    buffer = storage_buffer(url, options, seed, **kw)
    buffer.load_checkpoint(url)
    return buffer


def truncate_shard(url: str, options: dict[str, Any] | None, trajectory_id: int, key: str) -> None:
    """Cut the shard of array ``key`` of trajectory ``trajectory_id`` to half its bytes (a
    pack member's: its pack's, every member's rows)."""
    location = Location.from_url(url, options)
    group = ("trajectories", str(trajectory_id))
    attributes = json.loads(location.read_bytes(*group, "zarr.json"))["attributes"]
    pack = attributes.get("rbzarr_layout", {}).get("pack")
    if pack is not None:
        group = tuple(pack["group"].split("/"))
    shard = next(
        name
        for name in location.list_files(*group)
        if name.startswith(f"{key}/") and not name.endswith("zarr.json")
    )
    parts = (*group, *shard.split("/"))
    data = location.read_bytes(*parts)
    location.write_bytes(data[: len(data) // 2], *parts)


def index_entry(trajectory_id: int, T: int, B: int, *shape: int) -> dict[str, Any]:
    """The index entry of trajectory ``trajectory_id``: ``T * B`` rows, its ``shape``
    ``[T, B, *shape]``, uuid ``u<id>``, model weights ``w``."""
    return IndexEntry.new(trajectory_id, [T, B, *shape], T, "w", uuid=f"u{trajectory_id}").to_json()


def save_as_rlinf(
    trajectory: Trajectory, folder: Path, trajectory_id: int, fmt: str, **extra: Any
) -> None:
    """Write ``trajectory`` as RLinf saves one: its fields that are not ``None`` (and
    ``extra``), in ``trajectory_<id>_<model weights id>.<fmt>``, by ``torch.save`` (pt) or
    ``pickle.dump`` (pkl)."""
    record = {
        name: getattr(trajectory, name)
        for name in trajectory.__dataclass_fields__
        if getattr(trajectory, name) is not None
    }
    record.update(extra)
    path = folder / f"trajectory_{trajectory_id}_{trajectory.model_weights_id}.{fmt}"
    if fmt == "pt":
        torch.save(record, path)
    else:
        with open(path, "wb") as handle:
            pickle.dump(record, handle)
