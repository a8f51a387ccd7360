"""What a step is: the ``dones`` rule, a raw field's time steps, and episode continuation.

A trajectory holds ``T`` time steps of ``B`` environments.  ``dones``-like fields may store
one reset row per epoch ahead of its steps (``T + E`` raw rows); :func:`time_steps` drops
them.  The step whose ``dones`` is set (any element) ends its environment's episode.  Two
trajectories form one *run* (:func:`continues`) when their ids are consecutive and ``B`` is
the same: an episode still running at the end of one goes on in the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rbzarr.trajectory.model import raw_time_rows

__all__ = ["DONES", "REWARDS", "continues", "episode_ends", "time_steps"]

REWARDS = "rewards"
DONES = "dones"


def time_steps(raw: torch.Tensor, T: int) -> torch.Tensor:
    """The ``T`` time steps of a raw field: the reset rows of ``dones``-like fields dropped."""
    if raw.dim() == 0 or raw.shape[0] == T:
        return raw
    return raw.index_select(0, raw_time_rows(torch.arange(T), T, int(raw.shape[0])))


def episode_ends(dones: torch.Tensor, T: int, B: int) -> torch.Tensor:
    """``[T, B]`` bool: the steps whose ``dones`` (``[T*B, ...]`` or ``[T, B, ...]``) is set."""
    return (dones.reshape(T, B, -1) != 0).any(dim=-1)


def continues(entry: Mapping[str, Any], following: Mapping[str, Any]) -> bool:
    """Whether the trajectory of index entry ``following`` continues that of ``entry``."""
    return int(following["trajectory_id"]) == int(entry["trajectory_id"]) + 1 and int(
        following["shape"][1]
    ) == int(entry["shape"][1])
