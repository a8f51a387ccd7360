"""The ``Trajectory`` dataclass, its validation, and the flatten rule.

A trajectory holds ``[T, B, ...]`` tensors: T time steps of B parallel environments.
Sampling works on its *flat* view, ``[T*B, ...]`` row-major, where flat row ``i`` is time
step ``i // B`` of environment ``i % B``.

``dones``, ``terminations`` and ``truncations`` may hold ``T + E`` rows: E rollout epochs of
``T / E`` steps, each led by one reset row.  Flattening drops those reset rows; storage keeps
them (raw rows), and :func:`raw_time_rows` maps a flat time step to its raw row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rbzarr import tree
from rbzarr.dtypes import dtype_name
from rbzarr.errors import InvalidTrajectoryError

__all__ = [
    "DICT_FIELDS",
    "Residue",
    "RESET_ROW_FIELDS",
    "TENSOR_FIELDS",
    "Schema",
    "Trajectory",
    "TrajectorySpec",
    "flatten_trajectory",
    "join_trajectory",
    "split_trajectory",
    "raw_time_rows",
    "trajectory_from_raw",
    "validate",
]

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
RESET_ROW_FIELDS = frozenset({"dones", "terminations", "truncations"})

# path -> (torch dtype name, trailing shape after the sample dimension)
Schema = dict[str, tuple[str, tuple[int, ...]]]


@dataclass
class Trajectory:
    """A batch of rollouts shaped ``[T, B, ...]``; field names and order follow RLinf."""

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
        """
        fields: dict[str, Any] = {
            name: getattr(self, name) for name in TENSOR_FIELDS if getattr(self, name) is not None
        }
        fields.update(tree.flatten({name: getattr(self, name) for name in DICT_FIELDS}))
        return fields


@dataclass(frozen=True)
class TrajectorySpec:
    """What validation learnt about a trajectory."""

    T: int
    B: int
    shape: tuple[int, ...]
    schema: Schema

    @property
    def num_samples(self) -> int:
        """Rows in the flat view: ``T * B``."""
        return self.T * self.B


def _fail(message: str) -> InvalidTrajectoryError:
    return InvalidTrajectoryError(message)


def _reference(fields: Mapping[str, Any]) -> tuple[str, torch.Tensor]:
    for name in ("prev_logprobs", "rewards"):
        value = fields.get(name)
        if value is not None:
            return name, value
    raise _fail("trajectory carries no samples: it has neither 'prev_logprobs' nor 'rewards'")


def _epochs(path: str, rows: int, T: int) -> int:
    """Number of reset rows in a field with ``rows`` raw rows (0 unless a reset-row field)."""
    if path not in RESET_ROW_FIELDS or rows == T:
        return 0
    extra = rows - T
    if extra < 0 or T % extra != 0:
        raise _fail(
            f"field {path!r}: expected T={T} rows, or T+E rows with E dividing T, got {rows}"
        )
    return extra


def validate(traj: Trajectory, schema: Schema | None = None) -> TrajectorySpec:
    """Check that every field agrees on T and B (and with ``schema``, if given).

    Returns the :class:`TrajectorySpec`; raises :class:`InvalidTrajectoryError` (a
    ``ValueError``) naming the field and the shapes otherwise.
    """
    if not isinstance(traj, Trajectory):
        raise _fail(f"expected a Trajectory, got {type(traj).__name__}")
    try:
        fields = traj.tensors()
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    for path, value in fields.items():
        if not isinstance(value, torch.Tensor):
            raise _fail(f"field {path!r}: expected a torch.Tensor, got {type(value).__name__}")
    ref_name, ref = _reference(fields)
    if ref.dim() < 2:
        raise _fail(f"field {ref_name!r}: expected [T, B, ...], got shape {tuple(ref.shape)}")
    T, B = int(ref.shape[0]), int(ref.shape[1])
    if T * B == 0:
        raise _fail(f"field {ref_name!r}: trajectory carries no samples, shape {tuple(ref.shape)}")
    found: Schema = {}
    for path, value in fields.items():
        if value.dim() < 2:
            continue
        rows = int(value.shape[0])
        epochs = _epochs(path, rows, T)
        if rows - epochs != T or value.shape[1] != B:
            raise _fail(
                f"field {path!r}: expected T={T}, B={B} from {ref_name!r}, got {tuple(value.shape)}"
            )
        found[path] = (dtype_name(value.dtype), tuple(int(d) for d in value.shape[2:]))
    if schema is not None and found != schema:
        raise _fail(_schema_difference(schema, found))
    return TrajectorySpec(T=T, B=B, shape=tuple(int(d) for d in ref.shape), schema=found)


