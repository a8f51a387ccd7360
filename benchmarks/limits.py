"""Physical limits of a write, timed beside the writers they bound, and the spread of runs.

* :func:`write_files`: ``write()`` of the given arrays' bytes into fresh files, one file per
  array, under a new folder (no sync: the bytes end in the page cache, as every writer's
  do), on one thread or several;
* :func:`copy_arrays`: one ``numpy`` copy of each array into new memory (a ``memcpy``);
* :func:`encode_frames`: a codec's own encoder on frames, on every core (a thread pool;
  imagecodecs releases the GIL);
* :func:`floor_commits`: the folders and files of a trajectory group (:func:`group_shape`,
  learnt from a store rbzarr wrote) created with bare ``os`` calls, as many times as
  trajectories: what any writer of that layout pays, timed with :func:`clock` and
  reported by :func:`per_trajectory`;
* :func:`floor_tree`: the same for a whole store's trajectory data (its trajectory groups
  and packs, :func:`tree_shape`), made once;
* :func:`spread`: min / median / max of runs; :func:`paired_ratio`: the median of the
  per-round ratios of two sides timed in the same rounds;
* :func:`retire`: a round's store moved aside, not removed, until its run's folder goes;
* :func:`settle_memory`: run before each side of a write comparison (:func:`alternate`'s
  ``before``), so every side starts from the same memory;
* :func:`collect_own_garbage`: the last step of a side timed in milliseconds, so each side
  pays for the collection of the cyclic garbage it made, and no other side does.

Why rounds do not remove their stores: on an ext4 without a journal (this host's), each new
inode skips every inode of its group freed in the last 60 s (360 s while their table block
is dirty), reading each one's table entry to check.  Removing a round's store (thousands of
files) before the next round made that round's creates pay a scan that grows with the files
just removed: 9 us per create after a quiet minute, 175 us after a removal, measured with
``perf`` in ``recently_deleted`` and ``find_get_block_common``.  That is the harness's
cost, not a writer's, and it falls hardest on the side that creates the most files.

Why each side of a write comparison starts with :func:`settle_memory`: this host is a VM
that hands memory freed for a few seconds back to its host (free page reporting of 2 MiB
blocks, ``/sys/module/page_reporting/parameters/page_reporting_order`` 9), and the first
touch of such a page costs the host's fault: 256 MiB written into fresh files took 3 s of
kernel time (~100 MB/s) once the page cache had been dropped 20 s before, and 0.06 s
(~4.5 GB/s) while the memory freed was still recent.  Which case a side met depended on what
its neighbour in the round had just freed, not on the side: rbzarr's raw writes and TorchRL's
``LazyMemmapStorage.extend`` of the same ``mujoco128`` rows, paired alone, ran 1.1-1.6x
apart both cold, and 2.0-2.7x apart (10-16 against 5-7 thousand rows/s) each after 2 GiB
had been touched and freed, while among the suite's nine sides the memory-freeing codec
sides before TorchRL's gave it warm pages that the raw side did not get.  A side that
starts after :func:`settle_memory` finds that many bytes recently freed, whatever ran
before it: the steady state of a trainer's machine, whose memory is reused, not new.

Why a short side ends with :func:`collect_own_garbage`: in one process, Python's collector
runs when allocations pass its threshold and frees the young cyclic garbage whoever made it.
``LazyMemmapStorage.extend`` of 16 small trajectories leaves cyclic garbage (memory-mapped
tensors among it: ~170 objects per collection); the buffer's store made right after it, 7 ms
in all, paid 0.8-1.3 ms for one young collection freeing them (4.6 ms once, for an older
one), and the state-row ratio went by the order of the round: 1.05-1.10 where the buffer
ran first, 0.80-0.88 where it ran after TorchRL.  Ending each side with a collection of the
two young generations, on its own clock, charges each side its own garbage.
"""

from __future__ import annotations

import gc
import mmap
import os
import resource
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rbzarr.storage.zarr.codecs import parse_codec

__all__ = [
    "SETTLE_BYTES",
    "alternate",
    "clock",
    "copy_arrays",
    "encode_frames",
    "floor_commits",
    "floor_tree",
    "group_shape",
    "paired_ratio",
    "per_trajectory",
    "retire",
    "settle_memory",
    "spread",
    "tree_shape",
    "write_files",
]


# Memory a write comparison touches and frees before each side: twice the side's raw bytes,
# at most this (see the module docs).
SETTLE_BYTES = 2 << 30


def write_files(arrays: Sequence[np.ndarray], folder: Path, threads: int = 1) -> float:
    """Seconds to ``write()`` each array's bytes into its own new file under ``folder``
    (created; retired after the clock stops), on ``threads`` threads (the arrays dealt out
    in turn)."""
    folder.mkdir(parents=True)

    def write(first: int) -> None:
        for i in range(first, len(arrays), threads):
            with open(folder / f"{i}.bin", "wb", buffering=0) as handle:
                view = memoryview(np.ascontiguousarray(arrays[i])).cast("B")
                while view:
                    view = view[handle.write(view) :]

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            start = time.perf_counter()
            for _ in pool.map(write, range(threads)):
                pass
            return time.perf_counter() - start
    finally:
        retire(folder)


def retire(path: str | os.PathLike[str]) -> None:
    """Move ``path`` into a ``.retired`` folder beside it, freeing its name; the folder that
    holds both removes it at its run's end (see the module docs)."""
    source = Path(path)
    if not source.exists():
        return
    aside = source.parent / ".retired"
    aside.mkdir(exist_ok=True)
    source.rename(aside / f"{source.name}-{uuid.uuid4().hex}")


