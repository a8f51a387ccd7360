"""Byte accounting: what a store holds on disk and what a batch needs to read.

"Needed" bytes are recomputed from the seeded draw, not observed: the buffer's window is the
last ``window`` ids, its cache the last ``cache`` ones, and every ``sample`` is one draw.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import zarr
from zarr.storage import LocalStore

from rbzarr.bench.baselines import draws
from rbzarr.bench.measure import nbytes
from rbzarr.trajectory import Trajectory, raw_time_rows, validate

__all__ = ["disk_usage", "needed_bytes"]


def disk_usage(root: str, trajectories: Sequence[Trajectory], fmt: str) -> dict[str, Any]:
    """Bytes on disk per sample, the compression ratio, and (zarr) the ratio per key."""
    samples = sum(validate(t).num_samples for t in trajectories)
    if fmt != "zarr":
        stored = sum(f.stat().st_size for f in Path(root).glob("trajectory_*.pt"))
        return {"bytes_per_sample": stored / samples, "ratio": _ratio(trajectories, None, stored)}
    ratios, total = {}, 0
    for key in trajectories[0].tensors():
        stored = sum(
            f.stat().st_size
            for f in Path(root, "trajectories").glob(f"*/{key}/c/**/*")
            if f.is_file()
        )
        total += stored
        ratios[key] = _ratio(trajectories, key, stored)
    return {
        "bytes_per_sample": total / samples,
        "ratio": _ratio(trajectories, None, total),
        "ratio_per_key": ratios,
    }


def _ratio(trajectories: Sequence[Trajectory], key: str | None, stored: int) -> float:
    raw = nbytes(v for t in trajectories for k, v in t.tensors().items() if key in (None, k))
    return raw / stored


def needed_bytes(
    root: str,
    trajectories: Sequence[Trajectory],
    window: int,
    cache: int,
    batch: int,
    seed: int,
    fmt: str,
    calls: int,
) -> list[int]:
    """Per timed batch, the compressed bytes its missed rows need: the chunks holding them
    (zarr) or the whole files of the missed trajectories (pt)."""
    ids = list(range(len(trajectories)))
    in_window = ids[-window:] if window > 0 else ids
    cached = set(ids[-cache:])
    next_draw = draws([trajectories[i] for i in in_window], batch, seed)
    files = {
        int(f.name.split("_")[1]): f.stat().st_size for f in Path(root).glob("trajectory_*.pt")
    }
    arrays = _chunk_geometry(root, trajectories[0]) if fmt == "zarr" else {}
    B = validate(trajectories[0]).B
    T = validate(trajectories[0]).T
    out = []
    # One warm-up call precedes the ``calls`` timed ones; counting starts after it.
    for positions, rows in [next_draw() for _ in range(calls + 1)][1:]:
        missed: dict[int, list[int]] = {}
        for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
            if in_window[position] not in cached:
                missed.setdefault(in_window[position], []).append(row)
        if fmt != "zarr":
            out.append(sum(files[tid] for tid in missed))
            continue
        total = 0
        for tid, flat_rows in missed.items():
            steps = torch.tensor(flat_rows) // B
            for key, (length, k, suffix) in arrays.items():
                for chunk in torch.unique(raw_time_rows(steps, T, length) // k).tolist():
                    total += os.path.getsize(
                        os.path.join(root, "trajectories", str(tid), key, f"c/{chunk}{suffix}")
                    )
        out.append(total)
    return out


def _chunk_geometry(root: str, trajectory: Trajectory) -> dict[str, tuple[int, int, str]]:
    """Per sampled key: raw row count, chunk length along time, chunk-key suffix."""
    out = {}
    for key in validate(trajectory).schema:
        array = zarr.open_array(
            store=LocalStore(root, read_only=True), path=f"trajectories/0/{key}"
        )
        out[key] = (int(array.shape[0]), int(array.chunks[0]), "/0" * (array.ndim - 1))
    return out
