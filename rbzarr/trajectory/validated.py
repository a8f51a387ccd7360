"""ValidatedTrajectory: a trajectory that passed validation once, with its flat view.

The buffer validates a trajectory exactly once, on ``add_trajectories``; what validation
learnt (its :class:`~rbzarr.trajectory.model.TrajectorySpec`) and its flat ``[T*B, ...]`` view
travel with it to the cache, to the store writer and to sampling, so nothing downstream
validates or flattens it again.
"""

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
    """A :class:`~rbzarr.trajectory.model.Trajectory` owning copies of every tensor.

    Parameters
    ----------
    trajectory
        The trajectory to copy; its tensors are detached and cloned (same device).

    Returns
    -------
    Trajectory
        Same fields and scalars, sharing no memory with ``trajectory``.
    """
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

    Build one with :meth:`check`.  ``flat`` and ``residue`` share memory with
    ``trajectory``.  They are split off on first use, not on ``add_trajectories``: with
    ``auto_save`` the cache and the writer thread use them after the call has returned.

    Parameters
    ----------
    trajectory
        The raw rows as added (or their copy), reset rows included.
    spec
        What validation learnt: ``T``, ``B`` and the schema.
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
        """Validate ``trajectory`` against ``schema``, optionally copying it first.

        Parameters
        ----------
        trajectory
            The trajectory (rbzarr's or any object with the same fields).
        schema
            The schema it must match (dict keys are matched by name); ``None`` accepts any.
        copy
            Copy the tensors, so the caller may reuse its own afterwards.

        Returns
        -------
        ValidatedTrajectory
            With ``flat`` in the key order of ``schema`` (its own order without one).

        Raises
        ------
        InvalidTrajectoryError
            The trajectory's fields disagree with each other or with ``schema``.
        """
        # RLinf's own Trajectory (or any object with its fields) is read by field name.
        trajectory = as_trajectory(trajectory)
        spec = validate(trajectory, schema)
        if copy:
            trajectory = clone_trajectory(trajectory)
        # validate() lists the schema in ``schema``'s order, and the split follows it.
        return cls(trajectory, spec)


def rows_to_write(trajectory: Trajectory | ValidatedTrajectory) -> Trajectory:
    """The raw rows a layout writes: a :class:`ValidatedTrajectory`'s as they are (validated
    once, on add), any other trajectory's after validating it.

    Parameters
    ----------
    trajectory
        A validated trajectory, or a plain :class:`~rbzarr.trajectory.model.Trajectory`.

    Returns
    -------
    Trajectory
        The trajectory whose rows are written (no copy is made).

    Raises
    ------
    InvalidTrajectoryError
        ``trajectory`` is not validated and its fields disagree with each other.
    """
    if isinstance(trajectory, ValidatedTrajectory):
        return trajectory.trajectory
    validate(trajectory)
    return trajectory
