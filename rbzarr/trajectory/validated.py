"""A trajectory validated once, on ``add_trajectories``, travelling with its spec and flat view."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from rbzarr.trajectory.flat_view import Residue, split_trajectory
from rbzarr.trajectory.model import (
    Schema,
    Trajectory,
    TrajectorySpec,
    as_trajectory,
    trajectory_from_raw,
    validate,
)

__all__ = ["ValidatedTrajectory", "clone_trajectory", "rows_to_write"]


def clone_trajectory(trajectory: Trajectory) -> Trajectory:
    """A :class:`~rbzarr.trajectory.model.Trajectory` owning copies of every tensor."""
    # One torch call per tensor: each call may wait for the GIL while the writer thread runs,
    # so a tensor that autograd does not track is not detached first (nothing to detach).
    fields = {
        key: (value.detach() if value.requires_grad else value).clone()
        for key, value in trajectory.tensors().items()
    }
    return trajectory_from_raw(fields, trajectory.max_episode_length, trajectory.model_weights_id)


@dataclass(frozen=True)
class ValidatedTrajectory:
    """A validated trajectory: raw rows, what validation learnt, and the flat view.

    ``flat`` and ``residue`` share memory with ``trajectory`` and are split off on first use,
    not on ``add_trajectories``: with ``auto_save`` the cache and the writer thread use them
    after the call has returned.
    """

    trajectory: Trajectory
    spec: TrajectorySpec

    @functools.cached_property
    def _split(self) -> tuple[dict[str, torch.Tensor], Residue]:
        return split_trajectory(self.trajectory, self.spec)

    @property
    def flat(self) -> dict[str, torch.Tensor]:
        """The ``[T*B, ...]`` rows of every sampled field, in schema order, reset rows dropped."""
        return self._split[0]

    @property
    def residue(self) -> Residue:
        """What :attr:`flat` leaves out (reset rows, unsampled fields, scalars)."""
        return self._split[1]

    @classmethod
    def check(
        cls, trajectory: object, schema: Schema | None = None, *, copy: bool = False
    ) -> ValidatedTrajectory:
        """Validate ``trajectory`` against ``schema``, optionally copying it first."""
        # RLinf's own Trajectory (or any object with its fields) is read by field name.
        trajectory = as_trajectory(trajectory)
        spec = validate(trajectory, schema)
        if copy:
            trajectory = clone_trajectory(trajectory)
        # validate() lists the schema in ``schema``'s order, and the split follows it.
        return cls(trajectory, spec)


def rows_to_write(trajectory: Trajectory | ValidatedTrajectory) -> Trajectory:
    """The raw rows a layout writes: a :class:`ValidatedTrajectory`'s as they are (validated once,
    on add), any other trajectory's after validating it.
    """
    if isinstance(trajectory, ValidatedTrajectory):
        return trajectory.trajectory
    validate(trajectory)
    return trajectory
