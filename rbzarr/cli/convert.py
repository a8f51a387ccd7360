"""Commands that write stores and datasets: ``export``, ``import``, ``merge``, ``split``.

Each parses its arguments, calls one library function (imported in its body) and prints
what it wrote.
"""

from __future__ import annotations

from typing import Any

import click

from rbzarr.cli.codecs import codec_option
from rbzarr.cli.console import parse_ids, progress_wanted
from rbzarr.cli.options import (
    count_option,
    scheduler_option,
    storage_options,
    store_source,
    tasks,
)

__all__ = ["export", "import_command", "merge", "split"]

_format_choice = click.Choice(["zarr", "pt", "pkl"])
# export also writes a LeRobot v3.0 dataset, a robomimic-layout HDF5 file or a Minari
# dataset (rbzarr.interop).
_DATASET_FORMATS = ("lerobot", "hdf5", "minari")
_export_choice = click.Choice(["zarr", "pt", "pkl", *_DATASET_FORMATS])


@click.command()
@click.argument("source")
@click.argument("destination")
@click.option("--format", "trajectory_format", type=_export_choice, required=True)
@click.option("--ids", callback=parse_ids, help="Only these ids, e.g. 1,2,5 (store formats).")
@count_option("--last", 0, "Only the last N trajectories (store formats).")
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
    "--dataset-id",
    default=None,
    help="minari: the dataset id, (namespace/)name-v<N> (default: the path below "
    "MINARI_DATASETS_PATH when written there, else the folder's name).",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="lerobot, hdf5, minari: also write the episodes still running where the store ends.",
)
@scheduler_option
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
    dataset_id: str | None,
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
    source, destination, trajectory_format, ids, last, fps, task, codec, dataset_id
    include_incomplete, scheduler
        The arguments and options, passed to ``export_store`` or ``export_dataset``.

    Raises
    ------
    click.UsageError
        ``--ids``, ``--last`` or ``--scheduler`` with a dataset format, or
        ``--include-incomplete`` with a store format.
    """
    options = storage_options(ctx)
    copying: dict[str, Any] = {
        "storage_options": options,
        "destination_options": options,
        "progress": progress_wanted(),
    }
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
            dataset_id=dataset_id,
            **copying,
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

    with tasks(scheduler) as running:
        documents = export_store(
            store_source(ctx, source),
            destination,
            trajectory_format,
            ids=ids,
            last=last,
            tasks=running,
            **copying,
        )
    click.echo(f"exported {documents.metadata['size']} trajectories to {destination}")


@click.command(name="import")
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

    options = storage_options(ctx)
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


@click.command()
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
        destination, sources, trajectory_format, storage_options(ctx), progress=progress_wanted()
    )
    click.echo(f"merged {documents.metadata['size']} trajectories into {destination}")


@click.command()
@click.argument("source")
@click.argument("destination")
@click.option("--count", type=click.IntRange(min=1), required=True, help="Number of parts.")
@click.pass_context
def split(ctx: click.Context, source: str, destination: str, count: int) -> None:
    """Split SOURCE into COUNT stores DESTINATION/part_<k> (the load_checkpoint shares)."""
    from rbzarr.analysis.merge_split import split_store  # noqa: PLC0415

    for part in split_store(
        source, destination, count, storage_options(ctx), progress=progress_wanted()
    ):
        click.echo(part)