def copy_arrays(arrays: Sequence[np.ndarray]) -> float:
    """Seconds to copy each array into new memory (``numpy.copy``: a ``memcpy``)."""
    start = time.perf_counter()
    copies = [np.copy(array) for array in arrays]
    seconds = time.perf_counter() - start
    del copies
    return seconds


def encode_frames(frames: Sequence[np.ndarray], spec: str) -> float:
    """Seconds for codec ``spec``'s own encoder to encode every ``[H, W, C]`` frame, on as
    many threads as there are cores."""
    codec = parse_codec(spec)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        codec.encode_frame(frames[0])  # the codec's first call (its import) off the clock
        start = time.perf_counter()
        for _ in pool.map(codec.encode_frame, frames, chunksize=16):
            pass
        return time.perf_counter() - start


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Min, median and max of ``values``, and the values themselves."""
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "runs": list(values),
    }


def paired_ratio(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, Any]:
    """The spread of ``ours[i] / theirs[i]`` (two sides timed in the same round ``i``)."""
    return spread([mine / peer for mine, peer in zip(ours, theirs, strict=True)])


def alternate(
    sides: Sequence[Callable[[], float]],
    rounds: int,
    before: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Each side's result in ``rounds`` rounds, the order reversed every other round (ABBA);
    ``before`` runs ahead of each side, off its clock."""
    found: list[list[float]] = [[] for _ in sides]
    for round_ in range(rounds):
        order = range(len(sides)) if round_ % 2 == 0 else range(len(sides) - 1, -1, -1)
        for i in order:
            if before is not None:
                before()
            found[i].append(sides[i]())
    return found


def collect_own_garbage() -> None:
    """Collect the two young generations: a timed side's last step (see the module docs)."""
    gc.collect(1)


def settle_memory(nbytes: int) -> None:
    """Touch ``nbytes`` of new anonymous memory (a byte per page), then free it: allocations
    made right after find that much memory recently freed (see the module docs)."""
    block = mmap.mmap(-1, nbytes)
    try:
        pages = np.frombuffer(block, dtype=np.uint8)
        pages[:: mmap.PAGESIZE] = 1
        del pages
    finally:
        block.close()


def clock() -> tuple[float, float, float]:
    """Now: the wall clock, and this process's user and system CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime, usage.ru_stime


def per_trajectory(start: tuple[float, float, float], count: int) -> dict[str, float]:
    """Per-trajectory rate and microseconds (wall, user, system) of ``count`` since ``start``."""
    end = clock()
    wall, user, system = (1e6 * (b - a) / count for a, b in zip(start, end, strict=True))
    return {"per_s": 1e6 / wall, "wall_us": wall, "user_us": user, "system_us": system}


def group_shape(store: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The folders and the files (with their sizes) of the trajectory group in ``store``
    holding the most files (an array of fill values has none), relative to the group,
    parents first."""
    groups = [p for p in (store / "trajectories").iterdir() if p.is_dir()]
    group = max(sorted(groups), key=lambda p: sum(len(files) for *_, files in os.walk(p)))
    folders, files = [], []
    for root, names, leaves in os.walk(group):
        base = Path(root).relative_to(group)
        folders += [str(base / name) for name in sorted(names)]
        files += [(str(base / leaf), (Path(root) / leaf).stat().st_size) for leaf in leaves]
    return folders, files


def tree_shape(store: Path, folders: Sequence[str]) -> tuple[list[str], list[tuple[str, int]]]:
    """The folders and the files (with their sizes) below ``folders`` of ``store`` (those
    that exist), relative to ``store``, parents first."""
    found_folders, files = [], []
    for top in folders:
        if not (store / top).is_dir():
            continue
        found_folders.append(top)
        for root, names, leaves in os.walk(store / top):
            base = Path(root).relative_to(store)
            found_folders += [str(base / name) for name in sorted(names)]
            files += [(str(base / leaf), (Path(root) / leaf).stat().st_size) for leaf in leaves]
    return found_folders, files


def floor_tree(folder: Path, shape: tuple[list[str], list[tuple[str, int]]]) -> float:
    """Seconds to create ``shape`` (:func:`tree_shape`) under the new ``folder`` with bare
    ``os`` calls, each ``zarr.json`` written under a temporary name and renamed (a marker)."""
    folders, files = shape
    payload = {name: b"\0" * size for name, size in files}
    folder.mkdir(parents=True)
    start = time.perf_counter()
    for name in folders:
        os.mkdir(f"{folder}/{name}")
    for name, data in payload.items():
        final = f"{folder}/{name}"
        path = f"{final}.tmp-{uuid.uuid4().hex}" if name.endswith("zarr.json") else final
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.write(handle, data)
        os.close(handle)
        if path != final:
            os.replace(path, final)
    return time.perf_counter() - start


def floor_commits(
    folder: Path, shape: tuple[list[str], list[tuple[str, int]]], count: int
) -> dict[str, float]:
    """Per-trajectory figures of creating ``shape`` ``count`` times with bare ``os`` calls
    (the marker, ``zarr.json``, written under a temporary name and renamed last)."""
    folders, files = shape
    payload = {name: b"\0" * size for name, size in files}
    (folder / "trajectories").mkdir(parents=True)
    start = clock()
    for i in range(count):
        group = f"{folder}/trajectories/{i}"
        os.mkdir(group)
        for name in folders:
            os.mkdir(f"{group}/{name}")
        for name, data in payload.items():
            final = f"{group}/{name}"
            path = f"{final}.tmp-{uuid.uuid4().hex}" if name == "zarr.json" else final
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.write(handle, data)
            os.close(handle)
            if path != final:
                os.replace(path, final)
    return per_trajectory(start, count)
