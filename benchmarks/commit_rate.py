"""Tiny-trajectory commits per second against the floor of their files, in a few seconds.

The ``scale`` suite's ``commits`` figure (T=4, B=2, three keys, one add at a time, flush
every 50) without the rest of the suite, beside its floor, in alternating rounds (ABBA):

* rbzarr: a new ``auto_save`` buffer (window 100, cache 5) adds ``--warm`` trajectories,
  flushes, then the clock runs over ``--trajectories`` more (add + commit; the
  trajectories are made before it starts);
* floor: the same folders and files one such trajectory's own group holds (learnt from a
  store rbzarr wrote with packs off: ``pack_bytes=0``), created with bare ``os`` calls
  (``mkdir``, ``open``, ``write``, ``close``, and the ``rename`` of the commit marker) for
  as many trajectories.  rbzarr packs the trajectories queued between two flushes
  (:mod:`rbzarr.storage.zarr.packs`), so it may run above this floor.

Each round reports wall and CPU microseconds per trajectory, user and system apart (this
process only: on a shared host the system time is the kernel's inode allocation, which the
floor pays too), and the load average; the ratio is the median of the per-round ratios.
``--state`` adds the ``images`` suite's state-row writes against TorchRL's
``LazyMemmapStorage.extend`` (every shape, both modes; needs ``torchrl``).

    .venv/bin/python -m benchmarks.commit_rate --rounds 6 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.images import state_writes
from benchmarks.limits import (
    alternate,
    clock,
    floor_commits,
    group_shape,
    paired_ratio,
    per_trajectory,
    retire,
    spread,
)
from benchmarks.scale import FLUSH_EVERY, WINDOW, tiny
from rbzarr import TrajectoryReplayBuffer

__all__ = ["main", "measure_commits"]


def rbzarr_commits(
    store: Path, warm: int, count: int, pack_bytes: int | None = None
) -> dict[str, float]:
    """Per-trajectory figures of ``count`` commits after ``warm`` (the ``scale`` loop);
    ``pack_bytes``: the zarr layout's option (``None``: its default)."""
    options = {} if pack_bytes is None else {"layout_options": {"pack_bytes": pack_bytes}}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, sample_window_size=WINDOW, cache_size=5, **options
    ) as buffer:
        for i in range(warm):
            buffer.add_trajectories([tiny(i)])
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                buffer.flush()
        made = [tiny(i) for i in range(warm, warm + count)]  # not the figure: made first
        buffer.flush()
        start = clock()
        for i, trajectory in enumerate(made, warm):
            buffer.add_trajectories([trajectory])
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                buffer.flush()
        buffer.flush()
        return per_trajectory(start, count)


def measure_commits(workdir: str, warm: int, count: int, rounds: int) -> dict[str, Any]:
    """Alternating rounds of rbzarr's commits and their floor (see the module docs)."""
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rbzarr-commit-rate-", dir=workdir) as work:
        root = Path(work)
        probe = root / "probe"
        rbzarr_commits(probe, 0, 2, pack_bytes=0)
        shape = group_shape(probe)
        retire(probe)
        runs: dict[str, list[dict[str, float]]] = {"rbzarr": [], "floor": []}

        def side(name: str) -> Any:
            def run() -> float:
                target = root / f"{name}-{len(runs[name])}"
                loads.append(os.getloadavg()[0])
                if name == "rbzarr":
                    found = rbzarr_commits(target, warm, count)
                else:
                    found = floor_commits(target, shape, count)
                runs[name].append(found)
                retire(target)
                return found["per_s"]

            return run

        ours, floor = alternate([side("rbzarr"), side("floor")], rounds)
    figures = {
        name: {
            field: spread([run[field] for run in found])
            for field in ("per_s", "wall_us", "user_us", "system_us")
        }
        for name, found in runs.items()
    }
    return {
        "trajectories": count,
        "warm": warm,
        "group": {"folders": len(shape[0]) + 1, "files": len(shape[1])},
        **figures,
        "ratio_to_floor": paired_ratio(ours, floor),
        "load_1min": spread(loads),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print (or write) the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--warm", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--state", action="store_true", help="add the state-row writes")
    parser.add_argument("--state-repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.gettempdir()
    found: dict[str, Any] = {
        "commits": measure_commits(workdir, args.warm, args.trajectories, args.rounds)
    }
    if args.state:
        found["state_writes"] = state_writes(args.state_repeats, workdir)
    found["cores"] = os.cpu_count()
    text = json.dumps(found, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
