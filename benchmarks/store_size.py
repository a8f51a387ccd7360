"""What a store holds on disk: allocated and apparent bytes, against the raw bytes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.measure import nbytes
from rbzarr.trajectory.model import Trajectory, validate

__all__ = ["disk_usage"]


def disk_usage(root: str, trajectories: Sequence[Trajectory], fmt: str) -> dict[str, Any]:
    """Bytes on disk (allocated blocks of every file of the store, and their sizes), per sample, the
    compression ratio, and (zarr) the ratio per key.
    """
    samples = sum(validate(t).num_samples for t in trajectories)
    raw = nbytes(v for t in trajectories for v in t.tensors().values())
    files = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
    allocated = sum(f.stat().st_blocks * 512 for f in files)
    apparent = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {
        "files": len(files),
        "raw_bytes": raw,
        "allocated_bytes": allocated,
        "apparent_bytes": apparent,
        "allocated_vs_raw": allocated / raw,
        "bytes_per_sample": apparent / samples,
        "ratio": raw / apparent,
    }
    if fmt == "zarr":
        out["ratio_per_key"] = {
            key: _ratio(trajectories, key, root) for key in trajectories[0].tensors()
        }
    return out


def _ratio(trajectories: Sequence[Trajectory], key: str, root: str) -> float:
    """Raw bytes of ``key`` over its shards' bytes, in the trajectories' groups and packs."""
    stored = sum(
        f.stat().st_size
        for folder in ("trajectories", "packs")
        for f in Path(root, folder).glob(f"*/{key}/**/*")
        if f.is_file() and f.name != "zarr.json"
    )
    raw = nbytes(t.tensors()[key] for t in trajectories)
    return raw / stored
