"""Streaming statistics of a store (``rbzarr stats``): per-key moments, episode returns, lengths."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from rbzarr.analysis.cluster import TrajectoryTasks
from rbzarr.analysis.view import BufferView, open_buffer
from rbzarr.trajectory.finite import non_finite_counts
from rbzarr.trajectory.steps import DONES, REWARDS

__all__ = ["BatchMoments", "RunningStats", "compute_stats"]


@dataclass(frozen=True)
class BatchMoments:
    """Count, mean, sum of squared deviations, min and max of one batch's finite values,
    and its NaN and ±inf counts: what :meth:`RunningStats.merge` needs of the batch."""

    count: int
    nan: int
    inf: int
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @classmethod
    def of(cls, values: torch.Tensor) -> BatchMoments:
        """The moments of every element of ``values`` (in float64)."""
        x = values.detach().reshape(-1).to(torch.float64)
        nan, inf = non_finite_counts(x)
        if nan or inf:
            x = x[torch.isfinite(x)]
        n = int(x.numel())
        if n == 0:
            return cls(0, nan, inf)
        mean = float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        return cls(n, nan, inf, mean, m2, float(x.min()), float(x.max()))


class RunningStats:
    """Count, mean, population std, min and max of a stream of tensors (float64).

    Batches merge with Chan et al.'s parallel update, so the result does not depend on how
    the values are split.  NaN and ±inf are counted (``nan``, ``inf``) and left out of the
    moments, which describe the ``count`` finite values.
    """

    def __init__(self) -> None:
        self.count = 0
        self.nan = 0
        self.inf = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def update(self, values: torch.Tensor) -> None:
        """Add every element of ``values``."""
        self.merge(BatchMoments.of(values))

    def merge(self, batch: BatchMoments) -> None:
        """Add a batch summarised by :meth:`BatchMoments.of` (where it was read)."""
        self.nan += batch.nan
        self.inf += batch.inf
        n = batch.count
        if n == 0:
            return
        total = self.count + n
        delta = batch.mean - self.mean
        self._m2 += batch.m2 + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.min = min(self.min, batch.min)
        self.max = max(self.max, batch.max)

    @property
    def std(self) -> float:
        """Population standard deviation (``ddof=0``)."""
        return math.sqrt(self._m2 / self.count) if self.count else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The statistics as a JSON-ready dict."""
        if not self.count:
            return {
                "count": 0,
                "nan": self.nan,
                "inf": self.inf,
                "mean": None,
                "std": None,
                "min": None,
                "max": None,
            }
        return {
            "count": self.count,
            "nan": self.nan,
            "inf": self.inf,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }


def compute_stats(
    view: BufferView | str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    progress: bool = False,
    across_trajectories: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    tasks: TrajectoryTasks | None = None,
) -> dict[str, Any]:
    """Per-key statistics and episode returns / lengths, streaming trajectory by trajectory.

    ``tasks`` runs each trajectory's read and moments (on a dask cluster with a client);
    the moments are merged in index order, so the numbers do not depend on where they ran.
    """
    if not isinstance(view, BufferView):
        view = open_buffer(view, storage_options)
    available = view.keys()
    wanted = available if keys is None else list(keys)
    unknown = [key for key in wanted if key not in available]
    if unknown:
        raise ValueError(f"{view.url}: unknown keys {unknown}; the store has {available}")
    per_key = {key: RunningStats() for key in wanted}
    lengths, returns = RunningStats(), RunningStats()
    incomplete = 0
    read = [*wanted, *(key for key in (REWARDS, DONES) if key in available and key not in wanted)]
    stream = (tasks or TrajectoryTasks()).steps_and_episodes(
        view,
        read,
        partial(_moments, wanted),
        progress=progress,
        across_trajectories=across_trajectories,
        episode_keys=[key for key in (REWARDS, DONES) if key in available],
        with_episodes=DONES in available,
    )
    for _, moments, episodes in stream:
        for key in wanted:
            per_key[key].merge(moments[key])
        for episode in episodes:
            if not episode.done:
                incomplete += 1
                continue
            lengths.update(torch.tensor([episode.length]))
            episode_return = episode.episode_return
            if episode_return is not None:
                returns.update(torch.tensor([episode_return]))
    episodes_report = None
    if DONES in available:
        episodes_report = {
            "complete": lengths.count,
            "incomplete": incomplete,
            "length": lengths.to_dict(),
            "return": returns.to_dict() if REWARDS in available else None,
        }
    return {
        "trajectories": len(view),
        "total_samples": view.total_samples,
        "keys": {key: stats.to_dict() for key, stats in per_key.items()},
        "episodes": episodes_report,
    }


def _moments(keys: Sequence[str], steps: Mapping[str, torch.Tensor]) -> dict[str, BatchMoments]:
    """The moments of each of ``keys`` in one trajectory's time steps (run where it is read)."""
    return {key: BatchMoments.of(steps[key]) for key in keys}
