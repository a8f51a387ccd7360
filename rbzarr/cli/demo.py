"""``rbzarr demo``: train a small DQN through a Zarr-backed buffer."""

from __future__ import annotations

from typing import Any

import click

from rbzarr.cli.console import progress_wanted

__all__ = ["demo"]


@click.command()
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
