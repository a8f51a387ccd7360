"""The `rbzarr` command line: one click group, one command per offline job.

Commands are thin: they parse options and call the analysis, export and bench modules.
"""

from rbzarr.cli.main import main

__all__ = ["main"]
