"""Sampling and write benchmarks behind ``rbzarr bench``, against baselines and limits.

Inside the package so an installed rbzarr can run them; ``benchmarks/`` holds thin scripts.
"""

from rbzarr.bench.report import failed_targets, table
from rbzarr.bench.runner import SUITES, parse_names, run, save
from rbzarr.bench.settings import QUICK, Settings, settings_from
from rbzarr.bench.workloads import (
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
