"""One trajectory's time steps and the per-environment fields its episodes carry."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.trajectory.dtypes import numbers
from rbzarr.trajectory.steps import DONES, time_steps

if TYPE_CHECKING:
    import torch

    from rbzarr.storage.layout import TrajectoryLayout

    Steps = Mapping[str, torch.Tensor] | Mapping[str, np.ndarray]

__all__ = ["episode_fields", "read_step_arrays", "read_steps"]


def read_steps(
    layout: TrajectoryLayout, entry: Mapping[str, Any], keys: Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """The ``T`` time steps of each flat key of one trajectory (reset rows dropped)."""
    T = int(entry["shape"][0])
    return {k: time_steps(v, T) for k, v in layout.read(entry, keys).tensors().items()}


def read_step_arrays(
    layout: TrajectoryLayout, entry: Mapping[str, Any], keys: Sequence[str] | None
) -> dict[str, np.ndarray]:
    """:func:`read_steps` as numpy numbers (``bfloat16`` widened to ``float32``): decoded
    without torch where the layout can (a zarr store)."""
    T = int(entry["shape"][0])
    names = layout.field_dtypes(entry)
    arrays = layout.read_arrays(entry, keys)
    return {k: time_steps(numbers(v, names[k]), T) for k, v in arrays.items()}


def episode_fields(
    steps: Steps, entry: Mapping[str, Any], carried: Collection[str] | None, url: str
) -> dict[str, Any]:
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
        if v.ndim >= 2 and v.shape[1] == B and (carried is None or k in carried)
    }
    if DONES not in per_env:
        raise ValueError(f"{url}: trajectory {entry['trajectory_id']} has no 'dones' field")
    return per_env
