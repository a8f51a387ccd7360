"""Uniform window sampling: which rows of which trajectories a batch holds.

Pure torch, no I/O.  The draw is RLinf's, bit for bit: one ``torch.randint`` over the
window's total sample count, then the bucket of each draw among the cumulative counts
(``torch.bucketize(..., right=True)``'s answer, found by numpy's single-threaded
``searchsorted``: torch's kernel wakes its intra-op threads even for a few hundred draws,
and on a busy host that wait cost milliseconds per sample).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

from rbzarr.buffer.arguments import check_seed

__all__ = ["WindowSampler", "draw"]


def draw(
    num_chunks: int, sample_counts: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``num_chunks`` rows (clamped) uniformly: each one's trajectory position and row."""
    ends = torch.cumsum(sample_counts, dim=0)
    total = int(ends[-1])
    ids = torch.randint(0, total, (min(num_chunks, total),), generator=generator)
    positions = torch.from_numpy(np.searchsorted(ends.numpy(), ids.numpy(), side="right"))
    rows = ids - (ends - sample_counts)[positions]
    return positions, rows


class WindowSampler:
    """Owns the seeded generator that every draw without its own generator uses."""

    def __init__(self, seed: int | None) -> None:
        seed = check_seed(seed)
        self.seed = seed
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def draw(
        self,
        num_chunks: int,
        sample_counts: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`draw` with ``generator``, or this sampler's own when it is ``None``."""
        return draw(num_chunks, sample_counts, self.generator if generator is None else generator)

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
