"""Sampling and write throughput against TorchRL, whole-file ``.pt`` loads and limits.

A thin wrapper around ``rbzarr bench --suites sampling`` (the package :mod:`rbzarr.bench`);
see ``benchmarks/README.md``.  Results go to a new temporary directory unless ``--out``
names one.  Run from the repository root::

    .venv/bin/python benchmarks/bench_sampling.py --out benchmarks/results   # the full run
    .venv/bin/python benchmarks/bench_sampling.py --quick                    # smoke run
    .venv/bin/python benchmarks/bench_sampling.py --help
"""

from __future__ import annotations

import sys

from rbzarr.cli.main import main

if __name__ == "__main__":
    main(["bench", "--suites", "sampling", *sys.argv[1:]], prog_name="bench_sampling.py")
