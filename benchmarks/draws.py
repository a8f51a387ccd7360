"""The buffer's draws, replayed, so that the baselines read the same rows as the buffer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.sampling.window import draw

__all__ = ["DrawSequence", "TrackedBuffer", "gather_rows", "same_rows"]

Draw = tuple[torch.Tensor, torch.Tensor]


class DrawSequence:
    """The ``k``-th draw of a buffer seeded ``seed`` sampling ``batch`` rows from a window with
    ``counts`` rows per trajectory.
    """

    def __init__(self, counts: Sequence[int], batch: int, seed: int) -> None:
        self.counts = torch.tensor(list(counts), dtype=torch.int64)
        self.batch = batch
        self._generator = torch.Generator().manual_seed(seed)
        self._drawn: list[Draw] = []

    def at(self, k: int) -> Draw:
        """``(positions, rows)`` of the ``k``-th call (0-based)."""
        while len(self._drawn) <= k:
            self._drawn.append(draw(self.batch, self.counts, self._generator))
        return self._drawn[k]


class TrackedBuffer:
    """A buffer's ``sample(batch)`` that counts its calls, to pair them with draws."""

    def __init__(self, buffer: TrajectoryReplayBuffer, batch: int) -> None:
        self.buffer = buffer
        self.batch = batch
        self.calls = 0

    def sample(self) -> dict[str, Any]:
        """One ``sample`` call of the buffer."""
        self.calls += 1
        return self.buffer.sample(self.batch)


def gather_rows(
    flats: Sequence[Mapping[str, torch.Tensor]], positions: torch.Tensor, rows: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of the flat trajectories ``flats[positions]``, in batch order."""
    out = {
        key: torch.empty((len(rows), *value.shape[1:]), dtype=value.dtype)
        for key, value in flats[0].items()
    }
    for position in torch.unique(positions).tolist():
        where = (positions == position).nonzero().squeeze(1)
        for key, tensor in out.items():
            tensor[where] = flats[position][key].index_select(0, rows[where])
    return out


def same_rows(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> bool:
    """Whether two flat batches hold the same keys and exactly equal values."""
    return set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
