"""What a step is: the ``dones`` rule, a raw field's time steps, and episode continuation.

A trajectory holds ``T`` time steps of ``B`` environments.  ``dones``-like fields may store
one reset row per epoch ahead of its steps (``T + E`` raw rows); :func:`time_steps` drops
them.  The step whose ``dones`` is set (any element) ends its environment's episode.  Two
trajectories form one *run* (:func:`continues`) when their ids are consecutive and ``B`` is
the same: an episode still running at the end of one goes on in the next.  The rules take
tensors or numpy arrays alike (the read-only tools work in numpy, without torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.trajectory.fields import raw_time_rows

if TYPE_CHECKING:
    from typing import TypeVar

    import torch

    # Steps of either kind: the result is of the argument's kind.
    Steps = TypeVar("Steps", torch.Tensor, np.ndarray)

__all__ = ["DONES", "REWARDS", "continues", "continuing_runs", "episode_ends", "time_steps"]

REWARDS = "rewards"
DONES = "dones"


def time_steps(raw: Steps, T: int) -> Steps:
    """The ``T`` time steps of a raw field: the reset rows of ``dones``-like fields dropped."""
    if raw.ndim == 0 or raw.shape[0] == T:
        return raw
    return raw[raw_time_rows(np.arange(T), T, int(raw.shape[0]))]


def episode_ends(dones: Steps, T: int, B: int) -> Steps:
    """``[T, B]`` bool: the steps whose ``dones`` (``[T*B, ...]`` or ``[T, B, ...]``) is set."""
    return (dones.reshape(T, B, -1) != 0).any(-1)


def continues(entry: Mapping[str, Any], following: Mapping[str, Any]) -> bool:
    """Whether the trajectory of index entry ``following`` continues that of ``entry``."""
    return int(following["trajectory_id"]) == int(entry["trajectory_id"]) + 1 and int(
        following["shape"][1]
    ) == int(entry["shape"][1])


def continuing_runs(entries: Sequence[Mapping[str, Any]], across_trajectories: bool) -> list[bool]:
    """Per entry (in index order): whether the next one continues its run (:func:`continues`);
    the last is always false, and every one with ``across_trajectories`` false."""
    return [
        across_trajectories and i + 1 < len(entries) and continues(entry, entries[i + 1])
        for i, entry in enumerate(entries)
    ]
