"""Offline work on a store: the read-only view, episodes, stats, plots, verify, export."""

from rbzarr.analysis.export import export_store
from rbzarr.analysis.view import BufferView, open_buffer

__all__ = ["BufferView", "export_store", "open_buffer"]
