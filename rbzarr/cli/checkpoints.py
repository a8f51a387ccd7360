"""``rbzarr checkpoints`` and ``rbzarr checkpoint materialize|drop``: a store's pins, and the
manifests that hold them (see docs/checkpoints.md)."""

from __future__ import annotations

import datetime
from typing import Any

import click

from rbzarr.cli.options import json_flag, print_report, storage_options, store_source

__all__ = ["checkpoint_group", "checkpoints_command", "id_ranges"]


def id_ranges(ids: list[int]) -> str:
    """Ids as runs: ``0-3,7,9-10`` (sorted, each id once)."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _location(ctx: click.Context, url: str) -> Any:
    from rbzarr.storage.io.location import Location  # noqa: PLC0415 (keep --help fast)

    return Location.from_url(store_source(ctx, url), storage_options(ctx))


@click.command(name="checkpoints")
@click.argument("store")
@json_flag
@click.pass_context
def checkpoints_command(ctx: click.Context, store: str, as_json: bool) -> None:
    """List the checkpoints that pin trajectories of the zarr store STORE, oldest first: the
    pin's id, when it was saved, the manifest's path, the ids it holds and their bytes on
    storage.  Nothing a pin holds is ever deleted."""
    from rbzarr.analysis.summary import file_sizes  # noqa: PLC0415
    from rbzarr.errors import CheckpointNotFoundError  # noqa: PLC0415
    from rbzarr.storage.index.store_index import StoreIndex  # noqa: PLC0415

    location = _location(ctx, store)
    catalog = StoreIndex.open(location)
    if not catalog.exists:
        raise CheckpointNotFoundError(f"{location.url}: {location.absence()}")
    sizes: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    for pin in catalog.pins.all():
        for i in pin.ids:
            if i not in sizes:
                sizes[i] = sum(file_sizes(location.child("trajectories", str(i))).values())
        rows.append(
            {
                "pin": pin.pin_id,
                "created": datetime.datetime.fromtimestamp(pin.created, datetime.UTC).isoformat(
                    timespec="seconds"
                ),
                "checkpoint": pin.checkpoint,
                "ids": list(pin.ids),
                "bytes": sum(sizes[i] for i in pin.ids),
            }
        )
    print_report(rows, as_json, lambda rows: _pin_lines(location.url, rows))


def _pin_lines(url: str, rows: list[dict[str, Any]]) -> list[str]:
    """One line per pin of :func:`checkpoints_command`'s ``rows``; one saying so when none."""
    if not rows:
        return [f"{url}: no checkpoint pins any trajectory"]
    return [
        f"{row['pin']}  {row['created']}  {row['checkpoint']}  "
        f"{len(row['ids'])} trajectories ({id_ranges(row['ids'])})  {row['bytes']:,} bytes"
        for row in rows
    ]


@click.group(name="checkpoint")
def checkpoint_group() -> None:
    """Copy or drop a checkpoint manifest (what save_checkpoint writes for a zarr store)."""


@checkpoint_group.command(name="materialize")
@click.argument("manifest")
@click.argument("destination")
@click.pass_context
def materialize_command(ctx: click.Context, manifest: str, destination: str) -> None:
    """Copy the trajectories the checkpoint MANIFEST names into DESTINATION, a new
    self-contained checkpoint (what save_checkpoint(path, copy=True) writes).  MANIFEST
    and its pin are left as they are."""
    from rbzarr.buffer import checkpoint  # noqa: PLC0415
    from rbzarr.storage.registry import layout_class  # noqa: PLC0415

    documents = checkpoint.materialize(
        _location(ctx, manifest),
        _location(ctx, destination),
        lambda location, fmt: layout_class(fmt)(location),
    )
    ids = documents.trajectory_index["trajectory_id_list"]
    click.echo(f"copied {len(ids)} trajectories ({id_ranges(ids)}) into {destination}")


@checkpoint_group.command(name="drop")
@click.argument("target")
@click.option(
    "--pin",
    "pin_id",
    metavar="ID",
    default=None,
    help="TARGET is a store: drop its pin ID (e.g. one a crash left without its manifest).",
)
@click.pass_context
def drop_command(ctx: click.Context, target: str, pin_id: str | None) -> None:
    """Unpin a checkpoint: delete the manifest at TARGET, then its pin in the store (the
    trajectories stay; a later collection may delete them).  With --pin, TARGET is the store
    and ID the pin to drop."""
    from rbzarr.buffer import manifest  # noqa: PLC0415
    from rbzarr.errors import CheckpointNotFoundError  # noqa: PLC0415
    from rbzarr.storage.index.pins import StorePins  # noqa: PLC0415

    location = _location(ctx, target)
    if pin_id is None:
        found = manifest.read_manifest(location)
        if found is None:
            raise CheckpointNotFoundError(
                f"{location.url}: no checkpoint manifest ({manifest.MANIFEST_FILE}) here; to "
                "drop a pin by its id: rbzarr checkpoint drop STORE --pin ID"
            )
    else:
        pin = StorePins(location).read(pin_id)
        if pin is None:
            raise CheckpointNotFoundError(f"{location.url}: no pin {pin_id}")
        # The manifest that still names the pin goes with it (never one without its pin).
        checkpoint_at = _location(ctx, pin.checkpoint)
        found = manifest.read_manifest(checkpoint_at)
        if found is None or found.pin_id != pin.pin_id:
            StorePins(location).drop(pin.pin_id)
            click.echo(f"dropped pin {pin.pin_id} of {location.url}")
            return
        location = checkpoint_at
    had_pin = manifest.drop(location, found)
    note = "" if had_pin else " (its pin was gone already)"
    click.echo(f"dropped the checkpoint {location.url} of {found.store}{note}")
