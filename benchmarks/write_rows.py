"""Rows/s written: rbzarr's buffer (``auto_save``, zarr) against TorchRL's ``LazyMemmapStorage``.

Both write the same rows into fresh directories on the same disk, one after the other,
``--repeats`` times (each run a new store; the median is reported):

* rbzarr: ``TrajectoryReplayBuffer(auto_save=True, trajectory_format="zarr")``, then
  ``add_trajectories(trajectories)`` and ``flush()`` (every trajectory committed);
* TorchRL: ``ReplayBuffer(storage=LazyMemmapStorage(rows)).extend(TensorDict(rows))`` per
  trajectory, its ``[T, B, ...]`` fields viewed as ``[T * B, ...]`` rows; timed twice: the
  first pass (the files created, every page new, as when a run fills its buffer) and a
  second one over the same storage (pages mapped, as when a full buffer wraps around).

Beside them, in the same rounds (the order of the sides reversed every other round), the
limits (:mod:`benchmarks.limits`): ``write()`` of the same bytes into fresh files and a
``memcpy`` of them.  Each side keeps its runs, min and max; the ratios are medians of the
per-round ratios.

rbzarr's clock starts with the buffer open and its store created (one trajectory written
before); every trajectory it writes is new files.  The ratio printed is rbzarr's rows/s
over each of TorchRL's.

Neither syncs to disk (both leave the bytes in the page cache).  Workloads: ``state``
(``[T=256, B=16]``, a 64-d float32 observation before and after each step, 7-d actions,
rewards, dones) and ``image`` (``[T=64, B=8]``, ``3x84x84`` uint8 frames before and after
each step, 7-d actions, rewards, dones).  Frames are smooth noise (they compress, as real
ones do, but more).  ``tiny`` is the fixed cost of one small trajectory: ms per
``ZarrLayout.write`` of a ``T=4, B=2`` trajectory (three keys) on a local store, plain and
on a durable location, with its files, folders and bytes on disk.

    .venv/bin/python -m benchmarks.write_rows                # every workload, 3 repeats
    .venv/bin/python -m benchmarks.write_rows --workloads image --repeats 5 --json out.json

Needs ``torchrl`` and ``tensordict`` (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.limits import (
    SETTLE_BYTES,
    copy_arrays,
    paired_ratio,
    retire,
    settle_memory,
    spread,
    write_files,
)
from rbzarr import Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.model import validate
from rbzarr.trajectory.validated import ValidatedTrajectory

WORKLOADS: dict[str, dict[str, Any]] = {
    "state": {"T": 256, "B": 16, "count": 8, "obs": (64,), "dtype": torch.float32},
    "image": {"T": 64, "B": 8, "count": 8, "obs": (3, 84, 84), "dtype": torch.uint8},
}


def make_trajectories(name: str, seed: int = 0) -> list[Trajectory]:
    """The workload's trajectories (deterministic)."""
    spec = WORKLOADS[name]
    T, B, obs = spec["T"], spec["B"], spec["obs"]
    generator = torch.Generator().manual_seed(seed)
    trajectories = []
    for _ in range(spec["count"]):
        if spec["dtype"] == torch.uint8:
            base = torch.randint(0, 200, (1, B, *obs), generator=generator, dtype=torch.int16)
            steps = torch.randint(-2, 3, (T + 1, B, *obs), generator=generator, dtype=torch.int16)
            frames = (base + steps.cumsum(0)).clamp(0, 255).to(torch.uint8)
        else:
            frames = torch.cumsum(0.05 * torch.randn(T + 1, B, *obs, generator=generator), 0)
        trajectories.append(
            Trajectory(
                max_episode_length=T,
                actions=torch.randn(T, B, 7, generator=generator),
                rewards=torch.randn(T, B, 1, generator=generator),
                dones=torch.rand(T, B, 1, generator=generator) < 0.01,
                curr_obs={"obs": frames[:T].clone()},
                next_obs={"obs": frames[1:].clone()},
            )
        )
    return trajectories


def write_rbzarr(
    root: str, trajectories: list[Trajectory], options: dict[str, Any]
) -> tuple[float, float]:
    """Seconds (wall, CPU) to add and commit ``trajectories`` into an open buffer whose zarr
    store at ``root`` holds one trajectory already (written before the clock starts)."""
    # Raw rows against TorchRL's raw rows: image-like keys would default to "lossless".
    options = {"layout_options": {"codecs": {"default": "raw"}}, **options}
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=root,
        trajectory_format="zarr",
        max_pending_writes=len(trajectories) + 1,
        **options,
    )
    try:
        buffer.add_trajectories(trajectories[:1])
        buffer.flush()
        start = _now()
        buffer.add_trajectories(trajectories)
        buffer.flush()
        return _since(start)
    finally:
        buffer.close()


