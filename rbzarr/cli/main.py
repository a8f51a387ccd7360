"""The ``rbzarr`` command: inspect, check, convert, merge, split and plot stores.

Each subcommand parses its arguments, calls one library function and prints the result.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click

from rbzarr import __version__
from rbzarr.cli.codecs import codec_option, codecs_command, recode_command
from rbzarr.cli.console import OneLineErrors, parse_ids, parse_storage_options, progress_wanted

__all__ = ["main"]


def _options(ctx: click.Context) -> dict[str, Any]:
    return dict(ctx.find_root().params.get("storage_options") or {})


def _source(ctx: click.Context, url: str) -> Any:
    """``url``, or with ``--follow-links`` a location that follows links inside the store."""
    if not ctx.find_root().params.get("follow_links"):
        return url
    from rbzarr.storage.location import Location  # noqa: PLC0415 (keep --help fast)

    return Location.from_url(url, _options(ctx), follow_links=True)


def _cache(ctx: click.Context) -> dict[str, Any]:
    """``open_buffer``'s local cache arguments from the group's ``--local-cache`` options."""
    params = ctx.find_root().params
    if params.get("local_cache") is None:
        return {}
    return {
        "local_cache_dir": params["local_cache"],
        "local_cache_bytes": params.get("local_cache_bytes"),
    }


def _print_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2))


def _echo_lines(lines: list[str]) -> None:
    click.echo("\n".join(lines))


_json_flag = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option(
    "--local-cache-bytes",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Bound of --local-cache in bytes (default 16 GiB).",
)
@click.option(
    "--follow-links",
    "follow_links",
    is_flag=True,
    help="Read a local store through symbolic links inside it (only a trusted store whose "
    "folders you linked on purpose); without it such a link is an error. verify --repair "
    "never deletes or writes through a link either way.",
)
@click.version_option(version=__version__, prog_name="rbzarr")
def main(
    storage_options: dict[str, Any],
    local_cache: str | None,
    local_cache_bytes: int | None,
    follow_links: bool,
) -> None:
    """Inspect and manage rbzarr / RLinf trajectory stores (local paths or fsspec URLs)."""


@main.command()
@click.argument("url")
@_json_flag
@click.pass_context
def info(ctx: click.Context, url: str, as_json: bool) -> None:
    """Counts, per-key dtype / shape / chunks / codec, and sizes of the store at URL."""
    from rbzarr.analysis.report_text import info_lines  # noqa: PLC0415
    from rbzarr.analysis.summary import describe_store  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415 (keep --help fast)

    report = describe_store(open_buffer(_source(ctx, url), _options(ctx), **_cache(ctx)))
    if as_json:
        _print_json(report)
        return
    _echo_lines(info_lines(report))


@main.command(name="ls")
@click.argument("url")
@_json_flag
@click.pass_context
def list_command(ctx: click.Context, url: str, as_json: bool) -> None:
    """One line per committed trajectory: id, uuid, shape, samples, weights id, bytes."""
    from rbzarr.analysis.report_text import ls_lines  # noqa: PLC0415
    from rbzarr.analysis.summary import list_trajectories  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    rows = list_trajectories(open_buffer(_source(ctx, url), _options(ctx), **_cache(ctx)))
    if as_json:
        _print_json(rows)
        return
    _echo_lines(ls_lines(rows))


_scheduler_option = click.option(
    "--scheduler",
    metavar="ADDRESS",
    default=None,
    help="Run the per-trajectory work as tasks on this dask.distributed scheduler "
    "(e.g. tcp://10.0.0.5:8786; needs rbzarr[dask]); its workers must reach the store's "
    "URL. Same results as without it.",
)


@contextlib.contextmanager
def _tasks(scheduler: str | None) -> Iterator[Any]:
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


_per_trajectory_flag = click.option(
    "--per-trajectory",
    is_flag=True,
    help="Cut episodes at trajectory boundaries instead of following them into the next "
    "trajectory of their run (consecutive ids, same number of envs).",
)


@main.command()
@click.argument("url")
@click.option(
    "--keys",
    multiple=True,
    help="Only these flat keys (comma-separated or repeated), e.g. rewards,curr_obs/state.",
)
@_per_trajectory_flag
@_scheduler_option
@_json_flag
@click.pass_context
def stats(
    ctx: click.Context,
    url: str,
    keys: tuple[str, ...],
    per_trajectory: bool,
    scheduler: str | None,
    as_json: bool,
) -> None:
    """Per-key mean / std / min / max and episode returns and lengths (streaming)."""
    from rbzarr.analysis.report_text import stats_lines  # noqa: PLC0415
    from rbzarr.analysis.stats import compute_stats  # noqa: PLC0415

    wanted = [key for item in keys for key in item.split(",") if key] or None
    with _tasks(scheduler) as tasks:
        report = compute_stats(
            url,
            wanted,
            progress=progress_wanted(),
            across_trajectories=not per_trajectory,
            storage_options=_options(ctx),
            tasks=tasks,
        )
    if as_json:
        _print_json(report)
        return
    _echo_lines(stats_lines(report))


@main.command()
@click.argument("url")
@click.option("--repair", is_flag=True, help="Remove orphans and temp files, never indexed data.")
@click.option(
    "--drop-damaged",
    is_flag=True,
    help="With --repair: remove the index entries of trajectories whose data cannot be read "
    "(their data stays, as orphans).",
)
@_json_flag
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
        _source(ctx, url), _options(ctx), repair=repair, drop_damaged=drop_damaged
    )
    if as_json:
        _print_json(report.to_dict())
    else:
        _echo_lines(verify_lines(report))
    if not report.ok:
        ctx.exit(1)


_format_choice = click.Choice(["zarr", "pt", "pkl"])
# export also writes a LeRobot v3.0 dataset, a robomimic-layout HDF5 file or a Minari
# dataset (rbzarr.interop).
_DATASET_FORMATS = ("lerobot", "hdf5", "minari")
_export_choice = click.Choice(["zarr", "pt", "pkl", *_DATASET_FORMATS])


@main.command()
@click.argument("source")
@click.argument("destination")
@click.option("--format", "trajectory_format", type=_export_choice, required=True)
@click.option("--ids", callback=parse_ids, help="Only these ids, e.g. 1,2,5 (store formats).")
@click.option(
    "--last", type=click.IntRange(min=0), help="Only the last N trajectories (store formats)."
)
@click.option(
    "--fps",
    type=click.IntRange(min=1),
    help="lerobot: frames per second (default: the imported dataset's, else 30).",
)
@click.option(
    "--task",
    default="",
    help="lerobot: the task of every episode of a store not imported from LeRobot.",
)
@click.option(
    "--codec", default="libsvtav1", show_default=True, help="lerobot: the PyAV video encoder."
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="lerobot, hdf5, minari: also write the episodes still running where the store ends.",
)
@_scheduler_option
@click.pass_context
def export(
    ctx: click.Context,
    source: str,
    destination: str,
    trajectory_format: str,
    ids: list[int] | None,
    last: int | None,
    fps: int | None,
    task: str,
    codec: str,
    include_incomplete: bool,
    scheduler: str | None,
) -> None:
    """Copy SOURCE into a new store DESTINATION in another layout, or a LeRobot / HDF5 / Minari
    dataset (the episodes that ended).

    \f
    Parameters
    ----------
    ctx
        The command's context; the group's ``--storage-option`` values are read from it.
    source, destination, trajectory_format, ids, last, fps, task, codec, include_incomplete
    scheduler
        The arguments and options, passed to ``export_store`` or ``export_dataset``.

    Raises
    ------
    click.UsageError
        ``--ids``, ``--last`` or ``--scheduler`` with a dataset format, or
        ``--include-incomplete`` with a store format.
    """
    options = _options(ctx)
    if trajectory_format in _DATASET_FORMATS:
        from rbzarr.interop import export_dataset  # noqa: PLC0415

        if ids is not None or last is not None or scheduler is not None:
            raise click.UsageError(
                f"--ids, --last and --scheduler export store formats, not {trajectory_format}"
            )
        written = export_dataset(
            source,
            destination,
            trajectory_format,
            fps=fps,
            task=task,
            codec=codec,
            include_incomplete=include_incomplete,
            storage_options=options,
            destination_options=options,
            progress=progress_wanted(),
        )
        left = (
            f"; {written.left_out} incomplete episodes left out (--include-incomplete writes them)"
            if written.left_out
            else ""
        )
        click.echo(f"exported {written.episodes} episodes to {destination}{left}")
        return
    if include_incomplete:
        raise click.UsageError(
            f"--include-incomplete exports dataset formats, not {trajectory_format}"
        )
    from rbzarr.analysis.export import export_store  # noqa: PLC0415

    with _tasks(scheduler) as tasks:
        documents = export_store(
            _source(ctx, source),
            destination,
            trajectory_format,
            ids=ids,
            last=last,
            storage_options=options,
            destination_options=options,
            progress=progress_wanted(),
            tasks=tasks,
        )
    click.echo(f"exported {documents.metadata['size']} trajectories to {destination}")


@main.command(name="import")
@click.argument("source")
@click.argument("destination")
@click.option(
    "--from",
    "source_format",
    type=click.Choice(["lerobot", "robomimic", "minari"]),
    required=True,
    help="lerobot: a LeRobot v3.0 dataset folder; robomimic: an HDF5 file; minari: a Minari "
    "dataset folder or an id under MINARI_DATASETS_PATH.",
)
@codec_option
@click.pass_context
def import_command(
    ctx: click.Context,
    source: str,
    destination: str,
    source_format: str,
    codecs: dict[str, str],
) -> None:
    """Import a LeRobot v3.0 dataset, robomimic HDF5 file or Minari dataset SOURCE into a new
    zarr store (image keys lossless unless --codec says otherwise)."""
    from rbzarr.interop import import_dataset  # noqa: PLC0415

    options = _options(ctx)
    documents = import_dataset(
        source,
        destination,
        source_format,
        storage_options=options,
        destination_options=options,
        progress=progress_wanted(),
        codecs=codecs,
    )
    metadata = documents.metadata
    click.echo(
        f"imported {metadata['size']} episodes ({metadata['total_samples']} frames) into "
        f"{destination}"
    )


@main.command()
@click.argument("destination")
@click.argument("sources", nargs=-1, required=True)
@click.option("--format", "trajectory_format", type=_format_choice, help="Default: first source's.")
@click.pass_context
def merge(
    ctx: click.Context, destination: str, sources: tuple[str, ...], trajectory_format: str | None
) -> None:
    """Merge SOURCES into a new store DESTINATION; ids are renumbered 0..N-1."""
    from rbzarr.analysis.merge_split import merge_stores  # noqa: PLC0415

    documents = merge_stores(
        destination, sources, trajectory_format, _options(ctx), progress=progress_wanted()
    )
    click.echo(f"merged {documents.metadata['size']} trajectories into {destination}")


@main.command()
@click.argument("source")
@click.argument("destination")
@click.option("--count", type=click.IntRange(min=1), required=True, help="Number of parts.")
@click.pass_context
def split(ctx: click.Context, source: str, destination: str, count: int) -> None:
    """Split SOURCE into COUNT stores DESTINATION/part_<k> (the load_checkpoint shares)."""
    from rbzarr.analysis.merge_split import split_store  # noqa: PLC0415

    for part in split_store(source, destination, count, _options(ctx), progress=progress_wanted()):
        click.echo(part)


@main.command()
@click.argument("url")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Image file; its suffix picks the format (.png, .jpg / .jpeg, .svg, .pdf).",
)
@_per_trajectory_flag
@_scheduler_option
@click.pass_context
def plot(
    ctx: click.Context, url: str, output: str, per_trajectory: bool, scheduler: str | None
) -> None:
    """Histograms of rewards, episode returns and lengths; return over trajectory id."""
    from rbzarr.analysis.plotting import plot_store  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    view = open_buffer(_source(ctx, url), _options(ctx), **_cache(ctx))
    with _tasks(scheduler) as tasks:
        counts = plot_store(
            view,
            output,
            progress=progress_wanted(),
            across_trajectories=not per_trajectory,
            tasks=tasks,
        )
    click.echo(f"wrote {output} ({counts['rewards']} rewards, {counts['episodes']} episodes)")


@main.command()
@click.option(
    "--store",
    default="rbzarr-demo",
    show_default=True,
    type=click.Path(),
    help="Directory for the run (a new run-<time> folder inside).",
)
@click.option("--env", "env_id", default="CartPole-v1", show_default=True)
@click.option("--num-envs", default=8, show_default=True)
@click.option(
    "--steps",
    "steps_per_trajectory",
    default=32,
    show_default=True,
    help="Time steps per trajectory.",
)
@click.option("--trajectories", default=200, show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--seed", default=0, show_default=True)
def demo(store: str, **settings: Any) -> None:
    """Train a DQN on a gymnasium env through a Zarr-backed buffer; print greedy returns.

    Writes the store, a checkpoint and (with matplotlib) learning-curve.png in a new run
    folder.
    """
    from pathlib import Path  # noqa: PLC0415

    from rbzarr.demo.demo import DemoSettings, report, run_demo, write_learning_curve  # noqa: PLC0415

    result = run_demo(DemoSettings(store=Path(store), progress=progress_wanted(), **settings))
    click.echo(report(result))
    click.echo(f"learning curve {write_learning_curve(result)}")


main.add_command(codecs_command)
main.add_command(recode_command)

if __name__ == "__main__":
    main()
