"""What ``rbzarr show``, ``stats`` and ``report`` cost on photo stores (issues 48 and 44).

    python -m benchmarks.pictures [--work DIR] [--report-trajectories 36] [--runs 5]
                                  [--out benchmarks/results]

* ``show``: one 224x224 trajectory (T=20, B=8, two cameras and a state in curr_obs and
  next_obs, RLinf-shaped) as MP4, GIF, WebP and PNG, each a fresh ``rbzarr`` process
  (wall and CPU seconds, interpreter start included), ``--runs`` times per format, the
  formats taken in turn; min, median and max, with the load average around them;
* bytes ``show`` reads against the bytes its rows need (the chunks of the shown env
  column's frames and signals, :class:`~benchmarks.accounting.StoreGeometry`): locally what
  the layout's reads ask for (:class:`~benchmarks.accounting.CountingByteSource`), on S3
  (moto) every byte the server sends, JSON documents included (:class:`S3Proxy`);
* ``report`` of a store of ``--report-trajectories`` such trajectories (36: about 1 GB on
  disk), 20 episodes embedded: wall seconds and page size;
* ``stats`` of that store (image keys from a sample of their frames), ``--runs`` times,
  its output piped as a script would read it.

Prints one JSON document (with the targets); with ``--out``, also writes it as
``<out>/pictures.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fsspec

from benchmarks.accounting import CountingByteSource, StoreGeometry
from benchmarks.frames import SOURCES, rollout, to_trajectory
from benchmarks.measure import machine, versions
from benchmarks.report import target
from benchmarks.s3_server import S3Proxy, create_bucket, s3_storage_options, start_moto
from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.frames import image_keys, trajectory_steps
from rbzarr.analysis.view import open_buffer

T, B, ENV = 20, 8, 3
SHOWN = ["rewards", "dones", "curr_obs/main_images", "curr_obs/wrist_images"]
FORMATS = ("mp4", "gif", "webp", "png")


def write_store(url: str, count: int, storage_options: dict[str, Any] | None = None) -> None:
    """``count`` photo trajectories (224x224, lossless) written one by one to ``url``."""
    source = SOURCES["photos224"]
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=storage_options
    ) as buffer:
        for arrays in rollout(source.scenes(B, seed=0), count, T, B, seed=0):
            buffer.add_trajectories([to_trajectory(arrays, T)])


def _run(*args: str) -> dict[str, Any]:
    """Wall and CPU seconds (user + system, every thread) of one ``rbzarr`` process (its
    output piped), and whether it imported torch: on a shared host the CPU seconds are
    what an idle machine's wall time would be."""
    probe = (
        "import runpy, sys; sys.argv = ['rbzarr', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('rbzarr', run_name='__main__')\n"
        "finally:\n    sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}\\n')"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    torch_imported = "torch imported: True" in done.stderr
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "torch": torch_imported}


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Min, median and max of the runs' wall and CPU seconds."""
    out: dict[str, Any] = {"runs": len(runs), "torch_imported": any(r["torch"] for r in runs)}
    for key in ("wall_s", "cpu_s"):
        values = [r[key] for r in runs]
        out[key] = {
            "min": min(values),
            "median": round(statistics.median(values), 3),
            "max": max(values),
        }
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _needed(fs: Any, root: str) -> int:
    """Bytes of the chunks that env ``ENV``'s rows of :data:`SHOWN` need in trajectory 0."""
    geometry = StoreGeometry(fs, root, SHOWN, T, B)
    return geometry.needed({0: [t * B + ENV for t in range(T)]}).bytes


def measure_show(work: Path, runs: int) -> dict[str, Any]:
    """Seconds per format (``runs`` each, formats in turn) and bytes read, on one trajectory."""
    store = work / "show-store"
    write_store(str(store), 1)
    found: dict[str, list[dict[str, Any]]] = {suffix: [] for suffix in FORMATS}
    load_before = _load()
    for _ in range(runs):
        for suffix in FORMATS:
            out = str(work / f"t.{suffix}")
            found[suffix].append(_run("show", str(store), "0", "--env", str(ENV), "-o", out))
    seconds = {suffix: _spread(found[suffix]) for suffix in FORMATS}
    seconds["load_average"] = {"before": load_before, "after": _load()}
    counting = CountingByteSource()
    view = open_buffer(store, layout_options={"zarr": {"byte_source": counting, "range_gap": 0}})
    trajectory_steps(view, 0, ENV, image_keys(view))
    needed = _needed(fsspec.filesystem("file"), str(store))
    return {
        "seconds": seconds,
        "local_bytes_read": counting.bytes,
        "needed_bytes": needed,
        "local_ratio": round(counting.bytes / needed, 3),
        **measure_s3(),
    }


