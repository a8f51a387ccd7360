"""The ``images`` suite: camera frames on disk and through ``sample``, against TorchRL and LeRobot.

Frames are real (:mod:`benchmarks.frames`: MuJoCo renders at 128 and 224 px, photographs
seen by a camera moving by sub-pixel steps), in RLinf-shaped trajectories (``T=20, B=8``,
two cameras and a state in ``curr_obs`` and ``next_obs``, auto-reset dones).  Per source:

* ``sizes``: each codec spec written into its own local store by an ``auto_save`` buffer
  (``default``: no codec option at all, what a user gets; ``raw`` and the others asked for
  the image keys); the image keys' bytes on disk (every file under their folders) against
  their raw bytes (curr + next), files and folders per trajectory, rows/s of the writes
  (buffer creation to ``flush``), the frames read back (lossless: bit-identical; lossy:
  PSNR, and the PSNR the store recorded where it records one).
* ``writes``: rows/s of the raw, default (and ``jpeg:95``) stores written again, of
  TorchRL's ``LazyMemmapStorage`` and ``CompressedListStorage`` created and extended by the
  same rows (one ``extend`` per trajectory, ``[T*B]`` rows), and of the limits: ``write()``
  of the same bytes into fresh files (on one thread, and on every core: rbzarr writes a
  group's large files side by side), a ``memcpy`` of them and the JPEG encoder on the same
  frames on every core (:mod:`benchmarks.limits`); every side once per round, in ABBA
  order, each after :func:`~benchmarks.limits.settle_memory` of twice the rows' bytes; min
  / median / max per side and the median of the per-round ratios.
* ``sampling``: ``sample(256)`` of the default and the raw store (each reopened with
  ``auto_save`` to it, cache off: every row is read from the store, page cache warm;
  :func:`store_reader`), TorchRL's ``storage.get`` of the same rows (the buffer's draws
  replayed) and its ``ReplayBuffer.sample(256)`` (random rows), on both ``LazyMemmapStorage`` and
  ``CompressedListStorage`` (rows with flat keys: it compresses every frame), timed
  interleaved; a target's peer is the faster of a storage's two paths.
* ``lerobot`` (``mujoco128`` only, not in ``--quick``): random-access frames/s of LeRobot's
  own ``LeRobotDataset`` on a video dataset of the same frames (:mod:`benchmarks.lerobot_peer`:
  ``dataset[i]``, random ``i``, uint8 frames), against ``sample(256)`` of the default store
  (frames: the two ``curr_obs`` cameras of each row; ``next_obs`` comes free).

Across sources: ``state_writes`` (state rows over a grid of shapes, store creation included,
against ``LazyMemmapStorage`` and the layout's floor: the same trajectory groups and packs
made with bare ``os`` calls; run first, before any source's stores are removed, each side
ending with a collection of its own garbage, :func:`benchmarks.limits.collect_own_garbage`)
and ``s3`` (the default store on moto behind the proxy, read
through the local shard cache: bytes downloaded against bytes stored).

Run: ``python -m benchmarks --suites images [--quick]``.  Rendered frames are cached under
``<workdir>/rbzarr-bench-frames`` (the system's temporary directory by default).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.draws import DrawSequence, gather_rows, same_rows
from benchmarks.frames import SOURCES, FrameSource, image_keys, load_trajectories
from benchmarks.lerobot_peer import measure_lerobot
from benchmarks.limits import (
    SETTLE_BYTES,
    alternate,
    collect_own_garbage,
    copy_arrays,
    encode_frames,
    floor_tree,
    paired_ratio,
    retire,
    settle_memory,
    spread,
    tree_shape,
    write_files,
)
from benchmarks.measure import interleaved, nbytes, stats
from benchmarks.report import target
from benchmarks.settings import Settings
from benchmarks.torchrl_peer import TorchRLPeer, torchrl_missing
from rbzarr import RbzarrError, Trajectory, TrajectoryReplayBuffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr.layout import TRAJECTORIES, ZarrLayout
from rbzarr.storage.zarr.packs import PACKS
from rbzarr.trajectory import tree
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["images_targets", "run_images", "store_reader"]

Say = Callable[[str], None]
FULL = {"count": 8, "T": 20, "B": 8, "batch": 256, "calls": 20, "repeats": 3, "state_rounds": 7}
# Fewer trajectories of the slowest source to render (about 2 minutes each on 2 busy cores).
FULL_COUNTS = {"mujoco224": 4}
QUICK = {"count": 2, "T": 6, "B": 2, "batch": 16, "calls": 3, "repeats": 1, "state_rounds": 1}
# The codecs asked for on the image keys, beside the default (no option) and raw.
SPECS = ("lossless", "zstd", "jpeg:95")
LOSSY = ("jpeg",)
JPEG = "jpeg:95"
# Write ratios of the targets: (the buffer's side, the peer's or the limit's).
WRITE_RATIOS = (
    ("rbzarr raw", "LazyMemmapStorage.extend"),
    ("rbzarr raw", "limit: write() into fresh files"),
    ("rbzarr raw", "limit: write() into fresh files, every core"),
    ("rbzarr raw", "limit: memcpy"),
    ("rbzarr default", "CompressedListStorage.extend"),
    (f"rbzarr {JPEG}", f"{JPEG} encoder, every core"),
)
# State-row writes: (T, B, floats of obs), each as one add of many and many adds of one.
STATE_SHAPES = ((4, 2, 8), (16, 8, 32), (64, 32, 64))
STATE_TRAJECTORIES = 16
# The source LeRobot's video dataset is made of (encoding video is slow: one source).
LEROBOT_SOURCE = "mujoco128"


def run_images(settings: Settings, quick: bool, workdir: str | None, say: Say) -> dict[str, Any]:
    """Every source's figures, the state-row writes and the S3 cache (see the module docs)."""
    size = QUICK if quick else FULL
    cache = Path(workdir or tempfile.gettempdir()) / "rbzarr-bench-frames"
    codec_api = codecs_missing(workdir)
    results: dict[str, Any] = {
        "shape": {key: size[key] for key in ("count", "T", "B", "batch")},
        "codec_api": codec_api or "available",
        "sources": {},
    }
    # First, on a disk no round of this run has removed files from yet: each source's
    # stores are removed when it ends, and for minutes after, every new inode pays a scan of
    # those freed (benchmarks.limits), most on the side making the most folders.
    say("[images] state-row writes across shapes")
    # Each round of a state shape takes milliseconds: more rounds, a steadier median.
    results["state_writes"] = state_writes(size["state_rounds"], workdir)
    default_stores: dict[str, list[Trajectory]] = {}
    for source in SOURCES.values():
        missing = source.missing()
        if missing:
            results["sources"][source.name] = {"unavailable": missing}
            continue
        count = size["count"] if quick else FULL_COUNTS.get(source.name, size["count"])
        trajectories = load_trajectories(source, count, size["T"], size["B"], cache, say)
        with tempfile.TemporaryDirectory(prefix="rbzarr-images-", dir=workdir) as root:
            results["sources"][source.name] = _source(
                source, trajectories, settings, size, codec_api, Path(root), say
            )
        default_stores[source.name] = trajectories
        if source.name == LEROBOT_SOURCE:
            results["lerobot"] = _lerobot(
                trajectories, results["sources"][source.name], cache, quick, settings.seed
            )
    first = next(iter(default_stores.values()), None)
    if first is None:
        results["s3"] = {"unavailable": "no frame source is installed"}
    else:
        say("[images] S3 through the local cache")
        try:
            results["s3"] = _s3(settings, first)
        except RbzarrError as exc:  # reported as the figure's reason, the run goes on
            results["s3"] = {"unavailable": f"the S3 run failed: {type(exc).__name__}: {exc}"}
    return results


