"""A batch's stored rows grouped by trajectory, as flat arrays (no per-trajectory tensors).

A 4,096-row batch over a window of 100 trajectories has ~95 groups; splitting it into a pair
of tensors per group and joining them again in the layout cost more than the gathers.  A
:class:`RowGroups` keeps the rows and their batch positions as one array each, sorted by
trajectory, with the bounds of each trajectory's run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rbzarr.storage.rlinf.documents import Entry

if TYPE_CHECKING:
    import torch

__all__ = ["DrawnRows", "RowGroups"]


@dataclass(frozen=True)
class DrawnRows:
    """A batch's rows as a sampler drew them, by window position: row ``i`` is flat row
    ``rows[i]`` of trajectory ``window[slots[i]]`` (``slots`` and ``rows`` int64 numpy
    arrays; ``window`` in window order, the same list object while the window stays)."""

    window: Sequence[Entry]
    slots: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True)
class RowGroups:
    """Rows ``rows[bounds[g]:bounds[g + 1]]`` of trajectory ``entries[g]``, to be put at batch
    positions ``positions[bounds[g]:bounds[g + 1]]`` (all three int64 numpy arrays).

    With ``others_scratch`` the batch's other rows are scratch: a read may write them (its
    caller fills them afterwards), so a key can be gathered straight into the batch in its
    order, with no gathered copy to scatter.  With ``window`` (the entries a sampler drew
    from, in window order; the same list object while the window stays the same) ``slots``
    holds each group's position in it, so a layout may keep per-window tables.
    """

    entries: Sequence[Entry]
    rows: np.ndarray
    positions: np.ndarray
    bounds: np.ndarray
    others_scratch: bool = False
    window: Sequence[Entry] | None = None
    slots: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        requests: Sequence[
            tuple[Entry, torch.Tensor | np.ndarray | Sequence[int], torch.Tensor | np.ndarray]
        ],
    ) -> RowGroups:
        """The groups of ``(entry, rows, positions)`` requests, one per request (tensors or
        arrays)."""
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for _, r, _ in requests]
        positions = [np.asarray(p, dtype=np.int64).reshape(-1) for _, _, p in requests]
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        bounds = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        empty = np.empty(0, dtype=np.int64)
        return cls(
            [entry for entry, _, _ in requests],
            np.concatenate(rows) if rows else empty,
            np.concatenate(positions) if positions else empty,
            bounds,
        )

    def __len__(self) -> int:
        return len(self.entries)

    def which(self) -> np.ndarray:
        """The group of every row."""
        return np.repeat(np.arange(len(self.entries)), np.diff(self.bounds))

    def group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and batch positions of group ``g`` (views)."""
        lo, hi = int(self.bounds[g]), int(self.bounds[g + 1])
        return self.rows[lo:hi], self.positions[lo:hi]

    def requests(self) -> list[tuple[Entry, torch.Tensor, torch.Tensor]]:
        """One ``(entry, rows, positions)`` request per group (tensors sharing the arrays)."""
        import torch  # noqa: PLC0415 (only layouts that read tensors ask)

        rows, positions = torch.from_numpy(self.rows), torch.from_numpy(self.positions)
        sizes = np.diff(self.bounds).tolist()
        return list(zip(self.entries, rows.split(sizes), positions.split(sizes), strict=True))
