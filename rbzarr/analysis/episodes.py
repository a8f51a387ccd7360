"""Cutting ``[T, B]`` time steps into per-environment episodes, across trajectories.

Trajectories form runs (:func:`rbzarr.trajectory.steps.continues`); an episode still running
where its run ends is incomplete.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from rbzarr.trajectory.steps import DONES, REWARDS, episode_ends

__all__ = ["Episode", "EpisodeTracker", "episode_segments"]


@dataclass(frozen=True)
class Episode:
    """One episode of one environment: its time steps of the requested fields."""

    trajectory_id: int
    env: int
    start: int
    length: int
    done: bool
    fields: dict[str, torch.Tensor]
    trajectory_ids: tuple[int, ...] = ()

    @property
    def episode_return(self) -> float | None:
        """Sum of every reward element of the episode; ``None`` without rewards."""
        rewards = self.fields.get(REWARDS)
        return None if rewards is None else float(rewards.double().sum())


def episode_segments(dones: torch.Tensor) -> list[tuple[int, int, int, bool]]:
    """Cut ``[T, B, ...]`` step dones into ``(env, start, length, done)`` segments."""
    T, B = int(dones.shape[0]), int(dones.shape[1])
    ended = episode_ends(dones, T, B)
    segments = []
    for env in range(B):
        start = 0
        for end in torch.nonzero(ended[:, env]).flatten().tolist():
            segments.append((env, start, end + 1 - start, True))
            start = end + 1
        if start < T:
            segments.append((env, start, T - start, False))
    return segments


@dataclass
class _Open:
    """The part seen so far of an episode still running at the end of a trajectory."""

    trajectory_id: int
    start: int
    trajectory_ids: list[int]
    pieces: list[dict[str, torch.Tensor]] = field(default_factory=list)


class EpisodeTracker:
    """Cut a stream of trajectories into episodes, following them across a run."""

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}

    def feed(
        self, trajectory_id: int, steps: Mapping[str, torch.Tensor], run_continues: bool
    ) -> list[Episode]:
        """The episodes of one trajectory's ``[T, B, ...]`` time ``steps`` (with ``dones``)."""
        carried, self._open = self._open, {}
        episodes = []
        for env, start, length, done in episode_segments(steps[DONES]):
            piece = {key: value[start : start + length, env] for key, value in steps.items()}
            head = carried.pop(env, None) if start == 0 else None
            if head is None:
                head = _Open(trajectory_id, start, [])
            head.trajectory_ids.append(trajectory_id)
            head.pieces.append(piece)
            if done or not run_continues:
                episodes.append(_close(env, head, done))
            else:
                self._open[env] = head
        # A run that changed B between trajectories leaves columns with nothing to join.
        episodes.extend(_close(env, head, False) for env, head in carried.items())
        return episodes


def _close(env: int, head: _Open, done: bool) -> Episode:
    fields = {key: torch.cat([piece[key] for piece in head.pieces]) for key in head.pieces[0]}
    length = int(fields[DONES].shape[0])
    return Episode(
        head.trajectory_id, env, head.start, length, done, fields, tuple(head.trajectory_ids)
    )
