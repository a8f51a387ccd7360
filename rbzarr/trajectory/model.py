"""The ``Trajectory`` dataclass and its validation.

``dones``, ``terminations`` and ``truncations`` may hold ``T + E`` rows: E rollout epochs,
each led by one reset row.  Dict fields are matched by key name, never by key order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.trajectory import tree
from rbzarr.trajectory.dtypes import dtype_name
from rbzarr.trajectory.fields import (
    DICT_FIELDS,
    RESET_ROW_FIELDS,
    TENSOR_FIELDS,
    check_field_names,
    raw_time_rows,
    trajectory_scalars,
    trajectory_tensors,
)
from rbzarr.trajectory.intervention import intervened_columns, intervention_mask
from rbzarr.trajectory.shapes import Schema, TrajectorySpec, check_shapes

__all__ = [
    "DICT_FIELDS",
    "RESET_ROW_FIELDS",
    "TENSOR_FIELDS",
    "Schema",
    "Trajectory",
    "TrajectorySpec",
    "as_trajectory",
    "raw_time_rows",
    "trajectory_from_raw",
    "validate",
]


@dataclass(eq=False)
class Trajectory:
    """A batch of rollouts shaped ``[T, B, ...]``; field names, order and defaults follow RLinf.

    Two trajectories are equal when every field is: the same int and str fields, the same
    present tensor fields and dict keys (in any order), each tensor with the same dtype,
    shape and values (NaN equals NaN).

    Parameters
    ----------
    max_episode_length
        The environments' episode length limit, as RLinf records it.
    model_weights_id
        Which policy weights collected the rollouts.
    actions, intervene_flags, rewards, prev_logprobs, prev_values, versions
        ``[T, B, ...]`` per-step tensors, or ``None`` when not collected;
        ``intervene_flags`` is ``[T, B, D]``.  Validation needs ``prev_logprobs`` or
        ``rewards``: the first present sets ``T`` and ``B``.
    terminations, truncations, dones
        ``[T, B, ...]``, or ``[T + E, B, ...]`` with one reset row leading each of ``E``
        rollout epochs; ``None`` when not collected.
    forward_inputs, curr_obs, next_obs
        Nested dicts of ``[T, B, ...]`` tensors (policy inputs, observations before and
        after each step); empty when not collected.
    """

    max_episode_length: int = 0
    model_weights_id: str = ""
    actions: torch.Tensor | None = None
    intervene_flags: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    terminations: torch.Tensor | None = None
    truncations: torch.Tensor | None = None
    dones: torch.Tensor | None = None
    prev_logprobs: torch.Tensor | None = None
    prev_values: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    forward_inputs: dict[str, Any] = field(default_factory=dict)
    curr_obs: dict[str, Any] = field(default_factory=dict)
    next_obs: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> dict[str, Any]:
        """Every present tensor field as a flat dict of raw ``[T(+E), B, ...]`` values.

        Top-level fields come first in dataclass order, then ``curr_obs/...``,
        ``next_obs/...`` and ``forward_inputs/...``: the order of a sampled batch.

        Returns
        -------
        dict of str to Any
            The tensors by flat key, not copied; ``None`` fields are left out.

        Raises
        ------
        InvalidTrajectoryError
            A dict field is not a dict, or one of its keys is not a plain name.
        """
        return trajectory_tensors(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        if (self.max_episode_length, self.model_weights_id) != (
            other.max_episode_length,
            other.model_weights_id,
        ):
            return False
        mine, theirs = self.tensors(), other.tensors()
        return mine.keys() == theirs.keys() and all(
            _same_value(value, theirs[path]) for path, value in mine.items()
        )

    __hash__ = None  # type: ignore[assignment]  # compared by value, so unhashable

    def extract_intervene_traj(self, mode: str = "any") -> list[Trajectory] | None:
        """RLinf's method, same results: the intervened steps, one trajectory per env column.

        ``None`` without ``intervene_flags`` ``[T, B, D]`` or without an intervened step
        (``mode="any"``: any of the D flags set, ``"all"``: all of them).  Otherwise, for
        each column with such a step, a ``[k, 1, ...]`` trajectory of those steps in time
        order; reset-row fields keep their reset rows, ``versions`` is not carried.

        Parameters
        ----------
        mode
            ``"any"`` or ``"all"``: how the ``D`` flags of a step make it intervened.

        Returns
        -------
        list of Trajectory or None
            One ``[k, 1, ...]`` trajectory per intervened column, in column order.

        Raises
        ------
        NotImplementedError
            For a ``mode`` other than ``"any"`` and ``"all"``, as RLinf.
        ValueError
            If ``intervene_flags`` is not ``[T, B, D]`` or a field has a wrong length.
        """
        mask = intervention_mask(self.intervene_flags, mode)
        if mask is None:
            return None
        parts = [
            trajectory_from_raw(fields, self.max_episode_length, self.model_weights_id)
            for fields in intervened_columns(self.tensors(), mask)
        ]
        return parts or None


def _same_value(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return type(a) is type(b) and bool(a == b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def validate(traj: object, schema: Schema | None = None) -> TrajectorySpec:
    """Check that every field agrees on T and B (and with ``schema``, if given).

    Raises
    ------
    InvalidTrajectoryError
        A field is not a tensor, is empty, disagrees on ``T`` or ``B``, has an unsupported
        dtype, or the fields differ from ``schema``.
    """
    return validated_fields(traj, schema)[1]


def validated_fields(
    traj: object, schema: Schema | None = None
) -> tuple[dict[str, torch.Tensor], TrajectorySpec]:
    """:func:`validate`, also returning the tensors it checked (:meth:`Trajectory.tensors`).

    Raises
    ------
    InvalidTrajectoryError
        As :func:`validate`.
    """
    trajectory_scalars(traj)
    fields = trajectory_tensors(traj)
    for path, value in fields.items():
        if not isinstance(value, torch.Tensor):
            raise InvalidTrajectoryError(
                f"field {path!r}: expected a torch.Tensor, got {type(value).__name__}"
            )
        if value.layout != torch.strided:
            # Refused here, not later: the flat view is split off after add_trajectories.
            raise InvalidTrajectoryError(
                f"field {path!r}: expected a dense (strided) tensor, got layout {value.layout}"
            )
    # A trajectory laid out as one checked before (its paths, shapes and dtypes) against the
    # same schema object is checked by one lookup.
    layout = tuple((path, value.shape, value.dtype) for path, value in fields.items())
    checked = _checked.get(layout)
    if checked is not None and checked[0] is schema:
        return fields, checked[1]
    shapes = {path: tuple(value.shape) for path, value in fields.items()}
    spec = check_shapes(shapes, lambda path: _dtype(path, fields[path]), schema)
    if len(_checked) >= _CHECKED_SIZE:  # trajectories of many lengths
        _checked.clear()
    _checked[layout] = (schema, spec)
    return fields, spec


# The latest layouts checked, each with the schema it was checked against (held, so the
# identity compared is that schema's) and what the check learnt.
_checked: dict[tuple[Any, ...], tuple[Schema | None, TrajectorySpec]] = {}
_CHECKED_SIZE = 64


def _dtype(path: str, value: torch.Tensor) -> str:
    try:
        return dtype_name(value.dtype)
    except ValueError as exc:
        raise InvalidTrajectoryError(f"field {path!r}: {exc}") from exc


def trajectory_from_raw(
    fields: Mapping[str, torch.Tensor], max_episode_length: int = 0, model_weights_id: str = ""
) -> Trajectory:
    """Rebuild a :class:`Trajectory` from the flat dict returned by :meth:`Trajectory.tensors`.

    Raises
    ------
    InvalidTrajectoryError
        A top-level key is not a trajectory field.
    """
    nested = tree.unflatten(fields)
    check_field_names(nested)
    return Trajectory(
        max_episode_length=max_episode_length, model_weights_id=model_weights_id, **nested
    )


def as_trajectory(traj: object) -> Trajectory:
    """``traj`` itself if it is a :class:`Trajectory`, else one holding the same values."""
    if isinstance(traj, Trajectory):
        return traj
    return trajectory_from_raw(trajectory_tensors(traj), *trajectory_scalars(traj))
