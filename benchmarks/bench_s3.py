"""Sampling from S3 (moto behind the test proxy, 20 ms per request): requests, bytes, rows/s.

A thin wrapper around ``rbzarr bench --suites s3`` (the package :mod:`rbzarr.bench.s3`);
see ``benchmarks/README.md``.  Needs the test extra (moto) and a source checkout (the proxy
lives in ``tests/s3_server.py``).  Results go to a new temporary directory unless ``--out``
names one.  Run from the repository root::

    .venv/bin/python benchmarks/bench_s3.py --out benchmarks/results   # the full run
    .venv/bin/python benchmarks/bench_s3.py --quick                    # smoke run
"""

from __future__ import annotations

import sys

from rbzarr.cli.main import main

if __name__ == "__main__":
    main(["bench", "--suites", "s3", *sys.argv[1:]], prog_name="bench_s3.py")
