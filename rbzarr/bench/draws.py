"""The buffer's draws, replayed: which rows each ``sample`` call of a seeded buffer returns.

A buffer seeded with ``seed`` makes one :func:`rbzarr.buffer.sampler.draw` per ``sample`` over its
window's sample counts, so a generator seeded the same way replays every batch.  That is how
the baselines read *the same rows* as the buffer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.buffer.sampler import draw

__all__ = ["DrawSequence", "TrackedBuffer", "gather_rows", "same_rows"]

Draw = tuple[torch.Tensor, torch.Tensor]


class DrawSequence:
    """The ``k``-th draw of a buffer seeded ``seed`` sampling ``batch`` rows from a window
    with ``counts`` rows per trajectory.

    Parameters
    ----------
    counts
        Flat rows of each trajectory of the window, in window order.
    batch
        Rows per draw.
    seed
        The buffer's seed.
    """

    def __init__(self, counts: Sequence[int], batch: int, seed: int) -> None:
        self.counts = torch.tensor(list(counts), dtype=torch.int64)
        self.batch = batch
        self._generator = torch.Generator().manual_seed(seed)
        self._drawn: list[Draw] = []

    def at(self, k: int) -> Draw:
        """``(positions, rows)`` of the ``k``-th call (0-based).

        Parameters
        ----------
        k
            The call number; draws up to ``k`` are made once and remembered.

        Returns
        -------
        tuple of torch.Tensor
            ``[batch]`` window positions and ``[batch]`` flat rows within them.
        """
        while len(self._drawn) <= k:
            self._drawn.append(draw(self.batch, self.counts, self._generator))
        return self._drawn[k]


class TrackedBuffer:
    """A buffer's ``sample(batch)`` that counts its calls, to pair them with draws.

    Parameters
    ----------
    buffer
        The buffer sampled.
    batch
        Rows per ``sample`` call.
    """

    def __init__(self, buffer: TrajectoryReplayBuffer, batch: int) -> None:
        self.buffer = buffer
        self.batch = batch
        self.calls = 0

    def sample(self) -> dict[str, Any]:
        """One ``sample`` call of the buffer.

        Returns
        -------
        dict
            The buffer's batch of ``batch`` rows; ``calls`` counts it.
        """
        self.calls += 1
        return self.buffer.sample(self.batch)


def gather_rows(
    flats: Sequence[Mapping[str, torch.Tensor]], positions: torch.Tensor, rows: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of the flat trajectories ``flats[positions]``, in batch order.

    Parameters
    ----------
    flats
        The window's flat trajectories (``{key: [rows, ...]}``), all with the same keys.
    positions, rows
        A draw: ``[batch]`` window positions and flat rows.

    Returns
    -------
    dict of str to torch.Tensor
        ``{key: [batch, ...]}``, freshly allocated.
    """
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
    """Whether two flat batches hold the same keys and exactly equal values.

    Parameters
    ----------
    got, expected
        Flat batches, ``{key: tensor}``.

    Returns
    -------
    bool
        ``True`` when the key sets match and every tensor is ``torch.equal``.
    """
    return set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
