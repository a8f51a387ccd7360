"""LeRobot 0.6's feature statistics: per episode, then over the dataset.

What LeRobot computes (the method, written here from its documented behaviour):

* **Numeric features**, per episode: ``min``, ``max``, ``mean``, ``std`` (from the mean of
  squares) and ``count`` (the episode's frames) per element of the last axis, in the
  feature's dtype promoted to at least float32.  The quantiles ``q01 q10 q50 q90 q99`` come
  from a histogram of 5,000 equal bins spanning ``[min - 1e-10, max + 1e-10]`` per element:
  the first bin whose cumulative count reaches ``q * count``, interpolated linearly within
  it.  An episode of one frame gets its mean as every quantile.
* **Image and video features**, per episode: up to ``max(100, min(n**0.75, 10000))`` frames
  evenly spaced (``round(linspace(0, n - 1, k))``), every ``w // 150``-th pixel each way
  when a side is 300 or more; statistics per channel over every sampled pixel, divided by
  255, shaped ``[3, 1, 1]``; ``count`` is the number of sampled frames.  The float32 sums
  run over the pixels laid out as LeRobot lays them out, so they round alike.
* **The dataset**: ``min`` / ``max`` of the episodes', the count-weighted mean, the pooled
  variance (each episode's variance plus its squared distance to the mean, weighted), and
  the count-weighted mean of each quantile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["QUANTILES", "aggregate_stats", "episode_stats", "image_episode_stats"]

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
_BINS = 5000
_PAD = 1e-10
_IMAGE_SAMPLES = (100, 10_000, 0.75)
_DOWNSAMPLE_FROM, _DOWNSAMPLE_TO = 300, 150

Stats = dict[str, np.ndarray]


def _quantile(counts: np.ndarray, edges: np.ndarray, wanted: float) -> Any:
    """The value below which ``wanted`` samples of a histogram lie, interpolated in its bin."""
    cumulative = np.cumsum(counts)
    position = int(np.searchsorted(cumulative, wanted))
    if position == 0:
        return edges[0]
    if position >= len(cumulative):
        return edges[-1]
    before = cumulative[position - 1]
    inside = cumulative[position] - before
    if inside == 0:
        return edges[position]
    return edges[position] + (wanted - before) / inside * (edges[position + 1] - edges[position])


def _vector_stats(values: np.ndarray) -> Stats:
    """Statistics of ``[n, d]`` samples per column, ``n >= 2`` (see the module docs)."""
    values = values.astype(np.result_type(values.dtype, np.float32), copy=False)
    low, high = values.min(axis=0), values.max(axis=0)
    mean = values.mean(axis=0)
    variance = (values**2).mean(axis=0) - mean**2
    out: Stats = {"min": low, "max": high, "mean": mean, "std": np.sqrt(np.maximum(0, variance))}
    columns = []
    for column in range(values.shape[1]):
        edges = np.linspace(low[column] - _PAD, high[column] + _PAD, _BINS + 1)
        counts, _ = np.histogram(values[:, column], bins=edges)
        columns.append((counts, edges))
    for name, q in QUANTILES.items():
        out[name] = np.array([_quantile(c, e, q * len(values)) for c, e in columns])
    return out


def _few_stats(values: np.ndarray) -> Stats:
    """Statistics of fewer than two samples: the quantiles are the mean."""
    out: Stats = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
    }
    for name in QUANTILES:
        out[name] = out["mean"].copy()
    return out


def episode_stats(rows: np.ndarray) -> Stats:
    """One episode's statistics of a numeric feature's ``[T, ...]`` rows.

    Shapes: ``[1]`` for ``[T]`` rows, ``[d]`` for ``[T, ..., d]`` rows.
    """
    rows = np.ascontiguousarray(rows)
    values = rows.reshape(-1, 1) if rows.ndim == 1 else rows.reshape(-1, rows.shape[-1])
    stats = _vector_stats(values) if len(values) >= 2 else _few_stats(values)
    if rows.ndim == 1:
        stats = {name: value.reshape(1) for name, value in stats.items()}
    stats["count"] = np.array([len(rows)])
    return stats


def _sampled_frames(count: int) -> np.ndarray:
    """The frames of an episode its image statistics read."""
    smallest, largest, power = _IMAGE_SAMPLES
    smallest = min(smallest, count)
    wanted = max(smallest, min(int(count**power), largest))
    return np.round(np.linspace(0, count - 1, wanted)).astype(int)


def image_episode_stats(frames: np.ndarray) -> Stats:
    """One episode's statistics of ``[T, H, W, C]`` uint8 frames, per channel, in ``[0, 1]``."""
    sampled = frames[_sampled_frames(len(frames))]
    height, width = sampled.shape[1:3]
    if max(height, width) >= _DOWNSAMPLE_FROM:
        step = int(width / _DOWNSAMPLE_TO) if width > height else int(height / _DOWNSAMPLE_TO)
        sampled = sampled[:, ::step, ::step]
    # Pixels by channel as LeRobot lays them out (from channel-first frames), so float32
    # sums run in the same order: row-major for several frames, column-major for one.
    channel_first = np.ascontiguousarray(sampled.transpose(0, 3, 1, 2))
    values = channel_first.transpose(0, 2, 3, 1).reshape(-1, sampled.shape[-1])
    stats = _vector_stats(values) if len(values) >= 2 else _few_stats(values)
    out = {name: (value / 255.0).reshape(-1, 1, 1) for name, value in stats.items()}
    out["count"] = np.array([len(sampled)])
    return out


def aggregate_stats(episodes: Sequence[Mapping[str, np.ndarray]]) -> Stats:
    """One feature's statistics over a dataset, from its episodes' (see the module docs)."""
    counts = np.stack([np.asarray(e["count"]) for e in episodes])
    means = np.stack([e["mean"] for e in episodes])
    total = counts.sum(axis=0)
    weights = counts.reshape(counts.shape[0], *([1] * (means.ndim - 1)))
    mean = (means * weights).sum(axis=0) / total
    variances = np.stack([e["std"] ** 2 for e in episodes])
    variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0) / total
    out: Stats = {
        "min": np.stack([e["min"] for e in episodes]).min(axis=0),
        "max": np.stack([e["max"] for e in episodes]).max(axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for name in QUANTILES:
        out[name] = (np.stack([e[name] for e in episodes]) * weights).sum(axis=0) / total
    return out