def _lerobot(
    trajectories: list[Trajectory], entry: dict[str, Any], cache: Path, quick: bool, seed: int
) -> dict[str, Any]:
    """LeRobot's random reads of the same frames against ``sample`` of the default store."""
    if quick:
        return {"unavailable": "not run in --quick (LeRobot encodes video: minutes)"}
    sampled = entry.get("sampling", {}).get("rbzarr default")
    if sampled is None:
        return {"unavailable": "rbzarr's sampling was not measured (TorchRL missing)"}
    shape = "-".join(str(d) for d in trajectories[0].tensors()["curr_obs/main_images"].shape)
    found = measure_lerobot(trajectories, cache / f"lerobot-{len(trajectories)}-{shape}", 300, seed)
    if "unavailable" in found:
        return found
    ours = 2 * sampled["rows_s"]  # the two curr_obs cameras of each row
    return {"rbzarr_frames_s": ours, "lerobot": found, "ratio": ours / found["frames_s"]}


def codecs_missing(workdir: str | None) -> str | None:
    """``None`` when the zarr layout takes codec specs (``layout_options={"codecs": ...}``)."""
    frames = torch.zeros(2, 1, 8, 8, 3, dtype=torch.uint8)
    trajectory = Trajectory(
        rewards=torch.zeros(2, 1), curr_obs={"image": frames}, next_obs={"image": frames}
    )
    spec = validate(trajectory)
    entry = {
        "uuid": f"{1:032x}",
        "trajectory_id": 0,
        "num_samples": spec.num_samples,
        "shape": list(spec.shape),
        "max_episode_length": 0,
        "model_weights_id": "",
    }
    with tempfile.TemporaryDirectory(prefix="rbzarr-codec-probe-", dir=workdir) as root:
        try:
            layout = ZarrLayout(Location.from_url(root), codecs={"default": "lossless"})
            layout.write(entry, ValidatedTrajectory.check(trajectory))
        except Exception as exc:  # any refusal means: not in this build
            return f"codec specs are not supported by this build ({type(exc).__name__}: {exc})"
    return None


