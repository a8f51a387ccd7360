"""Sampling and write throughput against baselines and physical limits.

A thin wrapper around ``rbzarr bench`` (the package's :mod:`rbzarr.bench`); see
``benchmarks/README.md``.  Results go to a new temporary directory unless ``--out`` names
one.  Run from the repository root::

    .venv/bin/python benchmarks/bench_sampling.py --out benchmarks/results   # full, ~3 min
    .venv/bin/python benchmarks/bench_sampling.py --quick                    # smoke run
    .venv/bin/python benchmarks/bench_sampling.py --help
"""

from __future__ import annotations

import sys

from rbzarr.cli import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]], prog_name="bench_sampling.py")
