"""The trajectory model: `[T, B, ...]` tensors, their validation, flat view and dtypes.

Everything else in rbzarr takes and returns these objects.
"""

from rbzarr.trajectory.model import Trajectory

__all__ = ["Trajectory"]
