"""Sampling, write, S3 and training benchmarks (``python -m benchmarks``) against baselines.

Not installed with rbzarr: they run from the root of a source checkout.
"""

from benchmarks.report import failed_targets, table
from benchmarks.runner import SUITES, parse_names, run, save
from benchmarks.settings import QUICK, Settings, settings_from
from benchmarks.workloads import (
    WORKLOAD_NAMES,
    Workload,
    embodied_trajectory,
    image_trajectory,
    state_trajectory,
    workloads,
)

__all__ = [
    "QUICK",
    "SUITES",
    "WORKLOAD_NAMES",
    "Settings",
    "Workload",
    "embodied_trajectory",
    "failed_targets",
    "image_trajectory",
    "parse_names",
    "run",
    "save",
    "settings_from",
    "state_trajectory",
    "table",
    "workloads",
]
