"""A whole benchmark run: each suite's results as one JSON-ready document."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.disk import run_disk
from benchmarks.hot import run_hot
from benchmarks.measure import machine, versions
from benchmarks.report import plot
from benchmarks.settings import Settings
from benchmarks.targets import sampling_targets
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


@dataclasses.dataclass(frozen=True)
class _Suite:
    """A suite other than sampling: its progress line, its run and targets functions
    (``module:name`` in ``benchmarks``), the run's arguments, in order, among ``settings``,
    ``quick``, ``workdir`` and ``say``, and whether its figures are of the image workload."""

    says: str
    run: str
    targets: str
    takes: tuple[str, ...] = ("quick", "workdir")
    one_workload: bool = False


_SUITES = {
    "datasets": _Suite(
        "LeRobot round trips and a 1,000-episode import",
        "datasets_roundtrip:run_datasets",
        "datasets_roundtrip:datasets_targets",
    ),
    "s3": _Suite(
        "sampling through the proxy",
        "s3:run_s3",
        "targets:s3_targets",
        ("settings", "quick"),
        one_workload=True,
    ),
    "training": _Suite(
        "a training loop, local and S3, with and without prefetch",
        "training:run_training",
        "targets:training_targets",
        ("settings", "quick", "workdir"),
        one_workload=True,
    ),
    "sequences": _Suite(
        "sequences, samples per insert, demo mixing",
        "sequences:run_sequences",
        "sequences:sequence_targets",
        ("settings", "quick", "workdir"),
    ),
    "distributed": _Suite(
        "many writers, notices, add by reference, Ray actors",
        "distributed:run_distributed",
        "distributed:distributed_targets",
        ("quick",),
    ),
    "scale": _Suite(
        "tiny commits, resume and open of a large store, durable, S3",
        "scale:run_scale",
        "scale:scale_targets",
    ),
    "priorities": _Suite(
        "prioritized replay vs TorchRL, its distribution and storage",
        "priorities:run_priorities",
        "priorities:priorities_targets",
    ),
    "images": _Suite(
        "real frames: sizes, writes and sampling against TorchRL, S3",
        "images:run_images",
        "images:images_targets",
        ("settings", "quick", "workdir", "say"),
    ),
    "lifecycle": _Suite(
        "checkpoints by manifest: time, bytes, S3 requests, same draws",
        "lifecycle:run_lifecycle",
        "lifecycle:lifecycle_targets",
    ),
}


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
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected some of {list(SUITES)}")
    spec = _SUITES[suite]
    say(f"[{suite}] {spec.says}")
    given = {"settings": settings, "quick": quick, "workdir": workdir, "say": say}
    result = _function(spec.run)(*(given[name] for name in spec.takes))
    measured = {"image": result} if spec.one_workload else result
    return _document(suite, settings, measured, _function(spec.targets)(result))


def _function(path: str) -> Callable[..., Any]:
    """The function ``module:name`` (imported when its suite runs: some need extras)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(f"benchmarks.{module}"), name)


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
