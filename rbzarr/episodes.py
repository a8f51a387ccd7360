"""Episodes: cutting ``[T, B]`` time steps into per-environment episodes.

For environment ``b``, an episode ends at a time step whose ``dones`` value is true (any
non-zero element of the step's trailing dims); the next step starts a new one.  The reset
rows that lead each rollout epoch in ``dones`` are not time steps and never end an episode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from rbzarr.trajectory import raw_time_rows

__all__ = [
    "DONES",
    "REWARDS",
    "Episode",
    "complete_episodes",
    "episode_segments",
    "time_steps",
]

REWARDS = "rewards"
DONES = "dones"


@dataclass(frozen=True)
class Episode:
    """One episode of one environment: its time steps of the requested fields.

    ``start`` is the trajectory time step it begins at (reset rows not counted), ``done``
    whether a done ended it (false when the trajectory ended first).  ``fields`` maps flat
    keys to ``[length, ...]`` tensors; per-step fields without an environment dimension
    are left out.
    """

    trajectory_id: int
    env: int
    start: int
    length: int
    done: bool
    fields: dict[str, torch.Tensor]

    @property
    def episode_return(self) -> float | None:
        """Sum of every reward element of the episode; ``None`` without rewards."""
        rewards = self.fields.get(REWARDS)
        return None if rewards is None else float(rewards.double().sum())


def time_steps(raw: torch.Tensor, T: int) -> torch.Tensor:
    """The ``T`` time steps of a raw field: the reset rows of ``dones``-like fields dropped."""
    if raw.dim() == 0 or raw.shape[0] == T:
        return raw
    return raw.index_select(0, raw_time_rows(torch.arange(T), T, int(raw.shape[0])))


def episode_segments(dones: torch.Tensor) -> list[tuple[int, int, int, bool]]:
    """Cut ``[T, B, ...]`` step dones into ``(env, start, length, done)`` segments.

    Environment by environment, each segment ends at a true done (``done=True``) or at the
    end of the trajectory (``done=False``).
    """
    T, B = int(dones.shape[0]), int(dones.shape[1])
    ended = (dones.reshape(T, B, -1) != 0).any(dim=-1)
    segments = []
    for env in range(B):
        start = 0
        for end in torch.nonzero(ended[:, env]).flatten().tolist():
            segments.append((env, start, end + 1 - start, True))
            start = end + 1
        if start < T:
            segments.append((env, start, T - start, False))
    return segments


def complete_episodes(steps: Mapping[str, torch.Tensor]) -> Iterator[tuple[int, float | None]]:
    """``(length, return)`` of every complete episode of one trajectory's time steps."""
    rewards = steps.get(REWARDS)
    if rewards is not None:
        rewards = rewards.reshape(rewards.shape[0], rewards.shape[1], -1).double().sum(-1)
    for env, start, length, done in episode_segments(steps[DONES]):
        if done:
            total = None if rewards is None else float(rewards[start : start + length, env].sum())
            yield length, total
