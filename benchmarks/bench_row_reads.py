"""Row reads from the zarr layout versus loading whole ``.pt`` trajectories.

Writes image trajectories (``T=32, B=16``, ``3x84x84`` uint8 ``curr_obs``/``next_obs`` plus
per-step scalars) to a local temporary store, then samples random flat rows and reads them:

* ``zarr``: :meth:`ZarrLayout.read_rows`, one call per touched trajectory (whole-chunk
  reads of the needed chunks, then one gather per key);
* ``zarr-orthogonal``: the alternative measured against it, one orthogonal selection of
  the distinct time steps per key;
* ``zarr-batched``: every touched trajectory's rows in one event-loop round (one ``sync``);
* ``pt``: the RLinf way, ``torch.load`` of each touched trajectory's ``.pt``, then
  ``index_select``.

It also records write MB/s, the compression ratio per key, and a codec comparison.  Run::

    .venv/bin/python benchmarks/bench_row_reads.py            # full (~1 min)
    .venv/bin/python benchmarks/bench_row_reads.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.core.sync import sync

from rbzarr.bench import image_trajectory
from rbzarr.storage.chunking import DEFAULT_CHUNK_BYTES, chunk_shape
from rbzarr.storage.location import Location
from rbzarr.storage.zarr_chunks import read_rows
from rbzarr.storage.zarr_layout import ZarrLayout
from rbzarr.trajectory import (
    Trajectory,
    flatten_trajectory,
    raw_time_rows,
    trajectory_from_raw,
    validate,
)

RESULTS = Path(__file__).parent / "results" / "row_reads.json"
T, B = 32, 16


def entry_of(tid: int, traj: Trajectory) -> dict[str, Any]:
    spec = validate(traj)
    return {
        "uuid": f"bench-{tid}",
        "trajectory_id": tid,
        "num_samples": spec.num_samples,
        "shape": list(spec.shape),
        "max_episode_length": traj.max_episode_length,
        "model_weights_id": traj.model_weights_id,
    }


def tree_bytes(path: str) -> int:
    """Bytes of chunk files below ``path`` (metadata documents excluded)."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
        if name != "zarr.json"
    )


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


# -- alternatives measured against ZarrLayout.read_rows ----------------------------------
async def _read_rows_orthogonal(array: Any, steps: torch.Tensor, envs: np.ndarray) -> np.ndarray:
    raw = raw_time_rows(steps, T, int(array.shape[0])).numpy()
    distinct, where = np.unique(raw, return_inverse=True)
    block = np.asarray(await array.get_orthogonal_selection((distinct,)))
    return np.ascontiguousarray(block[where, envs])


def read_orthogonal(layout: ZarrLayout, entry: Mapping[str, Any], rows: torch.Tensor, keys):
    opened = layout._open(entry)
    steps = torch.div(rows, B, rounding_mode="floor")
    envs = (rows % B).numpy()

    async def run() -> list[np.ndarray]:
        return list(
            await asyncio.gather(
                *(_read_rows_orthogonal(opened.arrays[k], steps, envs) for k in keys)
            )
        )

    return sync(run())


def read_batched(layout: ZarrLayout, groups: dict[int, torch.Tensor], entries, keys):
    opened = {tid: layout._open(entries[tid]) for tid in groups}

    async def run() -> list[Any]:
        jobs = []
        for tid, rows in groups.items():
            steps = torch.div(rows, B, rounding_mode="floor")
            envs = (rows % B).numpy()
            jobs += [read_rows(opened[tid].arrays[k], steps, envs, T) for k in keys]
        return list(await asyncio.gather(*jobs))

    return sync(run())


# -- benchmark sections -----------------------------------------------------------------
def bench_write(
    root: str, trajs: list[Trajectory], entries: list[dict[str, Any]], chunk_bytes: int
) -> dict:
    layout = ZarrLayout(Location.from_url(root), chunk_bytes=chunk_bytes)
    raw = sum(v.numel() * v.element_size() for t in trajs for v in t.tensors().values())
    start = time.perf_counter()
    for entry, traj in zip(entries, trajs, strict=True):
        layout.write(entry, traj)
    seconds = time.perf_counter() - start
    ratios = {}
    for key, value in trajs[0].tensors().items():
        stored = tree_bytes(os.path.join(root, "trajectories", "0", *key.split("/")))
        ratios[key] = round(value.numel() * value.element_size() / stored, 2)
    return {"raw_mb": raw / 1e6, "write_mb_s": raw / 1e6 / seconds, "ratio_per_key": ratios}


