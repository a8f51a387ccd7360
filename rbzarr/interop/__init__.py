"""Datasets in and out: LeRobot v3.0, robomimic HDF5 and Minari, and seeding a demo buffer.

The public names are imported on first use, so the torch-free modules (the video writer
that ``rbzarr show`` uses) load without torch.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbzarr.interop.convert import (
        EXPORT_FORMATS,
        IMPORT_FORMATS,
        DatasetExport,
        export_dataset,
        import_dataset,
        seed_buffer,
    )

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "DatasetExport",
    "export_dataset",
    "import_dataset",
    "seed_buffer",
]


def __getattr__(name: str) -> object:
    """Import a public name on first use.

    Raises
    ------
    AttributeError
        For any other name, as a module without it would.
    """
    if name in __all__:
        return getattr(importlib.import_module("rbzarr.interop.convert"), name)
    raise AttributeError(f"module 'rbzarr.interop' has no attribute {name!r}")
