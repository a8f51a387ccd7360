"""A whole benchmark run: each suite's results as one JSON-ready document."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.disk import run_disk
from benchmarks.distributed import distributed_targets, run_distributed
from benchmarks.hot import run_hot
from benchmarks.measure import machine, versions
from benchmarks.report import plot
from benchmarks.s3 import run_s3
from benchmarks.sequences import run_sequences, sequence_targets
from benchmarks.settings import Settings
from benchmarks.targets import s3_targets, sampling_targets, training_targets
from benchmarks.training import run_training
from benchmarks.workloads import workloads

__all__ = ["SUITES", "parse_names", "run", "save"]

SUITES = (
    "sampling",
    "s3",
    "training",
    "sequences",
    "datasets",
    "distributed",
    "scale",
    "priorities",
    "images",
    "lifecycle",
)
Progress = Callable[[str], None]


def parse_names(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """Comma-separated names, each one of ``allowed``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise ValueError(f"unknown {what} {unknown or text!r}; expected some of {list(allowed)}")
    return names


def run(
    suites: Sequence[str],
    names: Sequence[str],
    settings: Settings,
    batches: Mapping[str, int] | None = None,
    quick: bool = False,
    workdir: str | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Run the named suites."""
    say = progress or (lambda label: None)
    threads = torch.get_num_threads()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    try:
        documents = []
        for suite in suites:
            load, start = os.getloadavg(), time.perf_counter()
            document = _run_suite(suite, names, settings, batches, quick, workdir, say)
            _note_load(document, load, time.perf_counter() - start)
            documents.append(document)
        return documents
    finally:
        torch.set_num_threads(threads)


def _note_load(document: dict[str, Any], load: tuple[float, float, float], seconds: float) -> None:
    """Record the load average at the suite's start (its end is in ``machine``) and how long
    it ran, in ``machine`` and as a note."""
    end = document["machine"]["load_average"]
    document["machine"]["load_average_start"] = list(load)
    document["machine"]["suite_seconds"] = seconds
    document["notes"].append(
        f"load average (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in load)} at the start, "
        f"{', '.join(f'{x:.1f}' for x in end)} at the end, on {os.cpu_count()} cores; "
        f"the suite ran {seconds:.0f} s"
    )


def _run_suite(
    suite: str,
    names: Sequence[str],
    settings: Settings,
    batches: Mapping[str, int] | None,
    quick: bool,
    workdir: str | None,
    say: Progress,
) -> dict[str, Any]:
    """Run one suite; its JSON document."""
    if suite == "sampling":
        return _sampling(names, settings, batches or {}, quick, workdir, say)
    if suite == "datasets":
        say("[datasets] LeRobot round trips and a 1,000-episode import")
        from benchmarks.datasets_roundtrip import datasets_targets, run_datasets  # noqa: PLC0415

        measured = run_datasets(quick, workdir)
        return _document("datasets", settings, measured, datasets_targets(measured))
    if suite == "s3":
        say("[s3] sampling through the proxy")
        result = run_s3(settings, quick)
        return _document("s3", settings, {"image": result}, s3_targets(result))
    if suite == "training":
        say("[training] a training loop, local and S3, with and without prefetch")
        result = run_training(settings, quick, workdir)
        found = training_targets(result)
        return _document("training", settings, {"image": result}, found)
    if suite == "sequences":
        say("[sequences] sequences, samples per insert, demo mixing")
        sequences = run_sequences(settings, quick, workdir)
        return _document(suite, settings, sequences, sequence_targets(sequences))
    if suite == "distributed":
        say("[distributed] many writers, notices, add by reference, Ray actors")
        result = run_distributed(quick)
        return _document("distributed", settings, result, distributed_targets(result))
    if suite == "scale":
        say("[scale] tiny commits, resume and open of a large store, durable, S3")
        from benchmarks.scale import run_scale, scale_targets  # noqa: PLC0415

        result = run_scale(quick, workdir)
        return _document("scale", settings, result, scale_targets(result))
    if suite == "priorities":
        say("[priorities] prioritized replay vs TorchRL, its distribution and storage")
        from benchmarks.priorities import priorities_targets, run_priorities  # noqa: PLC0415

        result = run_priorities(quick, workdir)
        found = priorities_targets(result)
        return _document("priorities", settings, result, found)
    if suite == "images":
        say("[images] real frames: sizes, writes and sampling against TorchRL, S3")
        from benchmarks.images import images_targets, run_images  # noqa: PLC0415

        result = run_images(settings, quick, workdir, say)
        return _document("images", settings, result, images_targets(result))
    if suite == "lifecycle":
        say("[lifecycle] checkpoints by manifest: time, bytes, S3 requests, same draws")
        from benchmarks.lifecycle import lifecycle_targets, run_lifecycle  # noqa: PLC0415

        result = run_lifecycle(quick, workdir)
        return _document("lifecycle", settings, result, lifecycle_targets(result))
    raise ValueError(f"unknown suite {suite!r}; expected some of {list(SUITES)}")


def _sampling(
    names: Sequence[str],
    settings: Settings,
    batches: Mapping[str, int],
    quick: bool,
    workdir: str | None,
    say: Progress,
) -> dict[str, Any]:
    found, notes = workloads(names, batches, quick)
    results: dict[str, Any] = {}
    for workload in found:
        entry: dict[str, Any] = {"T": workload.T, "B": workload.B, "batch": workload.batch}
        entry["window"] = settings.window or workload.window
        entry["cache"] = settings.cache
        if "hot" in workload.modes:
            say(f"[{workload.name}] hot")
            entry["hot"] = run_hot(workload, settings)
        with tempfile.TemporaryDirectory(dir=workdir) as root:
            entry.update(run_disk(workload, settings, root, say))
        results[workload.name] = entry
    document = _document("sampling", settings, results, sampling_targets(results), notes)
    document["settings"]["workloads"] = list(names)
    return document


def _document(
    name: str,
    settings: Settings,
    results: dict[str, Any],
    found: list[dict[str, Any]],
    notes: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "benchmark": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(),
        "settings": dataclasses.asdict(settings),
        "results": results,
        "targets": found,
        "notes": notes or [],
    }


def save(document: dict[str, Any], out: Path, chart: bool) -> list[Path]:
    """Write ``document`` as ``<out>/<benchmark>.json`` (and, for sampling, its chart)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{document['benchmark']}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    written = [path]
    if chart and document["benchmark"] == "sampling" and document["results"]:
        plot(document, path.with_suffix(".png"))
        written.append(path.with_suffix(".png"))
    return written
