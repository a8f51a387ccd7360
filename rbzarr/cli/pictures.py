"""Commands that draw a store: ``show`` (frames of a trajectory or episode) and ``report``
(one HTML page).  Both only read the store; everything they write goes to ``-o``."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import click

from rbzarr.cli.console import parse_ids, progress_wanted
from rbzarr.cli.options import (
    cache_arguments,
    output_option,
    per_trajectory_flag,
    storage_options,
    store_source,
)

if TYPE_CHECKING:
    from rbzarr.analysis.store_arrays import StoreArrays

__all__ = ["report", "show"]

_keys_option = click.option(
    "--keys",
    multiple=True,
    help="Camera keys, side by side (comma-separated or repeated); default: every "
    "image-like curr_obs key.",
)
_fps_option = click.option(
    "--fps", type=click.IntRange(min=1), default=10, show_default=True, help="Steps per second."
)


# range_gap 0: on an object store, only the shown rows' bytes, never the frames between
_ONLY_SHOWN = {"zarr": {"range_gap": 0}}


def _open_arrays(ctx: click.Context, url: str) -> StoreArrays:
    """The store at ``url`` read into numpy (a zarr store without torch), with the group's
    options."""
    from rbzarr.analysis.store_arrays import StoreArrays  # noqa: PLC0415

    return StoreArrays(
        store_source(ctx, url),
        storage_options(ctx),
        layout_options=_ONLY_SHOWN,
        **cache_arguments(ctx),
    )


@click.command()
@click.argument("url")
@click.argument("trajectory_id", required=False, type=int)
@click.option("--env", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--episode",
    type=click.IntRange(min=0),
    default=None,
    help="Show episode K (from 0, in the order `iter_episodes` yields them, across "
    "trajectories) instead of a trajectory's env column.",
)
@_keys_option
@_fps_option
@output_option(
    "Picture file; its suffix picks the format: .mp4, .gif, .webp (one frame per step) or "
    ".png (a contact sheet)."
)
@per_trajectory_flag
@click.pass_context
def show(
    ctx: click.Context,
    url: str,
    trajectory_id: int | None,
    env: int,
    episode: int | None,
    keys: tuple[str, ...],
    fps: int,
    output: str,
    per_trajectory: bool,
) -> None:
    """Frames of trajectory ID's env column (or of one episode), cameras side by side,
    with reward, done / termination / truncation / intervention marks and episode starts.

    \f
    Parameters
    ----------
    ctx
        The command's context (the group's options).
    url, trajectory_id, env, episode, keys, fps, output, per_trajectory
        The arguments and options above.

    Raises
    ------
    click.UsageError
        Neither or both of ID and ``--episode``.
    """
    from rbzarr.analysis.frames import (  # noqa: PLC0415
        episode_steps,
        find_episode,
        image_keys,
        trajectory_steps,
    )
    from rbzarr.analysis.show import output_format, show_steps  # noqa: PLC0415

    if (trajectory_id is None) == (episode is None):
        raise click.UsageError("give a trajectory ID or --episode K (one of them)")
    output_format(output)  # a bad suffix fails before the store is read
    store = _open_arrays(ctx, url)  # read into numpy: a zarr store without torch
    cameras = image_keys(store, [key for item in keys for key in item.split(",") if key])
    if trajectory_id is not None:
        shown = trajectory_steps(store, trajectory_id, env, cameras)
    else:
        found = find_episode(store, cast(int, episode), not per_trajectory)
        shown = episode_steps(store, found, cameras)
    result = show_steps(shown, output, fps, progress=progress_wanted())
    width, height = result.frame_size
    what = shown.title if episode is None else f"episode {episode}: {shown.title}"
    click.echo(f"wrote {output} ({result.frames} frames of {width}x{height}: {what})")


@click.command()
@click.argument("url")
@click.option(
    "--episodes",
    callback=parse_ids,
    default=None,
    metavar="K,K,...",
    help="Episodes to show in full (numbers from 0, as `iter_episodes` yields them); "
    "default: the first 20. Every episode is listed either way.",
)
@_keys_option
@_fps_option
@output_option("The HTML page to write (self-contained: videos and figures embedded).")
@per_trajectory_flag
@click.pass_context
def report(
    ctx: click.Context,
    url: str,
    episodes: list[int] | None,
    keys: tuple[str, ...],
    fps: int,
    output: str,
    per_trajectory: bool,
) -> None:
    """One HTML page: the store's summary, its plots, its episodes, and some in full (camera
    videos with reward / action / state plots that follow them)."""
    from rbzarr.analysis.report_page import write_report  # noqa: PLC0415
    from rbzarr.analysis.summary import describe_store  # noqa: PLC0415

    view = _open_arrays(ctx, url)
    info = describe_store(view)
    result = write_report(
        view,
        info,
        output,
        episodes=episodes,
        keys=[key for item in keys for key in item.split(",") if key] or None,
        fps=fps,
        progress=progress_wanted(),
        across_trajectories=not per_trajectory,
    )
    click.echo(
        f"wrote {output} ({result.bytes / 1e6:.1f} MB: {result.episodes} episodes listed, "
        f"{len(result.embedded)} shown)"
    )
