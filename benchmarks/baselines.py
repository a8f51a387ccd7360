"""What the buffer is measured against: physical limits and other ways to sample."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.accounting import ByteRange
from benchmarks.draws import DrawSequence
from benchmarks.measure import clone_trajectory, stats, timed
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, validate

__all__ = ["HotRun", "RangeReader", "draws", "hot_limit", "per_row_loop", "rlinf_hot"]

LIMIT_CAP_BYTES = 1 << 30  # the hot-limit tensor holds at most this much (well past any LLC)


@dataclass(frozen=True)
class HotRun:
    """How one hot sampler is timed: rows per batch, calls, time budget, seed, row bytes."""

    batch: int
    calls: int
    budget_s: float
    seed: int
    bytes_per_row: int

    def measure(self, sample: Callable[[], object]) -> dict[str, float]:
        """The figures of ``sample`` called up to ``calls`` times within the budget."""
        return stats(timed(sample, self.calls, self.budget_s), self.batch, self.bytes_per_row)


def hot_limit(rows: int, run: HotRun) -> dict[str, Any]:
    """One ``index_select`` of ``batch`` random rows of ``bytes_per_row`` from one tensor."""
    rows = min(rows, max(run.batch, LIMIT_CAP_BYTES // run.bytes_per_row))
    # Filled, so that every page is touched before the timing.
    table = torch.empty((rows, run.bytes_per_row), dtype=torch.uint8).fill_(7)
    generator = torch.Generator().manual_seed(run.seed)

    def gather() -> torch.Tensor:
        return table.index_select(0, torch.randint(0, rows, (run.batch,), generator=generator))

    return {**run.measure(gather), "table_rows": rows}


def draws(
    trajectories: Sequence[Trajectory], batch: int, seed: int
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The buffer's draws over ``trajectories`` (its window), call after call, from ``seed``."""
    sequence = DrawSequence([validate(t).num_samples for t in trajectories], batch, seed)
    calls = itertools.count()
    return lambda: sequence.at(next(calls))


def rlinf_hot(trajectories: Sequence[Trajectory], run: HotRun) -> dict[str, Any]:
    """Whole trajectories kept as they came; flatten and index each touched one per batch."""
    kept = [clone_trajectory(t) for t in trajectories]
    next_draw = draws(kept, run.batch, run.seed)

    def sample() -> dict[str, torch.Tensor]:
        positions, rows = next_draw()
        parts: dict[str, list[torch.Tensor]] = {}
        order = []
        for position in torch.unique(positions).tolist():
            where = (positions == position).nonzero().squeeze(1)
            flat = flatten_trajectory(kept[position], validate(kept[position]))
            for key, value in flat.items():
                parts.setdefault(key, []).append(value.index_select(0, rows[where]))
            order.append(where)
        inverse = torch.argsort(torch.cat(order))
        return {key: torch.cat(values)[inverse] for key, values in parts.items()}

    return run.measure(sample)


def per_row_loop(trajectories: Sequence[Trajectory], run: HotRun) -> dict[str, Any]:
    """Index every sampled row of every key separately in Python, then stack."""
    flats = [flatten_trajectory(t, validate(t)) for t in map(clone_trajectory, trajectories)]
    next_draw = draws(trajectories, run.batch, run.seed)
    keys = list(flats[0])

    def sample() -> dict[str, torch.Tensor]:
        positions, rows = next_draw()
        pairs = list(zip(positions.tolist(), rows.tolist(), strict=True))
        return {key: torch.stack([flats[p][key][r] for p, r in pairs]) for key in keys}

    return run.measure(sample)


class RangeReader:
    """``os.pread`` of byte ranges of the files below ``root``, descriptors kept open."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._descriptors: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)

    def _descriptor(self, key: str) -> int:
        found = self._descriptors.get(key)
        if found is None:
            found = self._descriptors[key] = os.open(os.path.join(self.root, key), os.O_RDONLY)
        return found

    def read(self, ranges: Sequence[ByteRange]) -> int:
        """Read every ``(key, start, stop)`` range concurrently; return the bytes read."""
        jobs = [(self._descriptor(key), start, stop) for key, start, stop in ranges]
        return sum(self._pool.map(lambda job: len(os.pread(job[0], job[2] - job[1], job[1])), jobs))

    def close(self) -> None:
        """Close the descriptors and the thread pool."""
        self._pool.shutdown()
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()
