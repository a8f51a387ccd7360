"""Offline work on a store: the read-only view, episodes, stats, plots, verify, export.

The public names are imported on first use, so the torch-free modules (the listing behind
``rbzarr info`` and ``ls``) load without torch.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbzarr.analysis.export import export_store
    from rbzarr.analysis.view import BufferView, open_buffer

__all__ = ["BufferView", "export_store", "open_buffer"]

_LAZY = {
    "BufferView": "rbzarr.analysis.view",
    "export_store": "rbzarr.analysis.export",
    "open_buffer": "rbzarr.analysis.view",
}


def __getattr__(name: str) -> object:
    """Import a public name on first use.

    Raises
    ------
    AttributeError
        For any other name, as a module without it would.
    """
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rbzarr.analysis' has no attribute {name!r}")
