"""Streaming statistics of a store (``rbzarr stats``): per-key moments, episode returns, lengths."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.analysis.cluster import TrajectoryTasks
from rbzarr.analysis.codec_trial import image_keys as schema_image_keys
from rbzarr.analysis.store_arrays import StoreArrays
from rbzarr.storage.io.location import Location
from rbzarr.trajectory.steps import DONES, REWARDS

if TYPE_CHECKING:
    import torch

    from rbzarr.analysis.view import BufferView

__all__ = ["IMAGE_SAMPLE", "BatchMoments", "RunningStats", "compute_stats"]

# Trajectories whose frames summarise an image-like key (unless every frame is asked for).
IMAGE_SAMPLE = 4
# uint8 elements per np.bincount call: its int64 copy stays in the cache (6x faster than one
# call over a trajectory's frames).
_COUNTED = 1 << 16


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
    def of(cls, values: torch.Tensor | np.ndarray) -> BatchMoments:
        """The moments of every element of ``values`` (in float64; uint8 frames through
        their 256-level histogram, exact and without a float copy).  An array holds
        numbers (:func:`~rbzarr.trajectory.dtypes.numbers`: never ``bfloat16``'s bits)."""
        array = values if isinstance(values, np.ndarray) else _numbers(values)
        if array.dtype == np.uint8:
            flat = array.reshape(-1)
            counts = np.zeros(256, dtype=np.int64)
            for start in range(0, flat.size, _COUNTED):
                counts += np.bincount(flat[start : start + _COUNTED], minlength=256)
            return cls._of_levels(counts)
        x = array.reshape(-1).astype(np.float64)
        nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
        if nan or inf:
            x = x[np.isfinite(x)]
        n = int(x.size)
        if n == 0:
            return cls(0, nan, inf)
        mean = float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        return cls(n, nan, inf, mean, m2, float(x.min()), float(x.max()))

    @classmethod
    def _of_levels(cls, counts: np.ndarray) -> BatchMoments:
        """The moments of values ``0..len(counts)-1`` seen ``counts[v]`` times each."""
        n = int(counts.sum())
        if n == 0:
            return cls(0, 0, 0)
        levels = np.arange(len(counts), dtype=np.float64)
        weights = counts.astype(np.float64)
        mean = float((weights * levels).sum()) / n
        m2 = float((weights * (levels - mean) ** 2).sum())
        seen = np.flatnonzero(counts)
        return cls(n, 0, 0, mean, m2, float(seen[0]), float(seen[-1]))


def _numbers(values: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy numbers: uint8 as it is, anything else as float64."""
    import torch  # noqa: PLC0415 (a tensor: torch is loaded)

    values = values.detach().cpu()
    return values.numpy() if values.dtype == torch.uint8 else values.double().numpy()


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

    def update(self, values: torch.Tensor | np.ndarray) -> None:
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
    view: BufferView | StoreArrays | str | os.PathLike[str],
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
    decoding every frame costs far more than reading the store.  Values are read into
    numpy: given a URL, a zarr store's statistics import no torch.
    """
    if isinstance(view, str | os.PathLike | Location):
        view = StoreArrays(view, storage_options)
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
        frames = view.layout.read_arrays(view.entry(trajectory_id), sampled)
        for key in sampled:
            per_key[key].update(frames[key])
    for _, moments, episodes in stream:
        for key in streamed:
            per_key[key].merge(moments[key])
        for episode in episodes:
            if not episode.done:
                incomplete += 1
                continue
            lengths.update(np.array([episode.length]))
            episode_return = episode.episode_return
            if episode_return is not None:
                returns.update(np.array([episode_return]))
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


def _moments(keys: Sequence[str], steps: Mapping[str, np.ndarray]) -> dict[str, BatchMoments]:
    """The moments of each of ``keys`` in one trajectory's time steps (run where it is read)."""
    return {key: BatchMoments.of(steps[key]) for key in keys}


def _image_keys(view: BufferView | StoreArrays, keys: Sequence[str]) -> list[str]:
    """The image-like keys among ``keys`` (uint8 frames), from the store's schema."""
    images = set(schema_image_keys(view.schema()))
    return [key for key in keys if key in images]


def _spread(ids: Sequence[int], count: int) -> list[int]:
    """At most ``count`` of ``ids``, evenly spread from the first to the last."""
    if len(ids) <= count:
        return list(ids)
    return [ids[round(k * (len(ids) - 1) / (count - 1))] for k in range(count)]
