"""Feeding a trainer: ``ReplayDataset``, loaders, prefetch and RLinf's dataset classes."""

from rbzarr.data.datasets import ReplayDataset, ReplayLoader

__all__ = ["ReplayDataset", "ReplayLoader"]
