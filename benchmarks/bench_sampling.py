"""Sampling and write throughput against baselines and physical limits.

A thin wrapper around :func:`rbzarr.bench.main` (also ``rbzarr bench``); see
``benchmarks/README.md``.  Run from the repository root::

    .venv/bin/python benchmarks/bench_sampling.py            # default, ~3 min on 2 cores
    .venv/bin/python benchmarks/bench_sampling.py --quick    # smoke run, < 20 s
    .venv/bin/python benchmarks/bench_sampling.py --help     # flags that scale it up
"""

from __future__ import annotations

import sys

from rbzarr.bench import main

if __name__ == "__main__":
    sys.exit(main())
