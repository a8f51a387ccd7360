"""Episodes: cutting ``[T, B]`` time steps into per-environment episodes.

For environment ``b``, an episode ends at a time step whose ``dones`` value is true (any
non-zero element of the step's trailing dims); the next step starts a new one.  The reset
rows that lead each rollout epoch in ``dones`` are not time steps and never end an episode.

**Across trajectories.**  A collector keeps stepping the same environments from one
trajectory into the next, so column ``b`` of trajectory ``k + 1`` continues column ``b`` of
trajectory ``k``.  :class:`EpisodeTracker` follows an episode still running at the end of a
trajectory into the next one when the two form one *run*: consecutive ids (``k`` then
``k + 1`` in the index) with the same ``B`` (:func:`continues`).  An episode still running
at the end of a run is *incomplete* (``Episode.done`` is false).  With
``across_trajectories=False`` every trajectory is a run of its own (episodes are cut at
trajectory boundaries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rbzarr.trajectory.model import raw_time_rows

__all__ = [
    "DONES",
    "REWARDS",
    "Episode",
    "EpisodeTracker",
    "continues",
    "episode_segments",
    "time_steps",
]

REWARDS = "rewards"
DONES = "dones"


@dataclass(frozen=True)
class Episode:
    """One episode of one environment: its time steps of the requested fields.

    ``trajectory_id`` is the trajectory it begins in and ``start`` the time step there
    (reset rows not counted); ``trajectory_ids`` lists every trajectory it spans, in order.
    Per-step fields without an environment dimension are left out of ``fields``.

    Parameters
    ----------
    trajectory_id
        The trajectory the episode begins in.
    env
        The environment (column ``b`` of ``[T, B]``).
    start
        The time step it begins at in ``trajectory_id`` (reset rows not counted).
    length
        Its number of time steps, over every trajectory it spans.
    done
        Whether a done ended it (false when its run ended first).
    fields
        The episode's time steps: flat key to ``[length, ...]`` tensor.
    trajectory_ids
        Every trajectory it spans, in order.
    """

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


def time_steps(raw: torch.Tensor, T: int) -> torch.Tensor:
    """The ``T`` time steps of a raw field: the reset rows of ``dones``-like fields dropped.

    Parameters
    ----------
    raw
        A field as stored: ``[T, ...]``, or ``[T + E, ...]`` with ``E`` reset rows.
    T
        The trajectory's number of time steps.

    Returns
    -------
    torch.Tensor
        ``[T, ...]``; ``raw`` itself when it has no reset rows (or is 0-d).
    """
    if raw.dim() == 0 or raw.shape[0] == T:
        return raw
    return raw.index_select(0, raw_time_rows(torch.arange(T), T, int(raw.shape[0])))


def episode_segments(dones: torch.Tensor) -> list[tuple[int, int, int, bool]]:
    """Cut ``[T, B, ...]`` step dones into ``(env, start, length, done)`` segments.

    Environment by environment, each segment ends at a true done (``done=True``) or at the
    end of the trajectory (``done=False``).

    Parameters
    ----------
    dones
        ``[T, B, ...]`` time-step dones (reset rows already dropped); a step ends an
        episode when any of its trailing elements is non-zero.

    Returns
    -------
    list of tuple of (int, int, int, bool)
        ``(env, start, length, done)`` per segment, by environment then start.
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


def continues(entry: Mapping[str, Any], following: Mapping[str, Any]) -> bool:
    """Whether the trajectory of index entry ``following`` continues that of ``entry``.

    Parameters
    ----------
    entry
        An index entry (``"trajectory_id"``, ``"shape"`` ``[T, B]``).
    following
        The entry after it in index order.

    Returns
    -------
    bool
        True for consecutive ids with the same number of environments ``B``.
    """
    return int(following["trajectory_id"]) == int(entry["trajectory_id"]) + 1 and int(
        following["shape"][1]
    ) == int(entry["shape"][1])


@dataclass
class _Open:
    """The part seen so far of an episode still running at the end of a trajectory."""

    trajectory_id: int
    start: int
    trajectory_ids: list[int]
    pieces: list[dict[str, torch.Tensor]] = field(default_factory=list)


class EpisodeTracker:
    """Cut a stream of trajectories into episodes, following them across a run.

    Feed the trajectories in index order; :meth:`feed` returns the episodes that end in
    (or, at the end of a run, are cut by) each one, environment by environment.
    """

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}

    def feed(
        self, trajectory_id: int, steps: Mapping[str, torch.Tensor], run_continues: bool
    ) -> list[Episode]:
        """The episodes of one trajectory's ``[T, B, ...]`` time ``steps`` (with ``dones``).

        ``run_continues`` says whether the next trajectory fed continues this one (see
        :func:`continues`); when false, episodes still running are returned incomplete.

        Parameters
        ----------
        trajectory_id
            The trajectory's id.
        steps
            Its ``[T, B, ...]`` time steps by flat key; must hold ``dones``.
        run_continues
            Whether the next trajectory fed continues this one.

        Returns
        -------
        list of Episode
            The episodes that end here (joined with their start in earlier trajectories of
            the run), plus the cut ones when the run ends or ``B`` changed.
        """
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