def _buffer(
    root: str | Path, window: int, codecs: Mapping[str, Any] | None, seed: int = 0
) -> TrajectoryReplayBuffer:
    """An ``auto_save`` zarr buffer at ``root``; its cache off (every sample reads the store)."""
    options: dict[str, Any] = {}
    if codecs is not None:
        options["layout_options"] = {"codecs": dict(codecs)}
    return TrajectoryReplayBuffer(
        seed=seed,
        auto_save=True,
        auto_save_path=str(root),
        trajectory_format="zarr",
        sample_window_size=window,
        enable_cache=False,
        cache_size=0,
        max_pending_writes=window + 1,
        **options,
    )


def store_reader(root: Path, window: int, seed: int) -> TrajectoryReplayBuffer:
    """A buffer sampling the store at ``root`` from the store itself: ``auto_save`` to it,
    its cache off and the store's own checkpoint loaded (a buffer without ``auto_save``
    would load every trajectory into memory: its cache is its storage)."""
    buffer = _buffer(root, window, None, seed)
    try:
        buffer.load_checkpoint(str(root))
    except BaseException:
        buffer.close()
        raise
    return buffer


def _codecs_for(spec: str, codec_api: str | None) -> dict[str, str] | None:
    """The codec option of ``spec``: none for ``default``, the image keys' spec otherwise."""
    if spec == "default":
        return None
    if spec == "raw" and codec_api:
        return None  # before codec specs, no option is raw
    return {key: spec for key in image_keys()}


def _source(
    source: FrameSource,
    trajectories: list[Trajectory],
    settings: Settings,
    size: dict[str, int],
    codec_api: str | None,
    root: Path,
    say: Say,
) -> dict[str, Any]:
    keys = image_keys()
    raw_bytes = nbytes(t.tensors()[key] for t in trajectories for key in keys)
    entry: dict[str, Any] = {
        "frames": f"{source.kind}: {source.detail}, {source.size}x{source.size}",
        "trajectories": len(trajectories),
        "raw_image_bytes": raw_bytes,
        "next_equal_rows": _next_equal(trajectories),
        "sizes": {},
    }
    specs = ["raw", "default", *([] if codec_api else SPECS)]
    for spec in specs:
        say(f"[images] {source.name}: write and read back {spec}")
        store = root / spec.replace(":", "-")
        entry["sizes"][spec] = _sizes(
            store, trajectories, spec, codec_api, raw_bytes, settings.seed
        )
        if spec not in ("raw", "default"):
            retire(store)
    missing = torchrl_missing()
    if missing:
        entry["writes"] = entry["sampling"] = {"unavailable": missing}
        return entry
    say(f"[images] {source.name}: writes against TorchRL and the limits, alternating")
    entry["writes"] = _writes(trajectories, root, size["repeats"], codec_api)
    say(f"[images] {source.name}: sampling")
    entry["sampling"] = _sampling(trajectories, settings, size, root)
    return entry


