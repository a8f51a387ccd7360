"""The trajectory model: ``[T, B, ...]`` tensors, their validation, flat view and dtypes."""

from rbzarr.trajectory.model import Trajectory

__all__ = ["Trajectory"]
