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
from rbzarr.storage.zarr.codecs import image_layout
from rbzarr.trajectory.finite import non_finite_counts
from rbzarr.trajectory.steps import DONES, REWARDS

__all__ = ["IMAGE_SAMPLE", "BatchMoments", "RunningStats", "compute_stats"]

# Trajectories whose frames summarise an image-like key (unless every frame is asked for).
IMAGE_SAMPLE = 4


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
        """The moments of every element of ``values`` (in float64; uint8 frames through
        their 256-level histogram, exact and without a float copy)."""
        if values.dtype == torch.uint8:
            return cls._of_levels(torch.bincount(values.detach().reshape(-1), minlength=256))
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

    @classmethod
    def _of_levels(cls, counts: torch.Tensor) -> BatchMoments:
        """The moments of values ``0..len(counts)-1`` seen ``counts[v]`` times each."""
        n = int(counts.sum())
        if n == 0:
            return cls(0, 0, 0)
        levels = torch.arange(len(counts), dtype=torch.float64)
        weights = counts.to(torch.float64)
        mean = float((weights * levels).sum()) / n
        m2 = float((weights * (levels - mean) ** 2).sum())
        seen = torch.nonzero(counts).reshape(-1)
        return cls(n, 0, 0, mean, m2, float(seen[0]), float(seen[-1]))


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
    decode_images: bool = False,
) -> dict[str, Any]:
    """Per-key statistics and episode returns / lengths, streaming trajectory by trajectory.

    ``tasks`` runs each trajectory's read and moments (on a dask cluster with a client);
    the moments are merged in index order, so the numbers do not depend on where they ran.
    Image-like keys (uint8 frames, see :func:`~rbzarr.storage.zarr.codecs.image_layout`)
    are summarised from :data:`IMAGE_SAMPLE` trajectories spread over the store (their
    entry says ``"sample": {"trajectories": k, "of": n}``) unless ``decode_images``:
    decoding every frame costs far more than reading the store.
    """
    if not isinstance(view, BufferView):
        view = open_buffer(view, storage_options)
    available = view.keys()
    wanted = available if keys is None else list(keys)
    unknown = [key for key in wanted if key not in available]
    if unknown:
        raise ValueError(f"{view.url}: unknown keys {unknown}; the store has {available}")
    sampled = [] if decode_images else _image_keys(view, wanted)
    streamed = [key for key in wanted if key not in sampled]
    per_key = {key: RunningStats() for key in wanted}
    lengths, returns = RunningStats(), RunningStats()
    incomplete = 0
    read = [
        *streamed,
        *(key for key in (REWARDS, DONES) if key in available and key not in streamed),
    ]
    stream = (tasks or TrajectoryTasks()).steps_and_episodes(
        view,
        read,
        partial(_moments, streamed),
        progress=progress,
        across_trajectories=across_trajectories,
        episode_keys=[key for key in (REWARDS, DONES) if key in available],
        with_episodes=DONES in available,
    )
    sample_ids = _spread(view.ids, IMAGE_SAMPLE) if sampled else []
    for trajectory_id in sample_ids:
        frames = view.trajectory(trajectory_id, sampled).tensors()
        for key in sampled:
            per_key[key].update(frames[key])
    for _, moments, episodes in stream:
        for key in streamed:
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
        "keys": {
            key: {
                **stats.to_dict(),
                **(
                    {"sample": {"trajectories": len(sample_ids), "of": len(view)}}
                    if key in sampled
                    else {}
                ),
            }
            for key, stats in per_key.items()
        },
        "episodes": episodes_report,
    }


def _moments(keys: Sequence[str], steps: Mapping[str, torch.Tensor]) -> dict[str, BatchMoments]:
    """The moments of each of ``keys`` in one trajectory's time steps (run where it is read)."""
    return {key: BatchMoments.of(steps[key]) for key in keys}


def _image_keys(view: BufferView, keys: Sequence[str]) -> list[str]:
    """The image-like keys among ``keys`` (uint8 frames), from the store's schema."""
    schema = view.schema()
    return [
        key
        for key in keys
        if key in schema
        and schema[key][0] == "uint8"  # numpy does not name every dtype (bfloat16)
        and image_layout((1, 1, *schema[key][1]), "uint8") is not None
    ]


def _spread(ids: Sequence[int], count: int) -> list[int]:
    """At most ``count`` of ``ids``, evenly spread from the first to the last."""
    if len(ids) <= count:
        return list(ids)
    return [ids[round(k * (len(ids) - 1) / (count - 1))] for k in range(count)]
