"""One trajectory's time steps and the per-environment fields its episodes carry."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.trajectory.steps import DONES, time_steps

__all__ = ["episode_fields", "read_steps"]


def read_steps(
    layout: TrajectoryLayout, entry: Mapping[str, Any], keys: Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """The ``T`` time steps of each flat key of one trajectory (reset rows dropped)."""
    T = int(entry["shape"][0])
    return {k: time_steps(v, T) for k, v in layout.read(entry, keys).tensors().items()}


def episode_fields(
    steps: Mapping[str, torch.Tensor],
    entry: Mapping[str, Any],
    carried: Collection[str] | None,
    url: str,
) -> dict[str, torch.Tensor]:
    """The ``[T, B, ...]`` fields among ``carried`` (all when ``None``) that episodes carry.

    Raises
    ------
    ValueError
        The trajectory has no ``dones`` field.
    """
    B = int(entry["shape"][1])
    per_env = {
        k: v
        for k, v in steps.items()
        if v.dim() >= 2 and v.shape[1] == B and (carried is None or k in carried)
    }
    if DONES not in per_env:
        raise ValueError(f"{url}: trajectory {entry['trajectory_id']} has no 'dones' field")
    return per_env
