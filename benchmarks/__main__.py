"""``python -m benchmarks``: the benchmark suites, run from a source checkout.

The harness is not part of the installed package; run it from the repository root.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

import benchmarks
from rbzarr.cli.console import parse_storage_options

# The numeric settings: (flag and parameter name, type, help).
_NUMBERS: tuple[tuple[str, type, str], ...] = (
    ("--trajectories", int, "Trajectories added per mode (default: window)."),
    ("--window", int, "sample_window_size (default 100; embodied 40)."),
    ("--cache", int, "cache_size of the disk-backed modes (default 5)."),
    ("--pool", int, "Distinct trajectories generated and cycled (default 8)."),
    ("--hot-calls", int, "sample() calls per hot variant (default 200)."),
    ("--warm-calls", int, "sample() calls per warm variant (default 30)."),
    ("--cold-calls", int, "sample() calls per cold variant (default 6)."),
    ("--budget budget_s", float, "Seconds per timed variant (default 6)."),
    ("--state-batch", int, "Rows per state sample() (default 4096)."),
    ("--image-batch", int, "Rows per image sample() (default 256)."),
    ("--embodied-batch", int, "Rows per embodied sample() (default 64)."),
    ("--s3-batch", int, "Rows per S3 sample() (default 256)."),
    ("--s3-batches", int, "Steady S3 batches measured (default 5)."),
    ("--threads", int, "torch intra-op threads (default 1; 0 keeps torch's)."),
    ("--training-steps", int, "Steps per training loop (default 40)."),
)


def _number_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add an option per row of :data:`_NUMBERS`, in its order."""
    for flag, kind, text in reversed(_NUMBERS):
        command = click.option(*flag.split(), type=kind, help=text)(command)
    return command


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A tiny run (seconds) for smoke tests.")
@click.option(
    "--suites",
    default="sampling,s3,training",
    show_default=True,
    help="Comma-separated: sampling, s3, training, sequences, datasets (LeRobot round trips; "
    "the datasets extra), distributed (Ray and many writers), scale, priorities (prioritized "
    "replay vs TorchRL, built in its own environment by scripts/torchrl_env.sh), images (real "
    "camera frames: the bench-images extra), lifecycle (checkpoints that copy nothing).",
)
@click.option(
    "--workloads",
    default="state,image,embodied",
    show_default=True,
    help="Sampling workloads, comma-separated: state, image, embodied, atari.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the JSON results (and chart); default: a new temporary directory. "
    "The committed results change only when named here (--out benchmarks/results).",
)
@click.option("--check", is_flag=True, help="Exit with status 1 when a measured target is missed.")
@click.option("--plot/--no-plot", default=True, show_default=True, help="Write a PNG chart.")
@_number_options
@click.option(
    "--training-store",
    metavar="URL",
    help="The remote store of the training loop (default: moto behind the delaying proxy).",
)
@click.option(
    "--training-storage-option",
    "training_storage_options",
    multiple=True,
    callback=parse_storage_options,
    metavar="KEY=VALUE",
    help="fsspec option for the training loop's remote store (repeatable).",
)
@click.option(
    "--training-buffer-option",
    "training_buffer_options",
    multiple=True,
    callback=parse_storage_options,
    metavar="KEY=VALUE",
    help="TrajectoryReplayBuffer option of the training loop's buffers (repeatable).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Directory for the temporary stores (default: the system's).",
)
def main(**options: Any) -> None:
    """Sampling, write and S3 benchmarks against baselines and limits (benchmarks/README.md).

    Prints each suite's figures and its targets (what each measures, the value against the
    threshold), and writes one JSON document per suite.

    With --check, exits with status 1 when a measured target is missed (after the results
    are written).
    """
    quick, out, check, chart = (options.pop(name) for name in ("quick", "out", "check", "plot"))
    batches = {name: options.pop(f"{name}_batch") for name in ("state", "image", "embodied")}
    batches = {name: rows for name, rows in batches.items() if rows is not None}
    workdir = options.pop("workdir")
    try:  # bad names and sizes are refused before any work
        suites = benchmarks.parse_names(options.pop("suites"), benchmarks.SUITES, "suite")
        names = benchmarks.parse_names(
            options.pop("workloads"), benchmarks.WORKLOAD_NAMES, "workload"
        )
        settings = benchmarks.settings_from(quick, **options)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    with _progress() as say:
        documents = benchmarks.run(suites, names, settings, batches, quick, workdir, say)
    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="rbzarr-bench-"))
    for document in documents:
        click.echo(benchmarks.table(document) + "\n")
        for path in benchmarks.save(document, folder, chart):
            click.echo(f"wrote {path}")
    missed = benchmarks.failed_targets(documents)
    if check and missed:
        names_missed = "; ".join(t["target"] for t in missed)
        raise click.ClickException(f"{len(missed)} target(s) not met: {names_missed}")


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], None] | None]:
    """A progress bar on stderr when it is a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm  # noqa: PLC0415

    with tqdm(file=sys.stderr, bar_format="{desc} [{elapsed}]", leave=False) as bar:

        def say(label: str) -> None:
            bar.set_description_str(label)
            bar.update()

        yield say


if __name__ == "__main__":
    main(prog_name="python -m benchmarks")
