"""What a collected trajectory carries beyond its steps, and splitting it along ``B``."""

from __future__ import annotations

import uuid

import torch

from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.model import Trajectory, raw_time_rows, trajectory_from_raw, validate

__all__ = ["max_episode_length", "model_weights_id", "split_envs"]


def model_weights_id(versions: torch.Tensor | None) -> str:
    """The id of the weights that produced a trajectory, derived from its ``versions``.

    ``uuid5(NAMESPACE_DNS, hex(bytes of versions))``; without versions, the bytes of
    ``torch.zeros(1)`` (float32), so every version-less trajectory shares one id.
    """
    source = torch.zeros(1) if versions is None else versions
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, to_numpy(source).tobytes().hex()))


def max_episode_length(step_dones: torch.Tensor) -> int:
    """The longest episode in ``step_dones`` (``[T, B, ...]``, reset rows already removed).

    Per environment, an episode starts at ``t = 0`` or right after a done step and ends at its
    next done step, inclusive, or at ``T`` (counted with the steps observed so far).
    """
    steps, envs = int(step_dones.shape[0]), int(step_dones.shape[1])
    ended = step_dones.reshape(steps, envs, -1).bool().any(dim=2).cpu()
    running = torch.zeros(envs, dtype=torch.int64)
    longest = torch.zeros(envs, dtype=torch.int64)
    for t in range(steps):
        running += 1
        longest = torch.maximum(longest, running)
        running = torch.where(ended[t], 0, running)
    return int(longest.max()) if envs else 0


def split_envs(trajectory: Trajectory, num_parts: int) -> list[Trajectory]:
    """Split ``trajectory`` along ``B`` (dim 1 of every tensor) into ``num_parts`` parts.

    Part sizes differ by at most one environment; the first ``B % num_parts`` parts get the
    extra one. Reset rows of ``dones``/``terminations``/``truncations`` are kept. Each part
    keeps the parent's ``model_weights_id`` (the same weights produced it) and recomputes
    ``max_episode_length`` over its own environments (the parent's value without
    ``[T, B, ...]`` ``dones``).
    Parts may share memory with ``trajectory``.

    Parameters
    ----------
    trajectory
        A valid trajectory with ``B`` environments.
    num_parts
        How many parts to make, between 1 and ``B``.

    Returns
    -------
    list of Trajectory
        ``num_parts`` trajectories, in environment order.

    Raises
    ------
    ValueError
        If ``num_parts`` is not in ``[1, B]``.
    InvalidTrajectoryError
        If ``trajectory`` does not validate.
    """
    spec = validate(trajectory)
    if not 0 < num_parts <= spec.B:
        raise ValueError(f"num_parts must be in [1, B={spec.B}], got {num_parts}")
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(num_parts)]
    for path, value in trajectory.tensors().items():
        pieces = (
            torch.tensor_split(value, num_parts, dim=1)
            if value.dim() >= 2
            else (value,) * num_parts
        )
        for part, piece in zip(parts, pieces, strict=True):
            part[path] = piece.contiguous()
    result = []
    for fields in parts:
        dones = fields.get("dones")
        longest = (
            _longest(dones, spec.T)
            if dones is not None and dones.dim() >= 2
            else trajectory.max_episode_length
        )
        result.append(trajectory_from_raw(fields, longest, trajectory.model_weights_id))
    return result


def _longest(raw_dones: torch.Tensor, steps: int) -> int:
    rows = raw_time_rows(torch.arange(steps), steps, int(raw_dones.shape[0]))
    return max_episode_length(raw_dones.index_select(0, rows.to(raw_dones.device)))
