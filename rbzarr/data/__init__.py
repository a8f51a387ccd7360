"""Feeding a trainer: `ReplayDataset`, loaders, prefetch and RLinf's dataset classes.

All of them sample a buffer, or a read-only view of a store, in worker processes.
"""

from rbzarr.data.datasets import ReplayDataset, ReplayLoader

__all__ = ["ReplayDataset", "ReplayLoader"]
