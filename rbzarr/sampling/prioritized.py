"""Prioritized row sampling: a :class:`~rbzarr.sampling.sampler.Sampler` drawing rows of a
window in proportion to their priorities (:class:`~rbzarr.sampling.priorities.WindowPriorities`).

It keeps :class:`~rbzarr.sampling.window.WindowSampler`'s seeded stream and state (so
checkpoints carry it as they carry the uniform one); a draw is one ``torch.rand`` of ``n``
float64 masses from that stream and a descent of the sum tree.  Pure numpy/torch, no I/O.
"""

from __future__ import annotations

import torch

from rbzarr.sampling.priorities import WindowPriorities
from rbzarr.sampling.sampler import Window
from rbzarr.sampling.window import RowDraw, WindowSampler

__all__ = ["PrioritizedSampler"]


class PrioritizedSampler(WindowSampler):
    """Draws rows of a window with probability ``(p + eps) ** alpha / sum``, with weights.

    Parameters
    ----------
    seed
        Seed of the stream (as :class:`~rbzarr.sampling.window.WindowSampler`'s).
    priorities
        The window's priorities (shared with the owner, which updates them).
    """

    def __init__(self, seed: int | None, priorities: WindowPriorities) -> None:
        super().__init__(seed)
        self.priorities = priorities

    def draw(self, n: int, window: Window, generator: torch.Generator | None = None) -> RowDraw:
        """``n`` rows of ``window`` by priority (with replacement, never clamped), with their
        importance weights."""
        self.priorities.sync(window.ids, window.sample_counts())
        stream = self.generator if generator is None else generator
        return RowDraw(*self.priorities.draw(n, stream))
