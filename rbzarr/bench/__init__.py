"""Sampling and write benchmarks behind ``rbzarr bench``, against baselines and limits.

Inside the package so an installed rbzarr can run them; ``benchmarks/`` holds thin scripts
and the committed results.  One module per job:

* :mod:`~rbzarr.bench.workloads`: the synthetic trajectories;
* :mod:`~rbzarr.bench.measure`: timing, byte counting, the run's context;
* :mod:`~rbzarr.bench.baselines`: physical limits and the other ways to sample;
* :mod:`~rbzarr.bench.accounting`: bytes on disk and bytes a batch needs;
* :mod:`~rbzarr.bench.sampling`: the hot and cold modes of one workload;
* :mod:`~rbzarr.bench.runner`: a whole run as one results document;
* :mod:`~rbzarr.bench.report`: targets, tables, chart.
"""

from rbzarr.bench.measure import CountingStore
from rbzarr.bench.report import failed_targets, table
from rbzarr.bench.runner import QUICK, run, save, settings_from
from rbzarr.bench.sampling import Settings
from rbzarr.bench.workloads import Workload, image_trajectory, state_trajectory, workloads

__all__ = [
    "QUICK",
    "CountingStore",
    "Settings",
    "Workload",
    "failed_targets",
    "image_trajectory",
    "run",
    "save",
    "settings_from",
    "state_trajectory",
    "table",
    "workloads",
]
