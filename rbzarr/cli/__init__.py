"""The ``rbzarr`` command line: one click group, one command per offline job."""

from rbzarr.cli.main import main

__all__ = ["main"]
