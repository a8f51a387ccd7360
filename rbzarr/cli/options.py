"""What several commands share: the group's options as arguments, common flags, tasks, output.

Imports only click at module level (every command module imports this one): what a helper
needs beyond that it imports in its body.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import click

__all__ = [
    "cache_arguments",
    "count_option",
    "json_flag",
    "output_option",
    "per_trajectory_flag",
    "print_json",
    "print_report",
    "scheduler_option",
    "store_source",
    "storage_options",
    "tasks",
]


def storage_options(ctx: click.Context) -> dict[str, Any]:
    """The group's ``--storage-option`` values, as fsspec options."""
    return dict(ctx.find_root().params.get("storage_options") or {})


def store_source(ctx: click.Context, url: str) -> Any:
    """``url``, or with ``--follow-links`` a location that follows links inside the store."""
    if not ctx.find_root().params.get("follow_links"):
        return url
    from rbzarr.storage.io.location import Location  # noqa: PLC0415 (keep --help fast)

    return Location.from_url(url, storage_options(ctx), follow_links=True)


def cache_arguments(ctx: click.Context) -> dict[str, Any]:
    """``open_buffer``'s local cache arguments from the group's ``--local-cache`` options."""
    params = ctx.find_root().params
    if params.get("local_cache") is None:
        return {}
    return {
        "local_cache_dir": params["local_cache"],
        "local_cache_bytes": params.get("local_cache_bytes"),
    }


def print_json(document: Any) -> None:
    """``document`` as indented JSON on stdout."""
    click.echo(json.dumps(document, indent=2))


def print_report(
    report: Any,
    as_json: bool,
    lines: Callable[[Any], list[str]],
    document: Callable[[], Any] | None = None,
) -> None:
    """``report`` on stdout: with ``as_json`` as JSON (``document()``'s when given, else the
    report itself), else the text ``lines`` makes of it."""
    if as_json:
        print_json(report if document is None else document())
    else:
        click.echo("\n".join(lines(report)))


def output_option(help: str) -> Any:
    """The required ``-o`` / ``--output`` file option, described by ``help``."""
    return click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help=help)


def count_option(name: str, minimum: int, help: str, required: bool = False) -> Any:
    """An option taking a whole number ``N >= minimum`` (``None`` when not given)."""
    return click.option(
        name, type=click.IntRange(min=minimum), required=required, metavar="N", help=help
    )


json_flag = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")

scheduler_option = click.option(
    "--scheduler",
    metavar="ADDRESS",
    default=None,
    help="Run the per-trajectory work as tasks on this dask.distributed scheduler "
    "(e.g. tcp://10.0.0.5:8786; needs rbzarr[dask]); its workers must reach the store's "
    "URL. Same results as without it.",
)

per_trajectory_flag = click.option(
    "--per-trajectory",
    is_flag=True,
    help="Cut episodes at trajectory boundaries instead of following them into the next "
    "trajectory of their run (consecutive ids, same number of envs).",
)


@contextlib.contextmanager
def tasks(scheduler: str | None) -> Iterator[Any]:
    """A ``TrajectoryTasks`` on the ``--scheduler`` client (closed afterwards), or in process."""
    from rbzarr.analysis.cluster import TrajectoryTasks, connect  # noqa: PLC0415

    if scheduler is None:
        yield TrajectoryTasks()
        return
    client = connect(scheduler)
    try:
        yield TrajectoryTasks(client)
    finally:
        client.close()
