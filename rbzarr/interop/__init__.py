"""Datasets in and out: LeRobot v3.0, robomimic HDF5 and Minari, and seeding a demo buffer.

The package's names are :mod:`rbzarr.interop.convert`'s, imported on first use, so the
torch-free modules (the video writer that ``rbzarr show`` uses) load without torch.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rbzarr.interop.convert import *  # noqa: F403
    from rbzarr.interop.convert import __all__ as __all__


def __getattr__(name: str) -> Any:
    """One of convert's public names (or ``__all__``), imported on first use.

    Raises
    ------
    AttributeError
        For any other name, as a module without it would.
    """
    convert = importlib.import_module("rbzarr.interop.convert")
    if name == "__all__" or name in convert.__all__:
        return getattr(convert, name)
    raise AttributeError(f"module 'rbzarr.interop' has no attribute {name!r}")
