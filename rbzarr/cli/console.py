"""How the command line meets a terminal: one-line errors, closed pipes, progress, options."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from rbzarr.errors import RbzarrError

__all__ = [
    "OneLineErrors",
    "parse_ids",
    "parse_storage_options",
    "progress_wanted",
    "silence_stdout",
]

# Errors a user can cause; anything else is a bug and keeps its traceback.
_USER_ERRORS = (RbzarrError, OSError, ValueError, KeyError, ImportError)


class OneLineErrors(click.Group):
    """A group that turns user errors into one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen command; a user error becomes one line, a closed pipe exit 1."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            silence_stdout()
            ctx.exit(1)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # --help, usage errors: click's own, before the backends are imported
        except Exception as exc:
            from rbzarr.storage.io.backends import backend_errors  # noqa: PLC0415 (fsspec, zarr)

            if not isinstance(exc, (*_USER_ERRORS, *backend_errors())):
                raise
            message = " ".join(str(exc).split()) or type(exc).__name__
            raise click.ClickException(message) from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit raises no second broken pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def progress_wanted(lines: bool = False) -> bool:
    """Whether to show progress: on a terminal; with ``lines`` also into a pipe or a log
    file (a plain line every few seconds, see
    :func:`~rbzarr.analysis.progress.progress_bar`); never into a stream captured in-process."""
    if sys.stderr.isatty():
        return True
    if not lines:
        return False
    try:
        sys.stderr.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation: no file below it
        return False
    return True


def parse_storage_options(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    """Click callback: ``KEY=VALUE`` pairs to a dict, each VALUE parsed as JSON if it can be."""
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def parse_ids(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """Click callback: ``"1,2,5"`` to ``[1, 2, 5]`` (``None`` stays ``None``)."""
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