def write_torchrl(
    root: str, trajectories: list[Trajectory]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Seconds (wall, CPU) to extend a new ``LazyMemmapStorage`` at ``root`` by the same rows:
    the first pass (files created, every page new) and a second one over it (pages mapped)."""
    from tensordict import TensorDict  # noqa: PLC0415  (optional dependency)
    from torchrl.data import LazyMemmapStorage, ReplayBuffer  # noqa: PLC0415

    rows = sum(rows_of(trajectory) for trajectory in trajectories)
    buffer = ReplayBuffer(storage=LazyMemmapStorage(rows, scratch_dir=root))

    def extend() -> tuple[float, float]:
        start = _now()
        for trajectory in trajectories:
            count = rows_of(trajectory)
            nested: dict[str, Any] = {}
            for key, value in trajectory.tensors().items():
                *parents, leaf = key.split("/")
                target = nested
                for parent in parents:
                    target = target.setdefault(parent, {})
                target[leaf] = value.reshape(count, *value.shape[2:])
            buffer.extend(TensorDict(nested, batch_size=[count]))
        return _since(start)

    return extend(), extend()


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    """Wall and process CPU seconds (every thread's) since ``start``."""
    return time.perf_counter() - start[0], time.process_time() - start[1]


def rows_of(trajectory: Trajectory) -> int:
    """``T * B`` of a trajectory."""
    assert trajectory.rewards is not None
    return int(trajectory.rewards.shape[0] * trajectory.rewards.shape[1])


def disk_bytes(root: str) -> tuple[int, int]:
    """(bytes allocated on disk, as ``du`` counts them; files) below ``root``."""
    du = subprocess.run(["du", "-sk", root], capture_output=True, text=True, check=True)
    files = sum(len(names) for _, _, names in os.walk(root))
    return int(du.stdout.split()[0]) * 1024, files


def measure(name: str, repeats: int, workdir: str, options: dict[str, Any]) -> dict[str, Any]:
    """Median rows/s of both writers on one workload, and their stores' size."""
    trajectories = make_trajectories(name)
    rows = sum(rows_of(t) for t in trajectories)
    raw = sum(v.numel() * v.element_size() for t in trajectories for v in t.tensors().values())
    runs: dict[str, list[tuple[float, float]]] = {
        "rbzarr": [],
        "torchrl_first": [],
        "torchrl_again": [],
    }
    arrays = [v.numpy() for t in trajectories for v in t.tensors().values()]
    limits: dict[str, list[float]] = {"write": [], "memcpy": []}
    sizes: dict[str, tuple[int, int]] = {}
    writers = ("rbzarr", "torchrl", "write", "memcpy")
    for repeat in range(repeats):
        # The order alternates (ABBA): a shared machine's noise falls on every side alike.
        for writer in writers if repeat % 2 == 0 else writers[::-1]:
            settle_memory(min(2 * raw, SETTLE_BYTES))  # the same memory for every side
            root = os.path.join(workdir, f"{name}-{writer}-{repeat}")
            if writer == "write":
                limits["write"].append(rows / write_files(arrays, Path(root)))
                continue
            if writer == "memcpy":
                limits["memcpy"].append(rows / copy_arrays(arrays))
                continue
            if writer == "rbzarr":
                runs["rbzarr"].append(write_rbzarr(root, trajectories, options))
            else:
                first, again = write_torchrl(root, trajectories)
                runs["torchrl_first"].append(first)
                runs["torchrl_again"].append(again)
            sizes[writer] = disk_bytes(root)
            retire(root)
    # rbzarr's store also holds the trajectory written before its clock started.
    written = {"rbzarr": raw + raw // len(trajectories), "torchrl": raw}
    result: dict[str, Any] = {"rows": rows, "raw_bytes": raw}
    for writer, seconds in runs.items():
        owner = writer.split("_")[0]
        disk, files = sizes[owner]
        rates = [rows / wall for wall, _ in seconds]
        result[writer] = {
            "rows_per_s": statistics.median(rates),
            "rows_per_cpu_s": statistics.median(rows / cpu for _, cpu in seconds),
            "runs": rates,
            "min": min(rates),
            "max": max(rates),
            "mb_per_s": statistics.median(rates) * raw / rows / 1e6,
            "disk_bytes": disk,
            "disk_vs_raw": disk / written[owner],
            "files": files,
        }
    for limit, rates in limits.items():
        result[f"limit_{limit}"] = {"rows_per_s": spread(rates)}
    ours = result["rbzarr"]["runs"]
    # Medians of the per-round ratios (the sides of one round ran back to back).
    for peer in ("torchrl_first", "torchrl_again"):
        paired = paired_ratio(ours, result[peer]["runs"])
        result[f"ratio_{peer.split('_')[1]}"] = paired["median"]
        result[f"ratio_{peer.split('_')[1]}_spread"] = paired
    for limit, rates in limits.items():
        result[f"ratio_vs_{limit}_limit"] = paired_ratio(ours, rates)
    cpu = result["rbzarr"]["rows_per_cpu_s"]
    result["cpu_ratio_first"] = cpu / result["torchrl_first"]["rows_per_cpu_s"]
    result["cpu_ratio_again"] = cpu / result["torchrl_again"]["rows_per_cpu_s"]
    return result


def tiny_writes(workdir: str, count: int, batches: int, durable: bool) -> dict[str, float]:
    """ms per tiny trajectory (``T=4, B=2``: rewards, 7-d actions, dones) in
    ``ZarrLayout.write`` on a local store: wall and process CPU, the best of ``batches``
    batches of ``count`` (a shared machine's bursts left out), and files per trajectory."""
    trajectory = Trajectory(
        max_episode_length=4,
        rewards=torch.randn(4, 2, 1),
        actions=torch.randn(4, 2, 7),
        dones=torch.zeros(4, 2, 1, dtype=torch.bool),
    )
    validated = ValidatedTrajectory.check(trajectory)
    spec = validate(trajectory)
    root = os.path.join(workdir, f"tiny-{'durable' if durable else 'plain'}")
    layout = ZarrLayout(Location.from_url(root).with_durable(durable))

    def entry(tid: int) -> dict[str, Any]:
        return {
            "uuid": f"{tid:032x}",
            "trajectory_id": tid,
            "num_samples": spec.num_samples,
            "shape": list(spec.shape),
            "max_episode_length": 4,
            "model_weights_id": "",
        }

    layout.write(entry(0), validated)  # the store's own groups
    walls, cpus = [], []
    for batch in range(batches):
        entries = [entry(1 + batch * count + i) for i in range(count)]
        start = _now()
        for one in entries:
            layout.write(one, validated)
        wall, cpu = _since(start)
        walls.append(wall / count * 1e3)
        cpus.append(cpu / count * 1e3)
    group = os.path.join(root, "trajectories", "1")
    files = sum(len(names) for _, _, names in os.walk(group))
    folders = sum(len(names) for _, names, _ in os.walk(group)) + 1
    disk, _ = disk_bytes(os.path.join(root, "trajectories"))
    retire(root)
    return {
        "wall_ms": min(walls),
        "wall_ms_median": statistics.median(walls),
        "cpu_ms": min(cpus),
        "files": files,
        "folders": folders,
        "disk_kib_per_trajectory": disk / 1024 / (1 + batches * count),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one line per workload (and the JSON, when asked)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workloads", nargs="+", default=[*WORKLOADS, "tiny"], choices=[*WORKLOADS, "tiny"]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the stores go (a new temp dir)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--layout-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a zarr layout option for rbzarr's buffer, e.g. chunk_bytes=1048576",
    )
    parser.add_argument(
        "--buffer-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a TrajectoryReplayBuffer argument, e.g. cache_size=0",
    )
    args = parser.parse_args(argv)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    options: dict[str, Any] = {k: json.loads(v) for k, v in _pairs(args.buffer_option)}
    if args.layout_option:
        layout = {k: json.loads(v) for k, v in _pairs(args.layout_option)}
        options["layout_options"] = layout
    workdir = tempfile.mkdtemp(prefix="rbzarr-write-rows-", dir=args.workdir)
    results = {}
    try:
        for name in args.workloads:
            if name == "tiny":
                for durable in (False, True):
                    tiny = results[f"tiny_durable_{durable}"] = tiny_writes(
                        workdir, 200, 5, durable
                    )
                    print(
                        f"tiny ({'durable' if durable else 'plain'}): ZarrLayout.write "
                        f"{tiny['wall_ms']:.3f} ms wall (median {tiny['wall_ms_median']:.3f}), "
                        f"{tiny['cpu_ms']:.3f} ms CPU per trajectory; {tiny['files']} files, "
                        f"{tiny['folders']} folders, "
                        f"{tiny['disk_kib_per_trajectory']:.1f} KiB on disk each"
                    )
                continue
            result = results[name] = measure(name, args.repeats, workdir, options)
            ours, first, again = (result[k] for k in ("rbzarr", "torchrl_first", "torchrl_again"))
            print(
                f"{name}: {result['rows']} rows, {result['raw_bytes'] / 1e6:.1f} MB raw | "
                f"rbzarr {ours['rows_per_s'] / 1e3:,.0f}k rows/s ({ours['mb_per_s']:,.0f} MB/s, "
                f"disk {ours['disk_vs_raw']:.2f}x raw, {ours['files']} files) | TorchRL "
                f"first pass {first['rows_per_s'] / 1e3:,.0f}k rows/s, again "
                f"{again['rows_per_s'] / 1e3:,.0f}k rows/s (disk {first['disk_vs_raw']:.2f}x raw)"
                f" | ratio {result['ratio_first']:.2f}x / {result['ratio_again']:.2f}x"
                f" | vs write() {result['ratio_vs_write_limit']['median']:.2f}x"
                f" (per CPU second {result['cpu_ratio_first']:.2f}x / "
                f"{result['cpu_ratio_again']:.2f}x)"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


def _pairs(options: list[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` arguments as pairs."""
    return [(key, value) for key, _, value in (option.partition("=") for option in options)]


if __name__ == "__main__":
    sys.exit(main())
