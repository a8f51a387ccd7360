"""Datasets in and out: LeRobot v3.0, robomimic HDF5 and Minari, and seeding a demo buffer."""

from rbzarr.interop import convert
from rbzarr.interop.convert import *  # noqa: F403  (the package's names are convert's)

__all__ = convert.__all__
