"""The ``rbzarr`` command: inspect, check, convert, merge, split and plot stores.

The group imports no command module until it is asked for that command (or for the list
of commands, by ``--help``), so ``rbzarr info`` imports only what ``info`` needs.

Adding a command (``rbzarr --help``, ``info``, ``ls`` and ``checkpoints`` must stay free of
torch: ``tests/test_cli_imports.py`` checks every registered command):

1. write it as a click command in a module of its own under ``rbzarr/cli/`` (or beside its
   kin: ``report.py`` reads and reports, ``convert.py`` writes stores and datasets);
2. at module level import only click, :mod:`rbzarr.cli.console` and
   :mod:`rbzarr.cli.options` (shared flags and helpers); import what the command calls
   inside its body;
3. register it in :data:`COMMANDS` below as ``"name": "rbzarr.cli.module:function"``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from rbzarr import __version__
from rbzarr.cli.console import OneLineErrors, parse_storage_options
from rbzarr.cli.options import count_option

__all__ = ["COMMANDS", "main"]

# Command name -> "module:attribute" of its click command, imported when first needed.
COMMANDS = {
    "info": "rbzarr.cli.report:info",
    "ls": "rbzarr.cli.report:list_command",
    "stats": "rbzarr.cli.report:stats",
    "verify": "rbzarr.cli.report:verify",
    "plot": "rbzarr.cli.report:plot",
    "show": "rbzarr.cli.pictures:show",
    "report": "rbzarr.cli.pictures:report",
    "export": "rbzarr.cli.convert:export",
    "import": "rbzarr.cli.convert:import_command",
    "merge": "rbzarr.cli.convert:merge",
    "split": "rbzarr.cli.convert:split",
    "demo": "rbzarr.cli.demo:demo",
    "codecs": "rbzarr.cli.codecs:codecs_command",
    "recode": "rbzarr.cli.codecs:recode_command",
    "checkpoints": "rbzarr.cli.checkpoints:checkpoints_command",
    "checkpoint": "rbzarr.cli.checkpoints:checkpoint_group",
    "gc": "rbzarr.cli.collect:gc_command",
}


class LazyCommands(OneLineErrors):
    """The group of :data:`COMMANDS`, each imported only when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The registered names, in order (listing imports nothing)."""
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, its module imported now; ``None`` when unknown."""
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_storage_options,
    help="fsspec option for every URL (repeatable; VALUE is parsed as JSON if it can be), "
    "e.g. --storage-option endpoint_url=http://localhost:9000 --storage-option anon=false.",
)
@click.option(
    "--local-cache",
    "local_cache",
    metavar="DIR",
    default=None,
    help="Keep whole shards of a remote (s3://) zarr store in DIR and read them from there; "
    "reused by later commands and shared with buffers using the same directory.",
)
@count_option("--local-cache-bytes", 1, "Bound of --local-cache in bytes (default 16 GiB).")
@click.option(
    "--follow-links",
    "follow_links",
    is_flag=True,
    help="Read a local store through symbolic links inside it (only a trusted store whose "
    "folders you linked on purpose); without it such a link is an error. verify --repair "
    "never deletes or writes through a link either way.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="Let third-party libraries log to stderr (e.g. the AV1 encoder of export "
    "--format lerobot); quiet by default.",
)
@click.version_option(version=__version__, prog_name="rbzarr")
def main(
    storage_options: dict[str, Any],
    local_cache: str | None,
    local_cache_bytes: int | None,
    follow_links: bool,
    verbose: bool,
) -> None:
    """Inspect and manage rbzarr / RLinf trajectory stores (local paths or fsspec URLs)."""
    if not verbose:
        # SVT-AV1 logs its settings at every encoder start; errors only (a value the user
        # set in the environment wins).
        os.environ.setdefault("SVT_LOG", "1")


if __name__ == "__main__":
    main()
