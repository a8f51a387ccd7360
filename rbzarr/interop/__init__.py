"""Datasets in and out: LeRobot v3.0, robomimic HDF5 and Minari, and seeding a demo buffer."""

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
