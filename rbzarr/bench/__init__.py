"""Sampling and write benchmarks behind ``rbzarr bench``, against baselines and limits.

Inside the package so an installed rbzarr can run them; ``benchmarks/`` holds thin scripts
and the committed results.  One module per job:

* :mod:`~rbzarr.bench.workloads`: the synthetic trajectories and how each is sampled;
* :mod:`~rbzarr.bench.settings`: how much work a run does;
* :mod:`~rbzarr.bench.measure`: timing, byte sizes, the run's context;
* :mod:`~rbzarr.bench.draws`: the buffer's draws replayed, so peers read the same rows;
* :mod:`~rbzarr.bench.baselines`: physical limits and other ways to sample;
* :mod:`~rbzarr.bench.torchrl_peer`: TorchRL's storages holding the same rows;
* :mod:`~rbzarr.bench.page_cache`: truly cold reads;
* :mod:`~rbzarr.bench.accounting`: the chunks and bytes rows need;
* :mod:`~rbzarr.bench.store_size`: bytes on disk;
* :mod:`~rbzarr.bench.hot`, :mod:`~rbzarr.bench.disk`, :mod:`~rbzarr.bench.s3`: the modes;
* :mod:`~rbzarr.bench.runner`: suites as results documents;
* :mod:`~rbzarr.bench.targets`, :mod:`~rbzarr.bench.report`: targets, tables, chart.
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
