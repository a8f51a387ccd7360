"""``rbzarr codecs`` and ``rbzarr recode``: pick image codecs by measuring, re-encode a store."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import click

from rbzarr.cli.console import progress_wanted

__all__ = ["codec_option", "codecs_command", "parse_codec_pairs", "recode_command"]


def parse_codec_pairs(
    ctx: click.Context | None, param: click.Parameter | None, values: tuple[str, ...]
) -> dict[str, str]:
    """``KEY=SPEC`` options as ``{key: spec}`` (each spec checked)."""
    from rbzarr.storage.zarr.codecs import parse_codec  # noqa: PLC0415 (keep --help fast)

    found: dict[str, str] = {}
    for value in values:
        key, sep, spec = value.partition("=")
        if not sep or not key or not spec:
            raise click.BadParameter(
                f"expected KEY=SPEC (e.g. curr_obs/image=jpeg:95), got {value!r}"
            )
        try:
            parse_codec(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        if key in found:
            raise click.BadParameter(f"{key!r} is given twice")
        found[key] = spec
    return found


codec_option = click.option(
    "--codec",
    "codecs",
    multiple=True,
    metavar="KEY=SPEC",
    callback=parse_codec_pairs,
    help="Codec of a key (repeatable), or of every other key with KEY 'default': raw, "
    "zstd[:level], lossless, qoi, png[:level], jpegxl-lossless[:effort], jpeg:<quality>, "
    "jpegxl:<quality>.",
)


def _options(ctx: click.Context) -> dict[str, Any]:
    return dict(ctx.find_root().params.get("storage_options") or {})


@click.command(name="codecs")
@click.argument("url")
@click.option(
    "--keys", default=None, metavar="K1,K2", help="Image keys to try (default: every image key)."
)
@click.option(
    "--candidates",
    default=None,
    metavar="S1,S2",
    help="Codec specs to try (default: raw, zstd:1, qoi, png:1, jpegxl-lossless:1, jpeg:95, "
    "jpegxl:90).",
)
@click.option(
    "--frames",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Frames per key, spread over up to 4 trajectories of the store.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def codecs_command(
    ctx: click.Context,
    url: str,
    keys: str | None,
    candidates: str | None,
    frames: int,
    as_json: bool,
) -> None:
    """Try candidate codecs on a sample of the image frames of the store at URL: stored/raw,
    PSNR (inf: lossless), encode and decode frames per second on one core.  Nothing is
    written."""
    from rbzarr.analysis.codec_trial import try_codecs  # noqa: PLC0415
    from rbzarr.storage.zarr.codecs import CANDIDATES  # noqa: PLC0415

    wanted = [k.strip() for k in keys.split(",") if k.strip()] if keys else None
    specs = [s.strip() for s in candidates.split(",") if s.strip()] if candidates else CANDIDATES
    rows = try_codecs(url, wanted, specs, frames, _options(ctx))
    if as_json:
        click.echo(json.dumps([_finite(row) for row in rows], indent=2))
        return
    click.echo(
        f"{'key':<28} {'codec':<18} {'stored/raw':>10} {'PSNR dB':>8} "
        f"{'encode f/s':>10} {'decode f/s':>10}"
    )
    for row in rows:
        if "error" in row:
            click.echo(f"{row['key']:<28} {row['codec']:<18} unavailable: {row['error']}")
            continue
        quality = "lossless" if math.isinf(row["psnr"]) else f"{row['psnr']:.1f}"
        click.echo(
            f"{row['key']:<28} {row['codec']:<18} {row['ratio']:>10.3f} {quality:>8} "
            f"{row['encode_fps']:>10,.0f} {row['decode_fps']:>10,.0f}"
        )


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """A row for JSON: ``inf`` (lossless PSNR, an unmeasurably fast rate) as ``None``."""
    return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in row.items()}


@click.command(name="recode")
@click.argument("source")
@click.argument("destination")
@codec_option
@click.pass_context
def recode_command(
    ctx: click.Context, source: str, destination: str, codecs: dict[str, str]
) -> None:
    """Re-encode the store SOURCE into a new zarr store DESTINATION with the given codecs
    (other keys keep theirs; next_obs/K takes the codec of curr_obs/K unless given apart).
    SOURCE is only read; an interrupted recode resumes when run again with the same codecs.
    What the codecs do beyond what they name (the keys default reaches, a next_obs key that
    is no longer stored once, with its cost) is printed on stderr first."""
    from rbzarr.analysis.recode import plan_recode, recode_store  # noqa: PLC0415
    from rbzarr.errors import RecodeWarning  # noqa: PLC0415

    if not codecs:
        raise click.UsageError("give at least one --codec KEY=SPEC")
    options = _options(ctx)
    plan = plan_recode(source, codecs, options)
    for line in plan.notes():
        click.echo(f"note: {line}", err=True)
    for line in plan.split:
        click.echo(f"warning: {line}", err=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecodeWarning)  # printed above
        documents = recode_store(
            source,
            destination,
            codecs,
            storage_options=options,
            destination_options=options,
            progress=progress_wanted(),
        )
    recorded = documents.metadata.get("codecs", {})
    chosen = ", ".join(f"{key}={recorded.get(key, spec)}" for key, spec in codecs.items())
    click.echo(f"recoded {documents.metadata['size']} trajectories into {destination} ({chosen})")
