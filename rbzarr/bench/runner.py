"""A whole benchmark run: every mode of the named workloads, as one JSON-ready document."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rbzarr.bench.measure import machine, versions
from rbzarr.bench.report import plot, targets
from rbzarr.bench.sampling import Settings, run_cold, run_hot
from rbzarr.bench.workloads import Workload, workloads
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES

__all__ = ["QUICK", "parse_chunk_sweep", "run", "save", "settings_from"]

QUICK = Settings(
    trajectories=6,
    window=5,
    cache=2,
    pool=2,
    hot_calls=20,
    cold_calls=5,
    budget_s=1.0,
    chunk_sweep=(),
)

Progress = Callable[[str], None]


def run(
    names: Sequence[str],
    settings: Settings,
    state_batch: int = 1024,
    image_batch: int = 256,
    workdir: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every mode of the named workloads.

    Parameters
    ----------
    names
        Workload names (``state``, ``image``, ``atari``).
    settings
        How much work each mode does.
    state_batch, image_batch
        Rows per ``sample`` call.
    workdir
        Where the temporary stores go (default: the system's temporary directory).
    progress
        Called with a short label before each mode.

    Returns
    -------
    dict
        The results document: machine, versions, settings, results, targets, notes.
    """
    found, notes = workloads(names, state_batch, image_batch)
    results: dict[str, Any] = {}
    threads = torch.get_num_threads()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    try:
        for workload in found:
            results[workload.name] = _run_workload(workload, settings, workdir, progress)
    finally:
        torch.set_num_threads(threads)
    return {
        "benchmark": "sampling",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(),
        "settings": {
            **dataclasses.asdict(settings),
            "state_batch": state_batch,
            "image_batch": image_batch,
            "workloads": list(names),
        },
        "results": results,
        "targets": targets(results),
        "notes": notes,
    }


def _run_workload(
    workload: Workload, settings: Settings, workdir: str | None, progress: Progress | None
) -> dict[str, Any]:
    say = progress or (lambda label: None)
    say(f"[{workload.name}] hot")
    entry: dict[str, Any] = {"T": workload.T, "B": workload.B, "batch": workload.batch}
    entry["hot"] = run_hot(workload, settings)
    for fmt in ("zarr", "pt"):
        say(f"[{workload.name}] cold-{fmt}")
        with tempfile.TemporaryDirectory(dir=workdir) as root:
            entry[f"cold_{fmt}"] = run_cold(workload, settings, fmt, root)
    entry["cold_zarr_vs_pt"] = (
        entry["cold_zarr"]["buffer"]["rows_s"] / entry["cold_pt"]["buffer"]["rows_s"]
    )
    if workload.name == "image" and settings.chunk_sweep:
        entry["chunk_sweep"] = _chunk_sweep(workload, settings, entry, workdir, say)
    return entry


def _chunk_sweep(
    workload: Workload,
    settings: Settings,
    entry: dict[str, Any],
    workdir: str | None,
    say: Progress,
) -> list[dict[str, Any]]:
    rows = [_sweep_row(DEFAULT_CHUNK_BYTES, True, entry["cold_zarr"])]
    for chunk_bytes, compressed in settings.chunk_sweep:
        codec = "zstd-1" if compressed else "none"
        say(f"[{workload.name}] cold-zarr chunk_bytes={chunk_bytes} codec={codec}")
        with tempfile.TemporaryDirectory(dir=workdir) as root:
            cold = run_cold(workload, settings, "zarr", root, chunk_bytes, compressed)
        rows.append(_sweep_row(chunk_bytes, compressed, cold))
    return rows


def _sweep_row(chunk_bytes: int, compressed: bool, cold: dict[str, Any]) -> dict[str, Any]:
    return {
        "chunk_bytes": chunk_bytes,
        "codec": "zstd-1" if compressed else "none",
        "rows_s": cold["buffer"]["rows_s"],
        "p50_ms": cold["buffer"]["p50_ms"],
        "limit_rows_s": cold["limit"]["rows_s"],
        "bytes_read_per_batch": cold["bytes_read_per_batch"],
        "write_mb_s": cold["write"]["mb_s"],
        "ratio": cold["disk"]["ratio"],
    }


def settings_from(quick: bool, **overrides: Any) -> Settings:
    """The default (or ``quick``) settings with every override that is not ``None``.

    Raises
    ------
    ValueError
        ``trajectories``, ``cache`` or ``pool`` is not positive.
    """
    base = QUICK if quick else Settings()
    settings = dataclasses.replace(
        base, **{name: value for name, value in overrides.items() if value is not None}
    )
    for name in ("trajectories", "cache", "pool"):
        if getattr(settings, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(settings, name)}")
    return settings


def parse_chunk_sweep(text: str) -> tuple[tuple[int, bool], ...]:
    """``"262144,262144:none"`` as ``((262144, True), (262144, False))``; ``""`` is none.

    Raises
    ------
    ValueError
        An entry is not ``BYTES`` or ``BYTES:none``.
    """
    sweep = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        size, _, codec = item.partition(":")
        if not size.isdigit() or codec not in ("", "none"):
            raise ValueError(f"--chunk-sweep: expected BYTES or BYTES:none, got {item!r}")
        sweep.append((int(size), codec != "none"))
    return tuple(sweep)


def save(document: dict[str, Any], out: Path, chart: bool) -> list[Path]:
    """Write ``document`` as ``<out>/<benchmark>.json`` (and its chart); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{document['benchmark']}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    written = [path]
    if chart:
        plot(document, path.with_suffix(".png"))
        written.append(path.with_suffix(".png"))
    return written
