"""Uniform window sampling: which rows of which trajectories a batch holds.

Pure torch, no I/O.  The draw is RLinf's, bit for bit: one ``torch.randint`` over the
window's total sample count, then the bucket of each draw among the cumulative counts
(``torch.bucketize(..., right=True)``'s answer, found by numpy's single-threaded
``searchsorted``: torch's kernel wakes its intra-op threads even for a few hundred draws,
and on a busy host that wait cost milliseconds per sample).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rbzarr.sampling.arguments import check_seed
from rbzarr.sampling.priorities import global_index
from rbzarr.sampling.sampler import Window
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory import tree

__all__ = ["RowDraw", "WindowSampler", "draw"]


def draw(
    n: int,
    sample_counts: torch.Tensor,
    generator: torch.Generator,
    ends: np.ndarray | None = None,
    common: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` rows (clamped) uniformly: each one's trajectory position and row.

    ``ends`` (the cumulative counts) and ``common`` (the count of every trajectory, when
    all are equal; else 0) may be given when known.
    """
    if ends is None:  # numpy from here: a few torch calls cost more than the draw
        ends = np.cumsum(sample_counts.numpy().astype(np.int64, copy=False))
    total = int(ends[-1])
    ids = torch.randint(0, total, (min(n, total),), generator=generator).numpy()
    if common > 0:  # the same positions as the search below, with no search
        positions, rows = np.divmod(ids, common)
    else:
        positions = np.searchsorted(ends, ids, side="right")
        rows = ids - ends[positions] + sample_counts.numpy()[positions]
    return torch.from_numpy(positions), torch.from_numpy(rows)


@dataclass(frozen=True)
class RowDraw:
    """Single rows: the window position of each one's trajectory, its flat row and its
    importance weight (``None``: a uniform draw, every weight 1)."""

    positions: torch.Tensor
    rows: torch.Tensor
    weights: torch.Tensor | None = None

    def batch(self, flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The nested ``[n, ...]`` batch of the rows read."""
        return tree.unflatten(flat)

    def info(self, window_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each row's global index and importance weight (float32)."""
        weights = self.weights
        if weights is None:
            weights = torch.ones(len(self.rows), dtype=torch.float32)
        return {"index": global_index(window_ids[self.positions], self.rows), "weight": weights}


class WindowSampler:
    """Draws rows uniformly over a window; owns the seeded generator (RLinf's stream)."""

    def __init__(self, seed: int | None) -> None:
        seed = check_seed(seed)
        self.seed = seed
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def unknown(self, window: Window) -> list[Entry]:
        """Nothing: a uniform draw needs only the sample counts."""
        return []

    def learn(self, entry: Entry, dones: torch.Tensor) -> None:
        """Nothing to learn."""

    def draw(self, n: int, window: Window, generator: torch.Generator | None = None) -> RowDraw:
        """:func:`draw` over ``window`` with ``generator``, or this sampler's own."""
        stream = self.generator if generator is None else generator
        drawn = draw(n, window.sample_counts(), stream, window.ends, window.common_count)
        return RowDraw(*drawn)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: the seed and the generator's position (base64)."""
        state = self.generator.get_state().numpy().tobytes()
        return {"seed": self.seed, "generator_state": base64.b64encode(state).decode("ascii")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; without a generator state, reseed from the seed."""
        self.seed = state.get("seed")
        encoded = state.get("generator_state")
        if encoded:
            raw = base64.b64decode(encoded)
            self.generator.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        elif self.seed is not None:
            self.generator.manual_seed(self.seed)
        else:
            self.generator.seed()