def measure_s3() -> dict[str, Any]:
    """Bytes the S3 server sends for ``show``'s reads, against what its rows need."""
    server, endpoint = start_moto()
    proxy = S3Proxy(endpoint)
    try:
        create_bucket(endpoint, "pictures")
        direct = s3_storage_options(endpoint)
        write_store("s3://pictures/store", 1, direct)
        view = open_buffer(
            "s3://pictures/store",
            s3_storage_options(proxy.endpoint_url),
            layout_options={"zarr": {"range_gap": 0}},
        )
        proxy.reset_log()
        trajectory_steps(view, 0, ENV, image_keys(view))
        sent, requests = proxy.bytes_to_client, len(proxy.requests)
        needed = _needed(fsspec.filesystem("s3", **direct), "pictures/store")
    finally:
        proxy.close()
        server.stop()
    return {
        "s3_bytes_sent": sent,
        "s3_requests": requests,
        "s3_ratio": round(sent / needed, 3),
    }


def measure_report(work: Path, count: int, runs: int) -> dict[str, Any]:
    """Seconds and page bytes of ``rbzarr report``, and seconds of ``rbzarr stats`` (``runs``
    times), on a store of ``count`` trajectories."""
    store = work / "report-store"
    write_store(str(store), count)
    disk = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    page = work / "report.html"
    seconds = _run("report", str(store), "-o", str(page))
    load_before = _load()
    stats = _spread([_run("stats", str(store)) for _ in range(runs)])
    stats["load_average"] = {"before": load_before, "after": _load()}
    return {
        "trajectories": count,
        "store_bytes": disk,
        **seconds,
        "page_bytes": page.stat().st_size,
        "stats": stats,
    }


def pictures_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 48's targets, and issue 44's for ``stats``, on these results."""
    show, report = results["show"], results["report"]
    slowest = max(FORMATS, key=lambda suffix: show["seconds"][suffix]["wall_s"]["median"])
    return [
        target(
            "rbzarr show of one 224x224 trajectory (T=20, B=8), local: wall s",
            f"median of {show['seconds'][slowest]['runs']} fresh processes, the slowest "
            f"format's ({slowest}), interpreter start included",
            show["seconds"][slowest]["wall_s"]["median"],
            2.0,
            "<=",
        ),
        target(
            "bytes read by show vs the rows it shows, local",
            "bytes the layout's reads ask for / the shown rows' chunks",
            show["local_ratio"],
            1.5,
            "<=",
        ),
        target(
            "bytes read by show vs the rows it shows, S3",
            "bytes the server sends (JSON documents included) / the shown rows' chunks",
            show["s3_ratio"],
            1.5,
            "<=",
        ),
        target(
            "rbzarr report of a ~1 GB photo store, 20 episodes embedded: wall s",
            f"one process, a store of {report['store_bytes'] / 1e9:.2f} GB",
            report["wall_s"],
            30.0,
            "<=",
        ),
        target(
            "rbzarr report page MB", "the page's bytes / 1e6", report["page_bytes"] / 1e6, 50, "<="
        ),
        target(
            "rbzarr stats of a ~1 GB image store: wall s",
            f"median of {report['stats']['runs']} fresh processes, output piped, a store of "
            f"{report['store_bytes'] / 1e9:.2f} GB",
            report["stats"]["wall_s"]["median"],
            4.0,
            "<=",
        ),
    ]


def pictures_notes(results: dict[str, Any]) -> list[str]:
    """What a reader needs to weigh the wall times: the load around them and the CPU."""
    show, stats = results["show"]["seconds"], results["report"]["stats"]
    loads = [
        x
        for where in (show["load_average"], stats["load_average"])
        for x in where["before"] + where["after"]
    ]
    cpu = [show[suffix]["cpu_s"]["median"] for suffix in FORMATS]
    imported = [s for s in FORMATS if show[s]["torch_imported"]] + (
        ["stats"] if stats["torch_imported"] else []
    )
    return [
        f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores during the "
        "timed runs: CPU seconds (user + system, every thread) are what a quiet host's wall "
        f"would be: show {min(cpu):.2f}-{max(cpu):.2f} s per process (medians by format), "
        f"stats {stats['cpu_s']['median']:.2f} s",
        "show and stats processes that imported torch: "
        + (", ".join(imported) if imported else "none"),
    ]


def main() -> None:
    """Measure, print the results document, and with ``--out`` write it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--report-trajectories", type=int, default=36)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        results = {"show": measure_show(Path(work), args.runs)}
        results["report"] = measure_report(Path(work), args.report_trajectories, args.runs)
    document = {
        "benchmark": "pictures",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(),
        "settings": {
            "T": T,
            "B": B,
            "env": ENV,
            "runs": args.runs,
            "report_trajectories": args.report_trajectories,
        },
        "results": results,
        "targets": pictures_targets(results),
        "notes": pictures_notes(results),
    }
    text = json.dumps(document, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pictures.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