def _next_equal(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Rows whose ``next_obs`` frames equal the following ``curr_obs`` frames, of all rows."""
    equal = total = 0
    for trajectory in trajectories:
        tensors = trajectory.tensors()
        curr, after = tensors["curr_obs/main_images"], tensors["next_obs/main_images"]
        equal += int((after[:-1] == curr[1:]).flatten(2).all(-1).sum())
        total += after.shape[0] * after.shape[1]
    return {"equal": equal, "rows": total}


def _sizes(
    store: Path,
    trajectories: list[Trajectory],
    spec: str,
    codec_api: str | None,
    raw_bytes: int,
    seed: int,
) -> dict[str, Any]:
    """Write ``trajectories`` with ``spec``; bytes, files, write rate and what reads back.

    The store's checkpoint keeps the writer's generator (seeded ``seed``, never drawn from),
    so a buffer that loads it draws as :class:`DrawSequence` does.
    """
    rows = sum(validate(t).num_samples for t in trajectories)
    buffer, seconds = _written(store, trajectories, _codecs_for(spec, codec_api), seed)
    with buffer:
        ids = buffer.trajectory_ids
        fidelity = _fidelity(buffer, ids, trajectories, spec)
    image_bytes, files, folders = _footprint(store / "trajectories", ids)
    return {
        "image_bytes": image_bytes,
        "vs_raw": image_bytes / raw_bytes,
        "store_bytes": _bytes_under(store),
        "files_per_trajectory": files,
        "folders_per_trajectory": folders,
        "write_rows_s": rows / seconds,
        "write_mb_s": nbytes(v for t in trajectories for v in t.tensors().values()) / seconds / 1e6,
        **fidelity,
    }


def _written(
    store: Path, trajectories: list[Trajectory], codecs: Mapping[str, Any] | None, seed: int
) -> tuple[TrajectoryReplayBuffer, float]:
    """A new buffer at ``store`` that wrote ``trajectories``, and the seconds from its creation
    until ``flush`` returned."""
    start = time.perf_counter()
    buffer = _buffer(store, len(trajectories), codecs, seed)
    try:
        buffer.add_trajectories(trajectories)
        buffer.flush()
    except BaseException:
        buffer.close()
        raise
    return buffer, time.perf_counter() - start


def _fidelity(
    buffer: TrajectoryReplayBuffer, ids: Sequence[int], originals: Sequence[Trajectory], spec: str
) -> dict[str, Any]:
    """Lossless: whether every frame reads back bit-identical; lossy: PSNR of the frames read."""
    squared = frames = 0.0
    worst = math.inf
    identical = True
    for trajectory_id, original in zip(ids, originals, strict=True):
        stored = buffer.trajectory(trajectory_id).tensors()
        for key in image_keys():
            expected = original.tensors()[key]
            got = stored[key]
            identical = identical and torch.equal(got, expected)
            error = (got.double() - expected.double()).square().flatten(2).mean(-1)
            squared += float(error.sum())
            frames += error.numel()
            worst = min(worst, _psnr(float(error.max())))
    if not spec.startswith(LOSSY):
        return {"identical": identical}
    return {"psnr_db": _psnr(squared / frames), "psnr_worst_frame_db": worst}


def _psnr(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _footprint(folder: Path, ids: Sequence[int]) -> tuple[int, float, float]:
    """Bytes on disk of the image keys' folders; files and folders per trajectory."""
    leaves = {key.rsplit("/", 1)[1] for key in image_keys()}
    image_bytes = files = folders = 0
    for trajectory_id in ids:
        group = folder / str(trajectory_id)
        for here, _, found in os.walk(group):
            folders += 1
            files += len(found)
            if leaves & set(Path(here).relative_to(group).parts):
                image_bytes += sum((Path(here) / name).stat().st_size for name in found)
    return image_bytes, files / len(ids), folders / len(ids)


def _bytes_under(folder: Path) -> int:
    return sum(
        (Path(here) / name).stat().st_size for here, _, names in os.walk(folder) for name in names
    )


def _flats(trajectories: Sequence[Trajectory]) -> list[dict[str, torch.Tensor]]:
    return [flatten_trajectory(t, validate(t)) for t in trajectories]


def _writes(
    trajectories: list[Trajectory], root: Path, repeats: int, codec_api: str | None
) -> dict[str, Any]:
    """rows/s of the buffer's writes, TorchRL's storages created and extended by the same rows
    (one ``extend`` per trajectory), and the limits: ``write()`` of the same bytes into fresh
    files, a ``memcpy`` of them, and the JPEG encoder on the same frames on every core; every
    side once per round, ``repeats`` rounds in ABBA order."""
    flats = _flats(trajectories)
    rows = sum(len(next(iter(flat.values()))) for flat in flats)
    arrays = [value.numpy() for t in trajectories for value in t.tensors().values()]
    frames = [frame for t in trajectories for key in image_keys() for frame in _frames(t, key)]
    made = iter(range(1 << 30))

    def rbzarr(spec: str) -> Callable[[], float]:
        def write() -> float:
            store = root / f"writes-{next(made)}"
            buffer, seconds = _written(store, trajectories, _codecs_for(spec, codec_api), 0)
            buffer.close()
            retire(store)
            return rows / seconds

        return write

    def torchrl(kind: str) -> Callable[[], float]:
        def extend() -> float:
            scratch = root / f"writes-{next(made)}"
            start = time.perf_counter()
            TorchRLPeer(flats, str(scratch) if kind == "LazyMemmapStorage" else None, kind)
            seconds = time.perf_counter() - start
            retire(scratch)
            return rows / seconds

        return extend

    sides: dict[str, Callable[[], float]] = {
        "rbzarr raw": rbzarr("raw"),
        "rbzarr default": rbzarr("default"),
        "LazyMemmapStorage.extend": torchrl("LazyMemmapStorage"),
        "CompressedListStorage.extend": torchrl("CompressedListStorage"),
        "limit: write() into fresh files": lambda: (
            rows / write_files(arrays, root / f"writes-{next(made)}")
        ),
        "limit: write() into fresh files, every core": lambda: (
            rows / write_files(arrays, root / f"writes-{next(made)}", os.cpu_count() or 1)
        ),
        "limit: memcpy": lambda: rows / copy_arrays(arrays),
    }
    for kind in ("LazyMemmapStorage", "CompressedListStorage"):  # TorchRL's first use, untimed
        scratch = root / f"writes-{next(made)}"
        TorchRLPeer([{k: v[:1] for k, v in flats[0].items()}], str(scratch), kind)
        retire(scratch)
    if codec_api is None:
        sides[f"rbzarr {JPEG}"] = rbzarr(JPEG)
        sides[f"{JPEG} encoder, every core"] = lambda: rows / encode_frames(frames, JPEG)
    raw_bytes = nbytes(torch.from_numpy(a) for a in arrays)
    settle = min(2 * raw_bytes, SETTLE_BYTES)
    found = alternate(list(sides.values()), repeats, before=lambda: settle_memory(settle))
    out: dict[str, Any] = {
        "rows": rows,
        "settled_bytes": settle,
        "raw_bytes": raw_bytes,
        "rounds": repeats,
        "rows_s": {name: spread(rates) for name, rates in zip(sides, found, strict=True)},
    }
    rates = dict(zip(sides, found, strict=True))
    out["ratios"] = {
        f"{ours} / {theirs}": paired_ratio(rates[ours], rates[theirs])
        for ours, theirs in WRITE_RATIOS
        if ours in rates and theirs in rates
    }
    return out


def _frames(trajectory: Trajectory, key: str) -> list[Any]:
    """The ``[H, W, C]`` frames of one key of a trajectory."""
    return list(trajectory.tensors()[key].flatten(0, 1).numpy())


def _sampling(
    trajectories: list[Trajectory], settings: Settings, size: dict[str, int], root: Path
) -> dict[str, Any]:
    """``sample(batch)`` of the default and raw stores against TorchRL's ``get`` of those rows."""
    batch, count = size["batch"], len(trajectories)
    flats = _flats(trajectories)
    counts = [validate(t).num_samples for t in trajectories]
    per_row = sum(t[0].numel() * t.element_size() for t in flats[0].values())
    draws = DrawSequence(counts, batch, settings.seed)
    buffers = {name: store_reader(root / name, count, settings.seed) for name in ("default", "raw")}
    peers = {
        "LazyMemmapStorage": TorchRLPeer(flats, str(root / "torchrl-memmap")),
        "CompressedListStorage": TorchRLPeer(flats, None, "CompressedListStorage"),
    }
    try:
        first = tree.flatten(buffers["default"].sample(batch))
        expected = gather_rows(flats, *draws.at(0))
        checked = {"default": same_rows(first, expected)}
        checked["raw"] = same_rows(tree.flatten(buffers["raw"].sample(batch)), expected)
        for kind, peer in peers.items():
            checked[kind] = same_rows(peer.get(peer.indices(*draws.at(0))), expected)
        calls = [1] * 4  # the next draw of each side
        sides: dict[str, Callable[[], object]] = {
            "rbzarr default": lambda: buffers["default"].sample(batch),
            "rbzarr raw": lambda: buffers["raw"].sample(batch),
            "LazyMemmapStorage.get": _replay(peers["LazyMemmapStorage"], draws, calls, 2),
            "CompressedListStorage.get": _replay(peers["CompressedListStorage"], draws, calls, 3),
            "LazyMemmapStorage ReplayBuffer.sample": lambda: peers["LazyMemmapStorage"].sample(
                batch
            ),
            "CompressedListStorage ReplayBuffer.sample": lambda: peers[
                "CompressedListStorage"
            ].sample(batch),
        }
        latencies = interleaved(list(sides.values()), size["calls"], settings.budget_s, rounds=5)
    finally:
        for buffer in buffers.values():
            buffer.close()
    out: dict[str, Any] = {"same_rows": checked, "batch": batch}
    for name, found in zip(sides, latencies, strict=True):
        out[name] = stats(found, batch, per_row)
    return out


def _replay(
    peer: TorchRLPeer, draws: DrawSequence, calls: list[int], side: int
) -> Callable[[], Any]:
    """A peer's ``get`` of the buffer's next draw (its own count of calls)."""

    def get() -> Any:
        positions, rows = draws.at(calls[side])
        calls[side] += 1
        return peer.get(peer.indices(positions, rows))

    return get


def state_writes(repeats: int, workdir: str | None) -> dict[str, Any]:
    """State rows over ``STATE_SHAPES``: rows/s of the buffer (created, adds, ``flush``)
    against ``LazyMemmapStorage`` (created, one ``extend`` per trajectory), alternating."""
    missing = torchrl_missing()
    if missing:
        return {"unavailable": missing}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rbzarr-state-writes-", dir=workdir) as root:
        # Each side's first use (imports, first calls), untimed: the suite starts here.
        first = [_state_trajectory(4, 2, 8, 0)]
        TorchRLPeer(_flats(first), str(Path(root) / "first-torchrl"))
        with _buffer(Path(root) / "first-rbzarr", 1, None) as buffer:
            buffer.add_trajectories(first)
        for T, B, floats in STATE_SHAPES:
            trajectories = [
                _state_trajectory(T, B, floats, seed) for seed in range(STATE_TRAJECTORIES)
            ]
            for mode in ("one add", "adds of one"):
                out[f"T={T} B={B} obs={floats} {mode}"] = _state_shape(
                    trajectories, mode == "one add", Path(root), repeats
                )
    return out


def _state_shape(
    trajectories: list[Trajectory], one_add: bool, root: Path, repeats: int
) -> dict[str, Any]:
    """The buffer's rows/s (one add of every trajectory, or one add each) against
    ``LazyMemmapStorage.extend``'s and the layout's floor (the same trajectory groups' and
    packs' folders and files made with bare ``os`` calls, learnt from the buffer's first
    store), ``repeats`` alternating rounds."""
    flats = _flats(trajectories)
    rows = sum(len(flat["rewards"]) for flat in flats)
    shapes: list[tuple[list[str], list[tuple[str, int]]]] = []

    def ours() -> float:
        start = time.perf_counter()
        with _buffer(root / "rbzarr", len(trajectories), None) as buffer:
            for part in [trajectories] if one_add else [[t] for t in trajectories]:
                buffer.add_trajectories(part)
            buffer.flush()
        collect_own_garbage()
        seconds = time.perf_counter() - start
        if not shapes:
            shapes.append(tree_shape(root / "rbzarr", (TRAJECTORIES, PACKS)))
        retire(root / "rbzarr")
        return rows / seconds

    def floor() -> float:
        seconds = floor_tree(root / "floor", shapes[0])  # bare os calls: no garbage
        retire(root / "floor")
        return rows / seconds

    def theirs() -> float:
        start = time.perf_counter()
        TorchRLPeer(flats, str(root / "torchrl"))
        collect_own_garbage()
        seconds = time.perf_counter() - start
        retire(root / "torchrl")
        return rows / seconds

    mine, peer, bare = alternate([ours, theirs, floor], repeats)  # ours first: the shape
    return {
        "rows_s": spread(mine),
        "LazyMemmapStorage.extend rows_s": spread(peer),
        "ratio": paired_ratio(mine, peer),
        "layout floor rows_s": spread(bare),
        "layout floor / LazyMemmapStorage.extend": paired_ratio(bare, peer),
        "files per trajectory": len(shapes[0][1]) / len(trajectories),
        "folders per trajectory": len(shapes[0][0]) / len(trajectories),
    }


def _state_trajectory(T: int, B: int, floats: int, seed: int) -> Trajectory:
    generator = torch.Generator().manual_seed(seed)
    state = torch.cumsum(0.05 * torch.randn(T + 1, B, floats, generator=generator), dim=0)
    return Trajectory(
        max_episode_length=T,
        curr_obs={"state": state[:T].clone()},
        next_obs={"state": state[1:].clone()},
        actions=torch.randn(T, B, 7, generator=generator),
        rewards=torch.randn(T, B, generator=generator),
        dones=torch.rand(T + 1, B, generator=generator) < 0.02,
        prev_logprobs=torch.randn(T, B, generator=generator),
    )


def _s3(settings: Settings, trajectories: list[Trajectory]) -> dict[str, Any]:
    """The default store on moto, read through the local cache: bytes fetched vs stored."""
    from benchmarks.s3 import load_s3_server, proxied_bucket  # noqa: PLC0415
    from benchmarks.s3_cache import measure_cache  # noqa: PLC0415

    server = load_s3_server()
    if isinstance(server, str):
        return {"unavailable": server}
    import s3fs  # noqa: PLC0415  (with the S3 server)

    with proxied_bucket(server, "images") as (endpoint, proxy, bucket, options):
        direct = s3fs.S3FileSystem(**server.s3_storage_options(endpoint, timeout=60.0))
        return measure_cache(settings, proxy, f"{bucket}/store", options, direct, trajectories, 0.0)


def images_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets (issue 38), each with the figure it is measured by."""
    sources = results["sources"]
    found = []
    for name, goal, today in (
        ("mujoco128", 0.15, 1.0),
        ("mujoco224", 0.15, 1.0),
        ("photos224", 0.35, 1.0),
    ):
        value, reason = _figure(sources, name, "sizes", "default", "vs_raw")
        found.append(
            target(
                f"disk bytes of image keys vs raw, default codec, {name}",
                f"curr + next image folders on disk / raw bytes (issue's today: {today}x)",
                value,
                goal,
                "<=",
                reason,
            )
        )
    value, reason = _figure(sources, "photos224", "sizes", "jpeg:95", "vs_raw")
    found.append(
        target('"jpeg:95" bytes vs raw, photos224', "image folders / raw", value, 0.1, "<=", reason)
    )
    value, reason = _figure(sources, "photos224", "sizes", "jpeg:95", "psnr_db")
    found.append(
        target(
            '"jpeg:95" PSNR dB, photos224', "PSNR of every frame read back", value, 40, ">=", reason
        )
    )
    for name in SOURCES:
        found.extend(_sampling_targets(sources, name))
    for name in SOURCES:
        found.extend(_write_targets(sources, name))
    state = results["state_writes"]
    worst = (
        None if "unavailable" in state else min(state, key=lambda k: state[k]["ratio"]["median"])
    )
    found.append(
        target(
            "state-row writes vs LazyMemmapStorage.extend, every shape (the worst)",
            "rows/s, buffer created to flush / LazyMemmapStorage created and extended per "
            "trajectory, median of alternating rounds, T 4-64, B 2-32, 8-64 floats, one add of "
            f"many and many adds of one; worst: {worst} (issue's today: 0.11-0.50x)",
            None if worst is None else state[worst]["ratio"]["median"],
            1.0,
            ">=",
            state.get("unavailable"),
        )
    )
    s3 = results["s3"]
    found.append(
        target(
            "S3 with the local cache: bytes downloaded / bytes stored",
            "bytes the server sent over many passes of the window / the store's trajectory bytes "
            "(issue's today: 1.00x)",
            None if "unavailable" in s3 else s3["bytes"]["fetched_vs_data"],
            1.05,
            "<=",
            s3.get("unavailable"),
        )
    )
    value, reason = _figure(sources, "mujoco128", "sizes", "default", "files_per_trajectory")
    found.append(
        target(
            "files per trajectory (RLinf-shaped, 10 arrays)",
            "files in a trajectory's folders, default store (issue's today: 21 + 12 folders)",
            value,
            12,
            "<=",
            reason,
        )
    )
    lerobot = results.get("lerobot", {"unavailable": "not measured"})
    found.append(
        target(
            "random-access frames/s vs LeRobotDataset (video)",
            "camera frames/s of sample(256), default store / of LeRobotDataset[i], random i",
            None if "unavailable" in lerobot else lerobot["ratio"],
            2.5,
            ">=",
            lerobot.get("unavailable"),
        )
    )
    return found


def _figure(sources: Mapping[str, Any], *path: str) -> tuple[float | None, str | None]:
    """The figure at ``path`` of the results, or ``None`` and why it is missing."""
    node: Any = sources
    for step in path:
        if not isinstance(node, Mapping):
            return None, "not measured"
        if "unavailable" in node:
            return None, str(node["unavailable"])
        if step not in node:
            return None, f"{'/'.join(path)} was not measured"
        node = node[step]
    return float(node), None


# (the buffer's side, the storage, goal, label) of the sampling targets; the storage's
# fastest documented path (``storage.get`` of the same rows or ``ReplayBuffer.sample``) is
# the peer.
SAMPLING_TARGETS = (
    (
        "rbzarr default",
        "LazyMemmapStorage",
        0.6,
        "sample(256), default codec, vs TorchRL LazyMemmapStorage raw",
    ),
    (
        "rbzarr default",
        "CompressedListStorage",
        2.0,
        "sample(256), default codec, vs TorchRL CompressedListStorage",
    ),
    (
        "rbzarr raw",
        "LazyMemmapStorage",
        1.2,
        "sample(256), raw, vs TorchRL LazyMemmapStorage (keep)",
    ),
)
# (ratio in the writes' results, goal, label) of the write targets.
WRITE_TARGETS = (
    (
        "rbzarr raw / LazyMemmapStorage.extend",
        1.0,
        "image-row writes, raw, vs LazyMemmapStorage.extend (issue's today: 0.12-0.31x)",
    ),
    (
        "rbzarr raw / limit: write() into fresh files",
        0.5,
        "image-row writes, raw, vs write() of the same bytes into fresh files (the limit)",
    ),
    (
        "rbzarr default / CompressedListStorage.extend",
        1.0,
        "image-row writes, default codec, "
        "vs CompressedListStorage.extend (issue's today: 0.17-0.73x)",
    ),
    (
        f"rbzarr {JPEG} / {JPEG} encoder, every core",
        0.5,
        f"{JPEG} writes vs the JPEG "
        "encoder's own rate on the same frames, every core (issue's today: ~0.02x)",
    ),
)


def _sampling_targets(sources: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    found = []
    for ours, storage, goal, label in SAMPLING_TARGETS:
        mine, reason = _figure(sources, name, "sampling", ours, "rows_s")
        paths = {}
        for path in (f"{storage}.get", f"{storage} ReplayBuffer.sample"):
            rate, _ = _figure(sources, name, "sampling", path, "rows_s")
            if rate is not None:
                paths[path] = rate
        fastest = max(paths, key=lambda path: paths[path]) if paths else None
        value = None if mine is None or fastest is None else mine / paths[fastest]
        meaning = (
            f"rows/s (median call) / TorchRL's fastest path, {fastest} (storage.get of the same "
            "rows, the buffer's draws replayed, or ReplayBuffer.sample of random rows), warm "
            "local, timed interleaved"
        )
        found.append(target(f"{label}, {name}", meaning, value, goal, ">=", reason))
    return found


def _write_targets(sources: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    found = []
    for ratio, goal, label in WRITE_TARGETS:
        node: Any = sources.get(name, {})
        writes = node.get("writes", {"unavailable": "not measured"})
        reason = node.get("unavailable") or writes.get("unavailable")
        found_ratio = None if reason else writes["ratios"].get(ratio)
        if found_ratio is None and reason is None:
            reason = f"{ratio} was not measured"
        meaning = (
            f"{ratio}: rows/s (buffer created, add_trajectories, flush; storage created, extend "
            "per trajectory), median of the per-round ratios, rounds alternating (ABBA)"
        )
        value = None if found_ratio is None else found_ratio["median"]
        found.append(target(f"{label}, {name}", meaning, value, goal, ">=", reason))
    return found