def _schema_difference(expected: Schema, got: Schema) -> str:
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        return f"fields differ from the buffer's schema: missing {missing}, unexpected {extra}"
    for path, want in expected.items():
        if got[path] != want:
            return (
                f"field {path!r}: expected dtype {want[0]} and trailing shape {want[1]}, "
                f"got dtype {got[path][0]} and trailing shape {got[path][1]}"
            )
    raise AssertionError("schemas differ only in key order")  # pragma: no cover


def raw_time_rows(t: torch.Tensor, T: int, raw_rows: int) -> torch.Tensor:
    """Map flat time steps ``t`` to rows of a raw field holding ``raw_rows`` rows.

    A reset-row field with E epochs stores ``T + E`` rows; step ``t`` of the flat view lives
    at raw row ``t + t // (T / E) + 1``.  Other fields map ``t`` to itself.
    """
    epochs = raw_rows - T
    if epochs <= 0:
        return t
    return t + torch.div(t, T // epochs, rounding_mode="floor") + 1


@dataclass(frozen=True)
class Residue:
    """What the flat view leaves out of a trajectory, so it can be rebuilt exactly."""

    reset_rows: dict[str, torch.Tensor]
    unsampled: dict[str, torch.Tensor]
    max_episode_length: int = 0
    model_weights_id: str = ""


def split_trajectory(
    traj: Trajectory, spec: TrajectorySpec
) -> tuple[dict[str, torch.Tensor], Residue]:
    """Split ``traj`` into its flat view (``[T*B, ...]``, reset rows dropped) and the rest.

    Both parts may share memory with ``traj``; callers that keep them must copy.
    """
    flat: dict[str, torch.Tensor] = {}
    residue = Residue({}, {}, traj.max_episode_length, traj.model_weights_id)
    for path, raw in traj.tensors().items():
        if path not in spec.schema:
            residue.unsampled[path] = raw
            continue
        rows = int(raw.shape[0])
        steps = raw
        if rows != spec.T:
            epochs = rows - spec.T
            blocks = raw.reshape(epochs, rows // epochs, *raw.shape[1:])
            residue.reset_rows[path] = blocks[:, 0]
            steps = blocks[:, 1:]
        flat[path] = steps.reshape(spec.T * spec.B, *spec.schema[path][1])
    return flat, residue


def flatten_trajectory(traj: Trajectory, spec: TrajectorySpec) -> dict[str, torch.Tensor]:
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


def trajectory_from_raw(
    fields: Mapping[str, torch.Tensor], max_episode_length: int = 0, model_weights_id: str = ""
) -> Trajectory:
    """Rebuild a :class:`Trajectory` from the flat dict returned by :meth:`Trajectory.tensors`."""
    nested = tree.unflatten(fields)
    known = {f.name for f in dataclasses.fields(Trajectory)}
    unknown = [
        k for k in nested if k not in known or k in ("max_episode_length", "model_weights_id")
    ]
    if unknown:
        raise _fail(f"unknown trajectory fields {unknown}")
    return Trajectory(
        max_episode_length=max_episode_length, model_weights_id=model_weights_id, **nested
    )
