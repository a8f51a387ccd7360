"""Exact demo mixing: how many rows (or sequences) of each batch come from the demo buffer.

Batch ``k`` (counted from the start of training, across DataLoader workers and epochs)
takes ``round(c0 + (c1 - c0) * min(k, K) / K)`` demo rows, where ``c0 = round(f *
batch_size)``, ``c1 = round(f_end * batch_size)`` and ``K = anneal_batches``: the count
moves linearly from ``c0`` to ``c1`` over ``K`` batches, then stays at ``c1``.  Without
annealing it is ``c0`` for every batch.  The rest of each batch comes from the replay
buffer, so every batch has exactly ``batch_size`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rbzarr.data.rate_limit import SampleRateLimiter
from rbzarr.data.sources import takes_generator

__all__ = ["SAMPLE_INFO", "BatchCounts", "DemoSchedule", "MixedBatches", "draw_of"]


@dataclass(frozen=True)
class DemoSchedule:
    """The demo count of every batch: fixed, or annealed linearly over ``anneal_batches``."""

    batch_size: int
    demo_fraction: float = 0.0
    demo_fraction_end: float | None = None
    anneal_batches: int = 0

    def __post_init__(self) -> None:
        for name, value in (
            ("demo_fraction", self.demo_fraction),
            ("demo_fraction_end", self.demo_fraction_end),
        ):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.anneal_batches < 0:
            raise ValueError(f"anneal_batches must be >= 0, got {self.anneal_batches}")
        if self.demo_fraction_end is not None and self.anneal_batches == 0:
            raise ValueError("demo_fraction_end needs anneal_batches > 0 (batches to anneal over)")

    @property
    def uses_demos(self) -> bool:
        """Whether any batch takes demo rows."""
        return self.demo_fraction > 0 or bool(self.demo_fraction_end)

    def demo_rows(self, batch_index: int) -> int:
        """Demo rows of batch ``batch_index`` (0-based, from the start of training)."""
        start = round(self.demo_fraction * self.batch_size)
        if self.demo_fraction_end is None:
            return start
        end = round(self.demo_fraction_end * self.batch_size)
        progress = min(batch_index, self.anneal_batches) / self.anneal_batches
        return round(start + (end - start) * progress)


@dataclass
class BatchCounts:
    """What one iterator drew: batches, replay and demo items (rows or sequences), waits."""

    batches: int = 0
    replay_items: int = 0
    demo_items: int = 0
    last_demo_items: int = 0
    sampled_rows: int = 0  # replay rows (steps) counted by the rate limiter
    inserted_rows: int = 0  # the source's rows at the limiter's last check
    rate_limited_s: float = 0.0


Draw = Callable[[int], dict[str, Any]]
# The key of a prioritized batch's info: {"index": int64 [n], "weight": float32 [n]}.
SAMPLE_INFO = "sample_info"


def draw_of(source: Any, generator: torch.Generator, sequence_length: int | None) -> Draw:
    """``n -> batch`` for ``source``: rows, or ``sequence_length``-step sequences.

    A prioritized source's batches carry :data:`SAMPLE_INFO`: ``{"index", "weight"}`` of
    each row (sequence start), for ``update_priority`` on the buffer that owns them.

    Raises
    ------
    ValueError
        A sequence length for a source without ``sample_sequences``.
    """
    with_info = getattr(source, "prioritized", None) is not None
    if sequence_length is None:
        if with_info:
            return lambda n: _with_info(source.sample(n, generator=generator, return_info=True))
        if takes_generator(source):
            return lambda n: source.sample(n, generator=generator)
        return source.sample
    if not callable(getattr(source, "sample_sequences", None)):
        raise ValueError(
            f"sequence_length={sequence_length} needs sources with sample_sequences(); "
            f"{type(source).__name__} has none"
        )
    if with_info:
        return lambda n: _with_info(
            source.sample_sequences(n, sequence_length, generator=generator, return_info=True)
        )
    return lambda n: source.sample_sequences(n, sequence_length, generator=generator)


def _with_info(drawn: tuple[dict[str, Any], dict[str, torch.Tensor]]) -> dict[str, Any]:
    """A batch with its info under :data:`SAMPLE_INFO`."""
    batch, info = drawn
    return {**batch, SAMPLE_INFO: info}


class MixedBatches:
    """One iterator's batches: the schedule's demo count, the rest replay, rate-limited."""

    def __init__(
        self,
        replay: Draw,
        demo: Draw | None,
        schedule: DemoSchedule,
        *,
        first_index: int = 0,
        stride: int = 1,
        rows_per_item: int = 1,
        limiter: SampleRateLimiter | None = None,
    ) -> None:
        self._replay, self._demo, self.schedule = replay, demo, schedule
        self.next_index, self._stride = first_index, stride
        self._rows_per_item = rows_per_item  # steps per sequence: what the limiter counts
        self.limiter = limiter
        self.counts = BatchCounts()

    def parts(self) -> list[dict[str, Any]]:
        """The next batch's parts: replay rows first, then demo rows (either may be absent)."""
        demo_items = self.schedule.demo_rows(self.next_index) if self._demo is not None else 0
        replay_items = self.schedule.batch_size - demo_items
        parts = []
        if replay_items:
            if self.limiter is not None:
                self.limiter.wait()
            parts.append(self._replay(replay_items))
            if self.limiter is not None:
                self.limiter.record(replay_items * self._rows_per_item)
        if demo_items:
            assert self._demo is not None
            parts.append(self._demo(demo_items))
        self.next_index += self._stride
        counts = self.counts
        counts.batches += 1
        counts.replay_items += replay_items
        counts.demo_items += demo_items
        counts.last_demo_items = demo_items
        if self.limiter is not None:
            counts.sampled_rows = self.limiter.sampled
            counts.inserted_rows = self.limiter.inserted
            counts.rate_limited_s = self.limiter.waited_s
        return parts
