"""Embodied datasets in and out: LeRobot v3.0 and robomimic HDF5, and seeding a demo buffer."""

from rbzarr.interop.convert import (
    EXPORT_FORMATS,
    IMPORT_FORMATS,
    export_dataset,
    import_dataset,
    seed_buffer,
)

__all__ = ["EXPORT_FORMATS", "IMPORT_FORMATS", "export_dataset", "import_dataset", "seed_buffer"]
