"""The trajectory model: ``[T, B, ...]`` tensors, their validation, flat view and dtypes.

:class:`Trajectory` is imported on first use, so the torch-free modules (the dtype names,
the step rules the read-only tools use) load without torch.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbzarr.trajectory.model import Trajectory

__all__ = ["Trajectory"]


def __getattr__(name: str) -> object:
    """:class:`Trajectory` on first use (``AttributeError`` for any other name)."""
    if name != "Trajectory":
        raise AttributeError(f"module 'rbzarr.trajectory' has no attribute {name!r}")
    return importlib.import_module("rbzarr.trajectory.model").Trajectory
