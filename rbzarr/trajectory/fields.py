"""RLinf's trajectory field names, and the one place that reads them from any object.

A field an object lacks reads as its default (older RLinf releases have no ``versions``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.trajectory import tree

if TYPE_CHECKING:
    from typing import TypeVar

    import numpy as np
    import torch

    # Rows of either kind: the result is of the argument's kind.
    Rows = TypeVar("Rows", torch.Tensor, np.ndarray)

__all__ = [
    "DICT_FIELDS",
    "FIELD_NAMES",
    "RESET_ROW_FIELDS",
    "SCALAR_FIELDS",
    "TENSOR_FIELDS",
    "check_field_names",
    "raw_time_rows",
    "trajectory_scalars",
    "trajectory_tensors",
]

SCALAR_FIELDS = ("max_episode_length", "model_weights_id")
TENSOR_FIELDS = (
    "actions",
    "intervene_flags",
    "rewards",
    "terminations",
    "truncations",
    "dones",
    "prev_logprobs",
    "prev_values",
    "versions",
)
# The order RLinf emits nested dicts in a sampled batch (not the dataclass order).
DICT_FIELDS = ("curr_obs", "next_obs", "forward_inputs")
# Fields that may carry one reset row per rollout epoch, in field order.
RESET_ROW_FIELDS = ("terminations", "truncations", "dones")
# RLinf's dataclass order.
FIELD_NAMES = (*SCALAR_FIELDS, *TENSOR_FIELDS, "forward_inputs", "curr_obs", "next_obs")


def check_field_names(nested: Mapping[str, Any]) -> None:
    """Refuse a nested dict of fields (:func:`~rbzarr.trajectory.tree.unflatten`) with a
    top-level key that is not a trajectory's tensor or dict field.

    Raises
    ------
    InvalidTrajectoryError
        The unknown keys, named.
    """
    unknown = [k for k in nested if k not in TENSOR_FIELDS and k not in DICT_FIELDS]
    if unknown:
        raise InvalidTrajectoryError(f"unknown trajectory fields {unknown}")


def _check_is_trajectory(traj: object) -> None:
    if not any(hasattr(traj, name) for name in FIELD_NAMES):
        raise InvalidTrajectoryError(
            f"expected a Trajectory (or an object with its fields {list(FIELD_NAMES)}), "
            f"got {type(traj).__name__}"
        )


def trajectory_tensors(traj: object) -> dict[str, Any]:
    """Every present tensor field of ``traj`` as a flat dict of raw ``[T(+E), B, ...]`` values."""
    _check_is_trajectory(traj)
    fields: dict[str, Any] = {}
    for name in TENSOR_FIELDS:
        value = getattr(traj, name, None)
        if value is not None:
            fields[name] = value
    nested: dict[str, Mapping[str, Any]] = {}
    for name in DICT_FIELDS:
        value = getattr(traj, name, None)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise InvalidTrajectoryError(
                f"field {name!r}: expected a dict of tensors, got {type(value).__name__}"
            )
        nested[name] = value
    try:
        fields.update(tree.flatten(nested))
    except ValueError as exc:
        raise InvalidTrajectoryError(str(exc)) from exc
    return fields


def trajectory_scalars(traj: object) -> tuple[int, str]:
    """``(max_episode_length, model_weights_id)`` of ``traj``, checked."""
    _check_is_trajectory(traj)
    length = getattr(traj, "max_episode_length", 0)
    weights_id = getattr(traj, "model_weights_id", "")
    if type(length) is int and type(weights_id) is str:  # the common case, checked at once
        return length, weights_id
    if isinstance(length, bool) or not isinstance(length, numbers.Integral):
        raise InvalidTrajectoryError(
            f"field 'max_episode_length': expected an int, got {type(length).__name__}"
        )
    if not isinstance(weights_id, str):
        raise InvalidTrajectoryError(
            f"field 'model_weights_id': expected a str, got {type(weights_id).__name__}"
        )
    return int(length), weights_id


def raw_time_rows(t: Rows, T: int, raw_rows: int) -> Rows:
    """Map flat time steps ``t`` to rows of a raw field holding ``raw_rows`` rows.

    A reset-row field with E epochs stores ``T + E`` rows; step ``t`` lives at raw row
    ``t + t // (T / E) + 1``.  Other fields map ``t`` to itself.  ``t``: an int64 tensor or
    numpy array (the result is of its kind).
    """
    epochs = raw_rows - T
    if epochs <= 0:
        return t
    return t + t // (T // epochs) + 1
