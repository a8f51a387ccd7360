"""``rbzarr gc``: delete a zarr store's trajectories outside its last N that no checkpoint
pins (see :mod:`rbzarr.analysis.collect`)."""

from __future__ import annotations

import click

from rbzarr.cli.options import count_option, json_flag, print_json, storage_options

__all__ = ["gc_command"]


@click.command(name="gc")
@click.argument("store")
@count_option(
    "--keep-last",
    0,
    "Keep the store's last N trajectories (and every one a checkpoint pins).",
    required=True,
)
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
@json_flag
@click.pass_context
def gc_command(
    ctx: click.Context, store: str, keep_last: int, dry_run: bool, as_json: bool
) -> None:
    """Delete the trajectories of the zarr store STORE outside its last N that no checkpoint
    pins.  Offline: refused while a buffer writes the store.  The deletion is recorded in the
    store (gc/<run>.json) and the index rewritten before any data goes; a crash leaves
    orphans that `rbzarr verify --repair` or the next gc deletes."""
    from rbzarr.analysis.collect import collect_store  # noqa: PLC0415 (keep --help fast)
    from rbzarr.cli.checkpoints import id_ranges  # noqa: PLC0415

    plan = collect_store(store, keep_last, storage_options(ctx), dry_run=dry_run)
    if as_json:
        print_json({**plan.to_dict(), "dry_run": dry_run})
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{plan.url}: {verb} {len(plan.deleted)} trajectories ({id_ranges(plan.deleted) or '-'}); "
        f"kept {plan.kept}, of which {len(plan.pinned)} pinned by checkpoints "
        f"({id_ranges(plan.pinned) or '-'})"
    )
    if plan.finished:
        click.echo(f"finished an interrupted collection: {id_ranges(plan.finished)}")
