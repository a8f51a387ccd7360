"""Cutting ``[T, B]`` time steps into per-environment episodes, across trajectories.

Trajectories form runs (:func:`rbzarr.trajectory.steps.continues`); an episode still running
where its run ends is incomplete.  Steps may be tensors (a view's episodes) or numpy arrays
(the read-only tools, without torch); an episode's fields are of the same kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.trajectory.steps import DONES, REWARDS, episode_ends

if TYPE_CHECKING:
    from rbzarr.trajectory.steps import Steps

__all__ = ["Episode", "EpisodeTracker", "episode_segments"]


@dataclass(frozen=True)
class Episode:
    """One episode of one environment: its time steps of the requested fields."""

    trajectory_id: int
    env: int
    start: int
    length: int
    done: bool
    fields: dict[str, Any]
    trajectory_ids: tuple[int, ...] = ()

    @property
    def episode_return(self) -> float | None:
        """Sum of every reward element of the episode; ``None`` without rewards."""
        rewards = self.fields.get(REWARDS)
        if rewards is None:
            return None
        if isinstance(rewards, np.ndarray):
            return float(rewards.sum(dtype=np.float64))
        return float(rewards.double().sum())


def episode_segments(dones: Steps) -> list[tuple[int, int, int, bool]]:
    """Cut ``[T, B, ...]`` step dones into ``(env, start, length, done)`` segments."""
    T, B = int(dones.shape[0]), int(dones.shape[1])
    ended = np.asarray(episode_ends(dones, T, B))
    segments = []
    for env in range(B):
        start = 0
        for end in np.flatnonzero(ended[:, env]).tolist():
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
    pieces: list[dict[str, Any]] = field(default_factory=list)


class EpisodeTracker:
    """Cut a stream of trajectories into episodes, following them across a run."""

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}

    def feed(
        self,
        trajectory_id: int,
        steps: Mapping[str, Any],
        run_continues: bool,
    ) -> list[Episode]:
        """The episodes of one trajectory's ``[T, B, ...]`` time ``steps`` (with ``dones``;
        tensors or arrays)."""
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
    fields = {key: _joined([piece[key] for piece in head.pieces]) for key in head.pieces[0]}
    length = int(fields[DONES].shape[0])
    return Episode(
        head.trajectory_id, env, head.start, length, done, fields, tuple(head.trajectory_ids)
    )


def _joined(pieces: list[Any]) -> Any:
    """The pieces of one field, joined along time (arrays, or tensors)."""
    if isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    import torch  # noqa: PLC0415 (the steps are tensors: torch is loaded)

    return torch.cat(pieces)
