"""TorchRL as a peer: the buffer window's flat rows in a TorchRL storage, read by the same ids."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rbzarr.trajectory import tree

__all__ = ["TorchRLPeer", "torchrl_missing"]


def torchrl_missing() -> str | None:
    """``None`` when torchrl and tensordict import, else the reason they do not."""
    try:
        import tensordict  # noqa: F401, PLC0415
        import torchrl  # noqa: F401, PLC0415
    except ImportError as exc:
        return f"torchrl is not installed ({exc}); install the bench extra: rbzarr[bench]"
    return None


class TorchRLPeer:
    """A TorchRL replay buffer holding the given flat rows: in a ``LazyMemmapStorage`` under
    ``scratch_dir``, else a ``LazyTensorStorage`` (or the storage ``kind`` names:
    ``"CompressedListStorage"``, each row's every tensor compressed in RAM: zstd, or zlib
    before Python 3.14).

    ``CompressedListStorage`` compresses the tensors at the top of each row and keeps nested
    tensordicts as they are, so its rows get flat keys (``"curr_obs/main_images"``): nested,
    the frames would be kept uncompressed, views of the caller's tensors.
    """

    def __init__(
        self,
        flats: Sequence[Mapping[str, torch.Tensor]],
        scratch_dir: str | None,
        kind: str | None = None,
    ):
        from tensordict import TensorDict  # noqa: PLC0415  (optional dependency)
        from torchrl.data import (  # noqa: PLC0415
            CompressedListStorage,
            LazyMemmapStorage,
            LazyTensorStorage,
            ReplayBuffer,
        )
        from torchrl.data.replay_buffers.samplers import RandomSampler  # noqa: PLC0415

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        counts = [len(next(iter(flat.values()))) for flat in flats]
        total = sum(counts)
        self.kind = kind or ("LazyTensorStorage" if scratch_dir is None else "LazyMemmapStorage")
        self.storage: Any
        if self.kind == "CompressedListStorage":
            self.storage = CompressedListStorage(total)
        elif scratch_dir is None:
            self.storage = LazyTensorStorage(total)
        else:
            self.storage = LazyMemmapStorage(total, scratch_dir=scratch_dir)
        self.buffer: Any = ReplayBuffer(storage=self.storage, sampler=RandomSampler())
        nested = self.kind != "CompressedListStorage"
        for flat, count in zip(flats, counts, strict=True):
            rows = tree.unflatten(dict(flat)) if nested else dict(flat)
            self.buffer.extend(TensorDict(rows, batch_size=[count]))
        self.offsets = torch.tensor([0, *counts[:-1]], dtype=torch.int64).cumsum(0)

    def indices(self, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Storage indices of flat rows ``rows`` of the window's trajectories ``positions``."""
        return self.offsets[positions] + rows

    def get(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The storage's rows at ``indices`` as a flat ``{key: tensor}`` dict (a list storage's
        rows stacked, as its ``ReplayBuffer.sample`` does)."""
        found = self.storage.get(indices)
        if isinstance(found, list):
            found = torch.stack(found)
        return {key: torch.as_tensor(value) for key, value in found.flatten_keys("/").items()}

    def sample(self, batch: int) -> dict[str, torch.Tensor]:
        """TorchRL's own path: ``ReplayBuffer.sample`` of ``batch`` random rows, as a flat
        ``{key: tensor}`` dict of the rows' values (a list storage's sample is a lazy stack
        whose rows are decompressed when read: reading them is part of the sample)."""
        found = self.buffer.sample(batch)
        return {key: torch.as_tensor(value) for key, value in found.flatten_keys("/").items()}
