"""The flat view of a trajectory (``[T*B, ...]`` rows for sampling) and the way back.

Flat row ``i`` is time step ``i // B`` of environment ``i % B``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rbzarr.trajectory.fields import trajectory_scalars, trajectory_tensors
from rbzarr.trajectory.model import Trajectory, TrajectorySpec, trajectory_from_raw

__all__ = ["Residue", "flatten_trajectory", "join_trajectory", "split_trajectory"]


@dataclass(frozen=True)
class Residue:
    """What the flat view leaves out of a trajectory, so it can be rebuilt exactly."""

    reset_rows: dict[str, torch.Tensor]
    unsampled: dict[str, torch.Tensor]
    max_episode_length: int = 0
    model_weights_id: str = ""


def split_trajectory(
    traj: object, spec: TrajectorySpec, fields: Mapping[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], Residue]:
    """Split ``traj`` (whose tensors are ``fields``, when known) into its flat view
    (``[T*B, ...]``, reset rows dropped) and the rest.

    Both parts may share memory with ``traj``; callers that keep them must copy.
    """
    fields = trajectory_tensors(traj) if fields is None else fields
    residue = Residue({}, {}, *trajectory_scalars(traj))
    for path, raw in fields.items():
        if path not in spec.schema:
            residue.unsampled[path] = raw
    flat: dict[str, torch.Tensor] = {}
    for path in spec.schema:
        raw = fields[path]
        rows = int(raw.shape[0])
        steps = raw
        if rows != spec.T:
            epochs = rows - spec.T
            blocks = raw.reshape(epochs, rows // epochs, *raw.shape[1:])
            residue.reset_rows[path] = blocks[:, 0]
            steps = blocks[:, 1:]
        flat[path] = steps.reshape(spec.T * spec.B, *spec.schema[path][1])
    return flat, residue


def flatten_trajectory(traj: object, spec: TrajectorySpec) -> dict[str, torch.Tensor]:
    """The sampled fields of ``traj`` as ``[T*B, ...]`` tensors, reset rows dropped."""
    return split_trajectory(traj, spec)[0]


def join_trajectory(flat: dict[str, torch.Tensor], residue: Residue, B: int) -> Trajectory:
    """Rebuild the raw trajectory from :func:`split_trajectory`'s parts (the inverse)."""
    raw: dict[str, torch.Tensor] = dict(residue.unsampled)
    for path, rows in flat.items():
        steps = rows.reshape(-1, B, *rows.shape[1:])
        reset = residue.reset_rows.get(path)
        if reset is not None:
            epochs = int(reset.shape[0])
            blocks = steps.reshape(epochs, -1, *steps.shape[1:])
            steps = torch.cat([reset.unsqueeze(1), blocks], dim=1).reshape(-1, *steps.shape[1:])
        raw[path] = steps
    return trajectory_from_raw(raw, residue.max_episode_length, residue.model_weights_id)
