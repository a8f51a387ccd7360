"""The sampler protocol: what the reader asks of a sampler, and the window it draws from.

A sampler turns a window into a :class:`Draw`: a window position and a flat row per drawn
row, and how the rows read for them form the batch.  It does no I/O; what it must know of
a trajectory's steps first (its ``dones``) it names with :meth:`Sampler.unknown` and is
told with :meth:`Sampler.learn`.  :class:`~rbzarr.sampling.window.WindowSampler` draws
single rows, :class:`~rbzarr.sampling.sequences.SequenceSampler` runs of steps.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from rbzarr.storage.rlinf.documents import Entry

__all__ = ["Draw", "Sampler", "Window"]


class _Counts(Protocol):
    @property
    def entries(self) -> Mapping[int, Entry]: ...

    def sample_counts(self, ids: Iterable[int]) -> torch.Tensor: ...


@dataclass(frozen=True)
class Window:
    """The trajectories a draw picks from (ids oldest first) and the index listing them.

    The owner may keep one window while the index does not change (its tensors are then
    computed once, not per draw).
    """

    ids: list[int]
    index: _Counts

    @functools.cached_property
    def entries(self) -> list[Entry]:
        """The index entry of each id."""
        return [self.index.entries[i] for i in self.ids]

    @functools.cached_property
    def counts(self) -> torch.Tensor:
        """``num_samples`` of each trajectory, int64 (computed once)."""
        return self.index.sample_counts(self.ids)

    @functools.cached_property
    def id_tensor(self) -> torch.Tensor:
        """The ids as an int64 tensor (computed once)."""
        return torch.tensor(self.ids, dtype=torch.int64)

    @functools.cached_property
    def ends(self) -> np.ndarray:
        """The cumulative :attr:`counts` (int64 numpy; computed once)."""
        return np.cumsum(self.counts.numpy().astype(np.int64, copy=False))

    @functools.cached_property
    def common_count(self) -> int:
        """The count every trajectory has, when they all have the same one; else 0."""
        counts = self.counts.numpy()
        return int(counts[0]) if len(counts) and bool((counts == counts[0]).all()) else 0

    def sample_counts(self) -> torch.Tensor:
        """``num_samples`` of each trajectory, int64."""
        return self.counts


class Draw(Protocol):
    """Drawn rows: the window position of each one's trajectory and its flat row."""

    @property
    def positions(self) -> torch.Tensor: ...

    @property
    def rows(self) -> torch.Tensor: ...

    def batch(self, flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The nested batch of the rows read (``{key: [len(rows), ...]}``, in draw order)."""

    def info(self, window_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per item drawn (row or sequence): ``"index"``, the global index of its (first)
        row, and ``"weight"``, its importance weight (float32; 1 for uniform draws)."""


class Sampler(Protocol):
    """Draws rows of a window from a seeded stream; pure torch, no I/O."""

    @property
    def generator(self) -> torch.Generator: ...

    def unknown(self, window: Window) -> list[Entry]:
        """The entries of ``window`` whose step ``dones`` the sampler must learn first."""

    def learn(self, entry: Entry, dones: torch.Tensor) -> None:
        """Learn a trajectory's step ``dones`` (``[T, B, ...]`` or ``[T*B, ...]``)."""

    def draw(self, n: int, window: Window, generator: torch.Generator | None = None) -> Draw:
        """Draw ``n`` from ``window`` with ``generator``, or the sampler's own stream."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: the stream's position."""