def bench_rows(root: str, pt_dir: str, entries, keys, batch: int, repeats: int) -> dict:
    layout = ZarrLayout(Location.from_url(root))
    generator = torch.Generator().manual_seed(batch)
    total = len(entries) * T * B
    flat = torch.randint(0, total, (batch,), generator=generator)
    groups = {
        tid: flat[flat // (T * B) == tid] % (T * B)
        for tid in torch.unique(flat // (T * B)).tolist()
    }
    one_row = layout.read_rows(entries[0], torch.tensor([0]), keys)
    row_bytes = sum(v.numel() * v.element_size() for v in one_row.values())

    def zarr_rows() -> None:
        for tid, rows in groups.items():
            layout.read_rows(entries[tid], rows, keys)

    def zarr_orthogonal() -> None:
        for tid, rows in groups.items():
            read_orthogonal(layout, entries[tid], rows, keys)

    def zarr_batched() -> None:
        read_batched(layout, groups, entries, keys)

    def pt_rows() -> None:
        for tid, rows in groups.items():
            data = torch.load(os.path.join(pt_dir, f"{tid}.pt"), weights_only=True)
            traj = trajectory_from_raw(data)
            flat_data = flatten_trajectory(traj, validate(traj))
            for k in keys:
                flat_data[k].index_select(0, rows)

    out: dict[str, Any] = {"batch": batch, "trajectories_touched": len(groups)}
    for name, fn in [
        ("zarr", zarr_rows),
        ("zarr-orthogonal", zarr_orthogonal),
        ("zarr-batched", zarr_batched),
        ("pt", pt_rows),
    ]:
        fn()  # warm: opens handles, fills the page cache
        seconds = best_of(repeats, fn)
        out[name] = {"rows_s": batch / seconds, "mb_s": batch * row_bytes / 1e6 / seconds}
    return out


def save_pt(pt_dir: str, trajs: list[Trajectory]) -> None:
    for tid, traj in enumerate(trajs):
        torch.save(traj.tensors(), os.path.join(pt_dir, f"{tid}.pt"))


def bench_codecs(frames: np.ndarray, floats: np.ndarray, repeats: int) -> list[dict]:
    candidates: dict[str, Any] = {
        "zstd-1": ZstdCodec(level=1),
        "zstd-3": ZstdCodec(level=3),
        "zstd-5": ZstdCodec(level=5),
        "blosc-lz4-shuffle": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
        "blosc-lz4-noshuffle": BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle"),
        "none": None,
    }
    results = []
    for data_name, data in [("uint8-image", frames), ("float32", floats)]:
        chunks = chunk_shape(data.shape, data.dtype.itemsize, DEFAULT_CHUNK_BYTES)
        for codec_name, codec in candidates.items():
            with tempfile.TemporaryDirectory() as folder:

                def write(
                    folder: str = folder, codec: Any = codec, data: Any = data, chunks: Any = chunks
                ) -> None:
                    zarr.create_array(
                        folder,
                        data=data,
                        chunks=chunks,
                        compressors=codec,
                        overwrite=True,
                    )

                write_s = best_of(repeats, write)
                read_s = best_of(repeats, lambda folder=folder: zarr.open_array(folder)[...])
                results.append(
                    {
                        "data": data_name,
                        "codec": codec_name,
                        "ratio": round(data.nbytes / tree_bytes(folder), 2),
                        "write_mb_s": round(data.nbytes / 1e6 / write_s),
                        "read_mb_s": round(data.nbytes / 1e6 / read_s),
                    }
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON results path (default: a new temporary directory; committed: {RESULTS})",
    )
    parser.add_argument(
        "--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="ZarrLayout chunk_bytes"
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="rbzarr-bench-")) / RESULTS.name
    count, batches, repeats = (2, [32, 128], 2) if args.quick else (8, [32, 256, 1024], 5)

    torch.manual_seed(0)
    trajs = [image_trajectory(seed, T, B) for seed in range(count)]
    entries = [entry_of(tid, traj) for tid, traj in enumerate(trajs)]
    keys = list(validate(trajs[0]).schema)
    results: dict[str, Any] = {
        "zarr_version": zarr.__version__,
        "torch_version": torch.__version__,
        "cpus": os.cpu_count(),
        "trajectories": count,
        "shape": [T, B],
        "chunk_bytes": args.chunk_bytes,
        "keys": keys,
    }
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as pt_dir:
        results["write"] = bench_write(root, trajs, entries, args.chunk_bytes)
        save_pt(pt_dir, trajs)
        results["row_reads"] = [
            bench_rows(root, pt_dir, entries, keys, batch, repeats) for batch in batches
        ]
    frames = trajs[0].curr_obs["image"].numpy()
    floats = np.cumsum(np.random.default_rng(0).normal(size=(T, B, 4096)), axis=0)
    results["codecs"] = bench_codecs(frames, floats.astype(np.float32), repeats)
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


def report(results: dict[str, Any]) -> None:
    write = results["write"]
    print(f"write: {write['raw_mb']:.0f} MB at {write['write_mb_s']:.0f} MB/s")
    print("compression ratio per key:", write["ratio_per_key"])
    methods = ["zarr", "zarr-orthogonal", "zarr-batched", "pt"]
    print(f"{'batch':>6} {'trajs':>5} " + " ".join(f"{m + ' rows/s':>18}" for m in methods))
    for row in results["row_reads"]:
        cells = " ".join(f"{row[m]['rows_s']:>18.0f}" for m in methods)
        print(f"{row['batch']:>6} {row['trajectories_touched']:>5} {cells}")
    print(f"{'data':<12} {'codec':<20} {'ratio':>6} {'write MB/s':>10} {'read MB/s':>10}")
    for row in results["codecs"]:
        print(
            f"{row['data']:<12} {row['codec']:<20} {row['ratio']:>6} "
            f"{row['write_mb_s']:>10} {row['read_mb_s']:>10}"
        )
    print(
        "median rows/s over batches:",
        {
            m: round(statistics.median(r[m]["rows_s"] for r in results["row_reads"]))
            for m in methods
        },
    )


if __name__ == "__main__":
    main()
