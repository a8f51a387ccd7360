"""Commands that read a store and report: ``info``, ``ls``, ``stats``, ``verify``, ``plot``.

Each parses its arguments, calls one library function (imported in its body, so listing
the commands imports nothing heavy) and prints the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from rbzarr.cli.console import progress_wanted
from rbzarr.cli.options import (
    cache_arguments,
    json_flag,
    output_option,
    per_trajectory_flag,
    print_report,
    scheduler_option,
    storage_options,
    store_source,
    tasks,
)

if TYPE_CHECKING:
    from rbzarr.analysis.listing import StoreListing

__all__ = ["info", "list_command", "plot", "stats", "verify"]


@click.command()
@click.argument("url")
@json_flag
@click.pass_context
def info(ctx: click.Context, url: str, as_json: bool) -> None:
    """Counts, per-key dtype / shape / chunks / codec, and sizes of the store at URL."""
    from rbzarr.analysis.report_text import info_lines  # noqa: PLC0415
    from rbzarr.analysis.summary import describe_store  # noqa: PLC0415

    print_report(describe_store(_listing(ctx, url)), as_json, info_lines)


@click.command(name="ls")
@click.argument("url")
@json_flag
@click.pass_context
def list_command(ctx: click.Context, url: str, as_json: bool) -> None:
    """One line per committed trajectory: id, uuid, shape, samples, weights id, bytes."""
    from rbzarr.analysis.report_text import ls_lines  # noqa: PLC0415
    from rbzarr.analysis.summary import list_trajectories  # noqa: PLC0415

    print_report(list_trajectories(_listing(ctx, url)), as_json, ls_lines)


def _listing(ctx: click.Context, url: str) -> StoreListing:
    """The listing of the store at ``url``."""
    from rbzarr.analysis.listing import StoreListing  # noqa: PLC0415 (torch-free)

    return StoreListing(store_source(ctx, url), storage_options(ctx))


@click.command()
@click.argument("url")
@click.option(
    "--keys",
    multiple=True,
    help="Only these flat keys (comma-separated or repeated), e.g. rewards,curr_obs/state.",
)
@click.option(
    "--decode-images",
    is_flag=True,
    help="Decode every frame of the image keys (default: frames of a few trajectories).",
)
@per_trajectory_flag
@scheduler_option
@json_flag
@click.pass_context
def stats(
    ctx: click.Context,
    url: str,
    keys: tuple[str, ...],
    decode_images: bool,
    per_trajectory: bool,
    scheduler: str | None,
    as_json: bool,
) -> None:
    """Per-key mean / std / min / max and episode returns and lengths (streaming); image keys
    from the frames of a few trajectories unless --decode-images.  Progress goes to stderr
    (a line every 10 s into a pipe or log)."""
    from rbzarr.analysis.report_text import stats_lines  # noqa: PLC0415
    from rbzarr.analysis.stats import compute_stats  # noqa: PLC0415

    wanted = [key for item in keys for key in item.split(",") if key] or None
    with tasks(scheduler) as running:
        report = compute_stats(
            url,
            wanted,
            progress=progress_wanted(lines=True),
            across_trajectories=not per_trajectory,
            storage_options=storage_options(ctx),
            tasks=running,
            decode_images=decode_images,
        )
    print_report(report, as_json, stats_lines)


@click.command()
@click.argument("url")
@click.option("--repair", is_flag=True, help="Remove orphans and temp files, never indexed data.")
@click.option(
    "--drop-damaged",
    is_flag=True,
    help="With --repair: remove the index entries of trajectories whose data cannot be read "
    "(their data stays, as orphans).",
)
@json_flag
@click.pass_context
def verify(ctx: click.Context, url: str, repair: bool, drop_damaged: bool, as_json: bool) -> None:
    """Check index against data; exit 1 while problems remain.

    \f
    Parameters
    ----------
    ctx
        The command's context; the group's ``--storage-option`` values are read from it.
    url
        The store to check.
    repair, drop_damaged
        ``--repair`` and ``--drop-damaged``, passed to ``verify_store``.
    as_json
        ``--json``: print the report as JSON instead of lines.

    Raises
    ------
    click.UsageError
        ``--drop-damaged`` without ``--repair`` (nothing is checked).
    """
    from rbzarr.analysis.report_text import verify_lines  # noqa: PLC0415
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415

    if drop_damaged and not repair:
        raise click.UsageError("--drop-damaged changes the index: use it with --repair")
    report = verify_store(
        store_source(ctx, url), storage_options(ctx), repair=repair, drop_damaged=drop_damaged
    )
    print_report(report, as_json, verify_lines, report.to_dict)
    if not report.ok:
        ctx.exit(1)


@click.command()
@click.argument("url")
@output_option("Image file; its suffix picks the format (.png, .jpg / .jpeg, .svg, .pdf).")
@per_trajectory_flag
@scheduler_option
@click.pass_context
def plot(
    ctx: click.Context, url: str, output: str, per_trajectory: bool, scheduler: str | None
) -> None:
    """Histograms of rewards, episode returns and lengths; return over trajectory id."""
    from rbzarr.analysis.plotting import plot_store  # noqa: PLC0415
    from rbzarr.analysis.store_arrays import StoreArrays  # noqa: PLC0415 (no torch)

    view = StoreArrays(store_source(ctx, url), storage_options(ctx), **cache_arguments(ctx))
    with tasks(scheduler) as running:
        counts = plot_store(
            view,
            output,
            progress=progress_wanted(),
            across_trajectories=not per_trajectory,
            tasks=running,
        )
    click.echo(f"wrote {output} ({counts['rewards']} rewards, {counts['episodes']} episodes)")
