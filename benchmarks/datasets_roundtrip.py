"""The ``datasets`` suite: LeRobot v3.0 round trips, decoded-frame error, throughput, peak memory.

* **fidelity**: a synthetic store (smooth moving frames, 64x64) is exported to LeRobot
  (libsvtav1, LeRobot's codec), imported back, and exported again.  Non-video fields must
  come back bit-exact in both directions (store -> LeRobot -> store, and LeRobot -> store
  -> LeRobot, whose data parquet files must be equal).  Frames: the import must hand out
  exactly what PyAV decodes; the second export's frames, against the imported ones, must
  lose no more than the codec's own round trip (the first encode, against the original
  frames) loses: max / mean absolute error and PSNR of both.
* **throughput**: frames/s of the import and the export of the fidelity dataset.
* **throughput**: 1,000 short numeric episodes (3-9 frames of a 6-float state, 4-float
  actions, rewards) exported from a store to each format (LeRobot, robomimic HDF5, Minari)
  and imported back, in frames/s; beside them LeRobot's own writer
  (``LeRobotDataset.create`` -> ``add_frame`` -> ``save_episode`` -> ``finalize``) on the
  same frames where ``lerobot`` is importable (Python >= 3.12: run the suite in the
  environment ``bash scripts/lerobot_env.sh setup`` builds).
* **memory**: a 1,000-episode synthetic LeRobot dataset (64x64 frames, mpeg4 for a quick
  encode; 3-9 frames per episode and one of 400) is imported in a fresh process; the peak
  of what Python and numpy allocate (tracemalloc) plus pyarrow's pool is compared with the
  bytes of the largest episode as stored.  Part of the peak grows with the number of
  episodes, not their size: the episodes metadata, the index and its JSON documents
  (about 5 KB per episode).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq

from benchmarks.report import target
from rbzarr.interop.convert import export_dataset, import_dataset
from rbzarr.interop.episodes import read_episodes, shifted, write_episodes

__all__ = ["datasets_targets", "run_datasets"]

_VIDEO = "curr_obs/images.top"
_LONGEST, _MEMORY_FRAME = 400, 64
_COMPARED = ("curr_obs/state", "next_obs/state", "actions", "rewards", "dones")


def _frames(length: int, size: int, phase: float) -> np.ndarray:
    """Smooth gradients moving a little each frame (what a camera sees, roughly)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    steps = np.arange(length, dtype=np.float32)[:, None, None]
    channels = [
        128 + 60 * np.sin((x + 2 * steps) / 9.0 + phase + c) + 40 * np.cos((y - steps) / 11.0 + c)
        for c in range(3)
    ]
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def _episode(length: int, size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = rng.standard_normal((length, 6)).astype(np.float32)
    frames = _frames(length, size, float(seed))
    dones = np.zeros(length, dtype=bool)
    dones[-1] = True
    return {
        "curr_obs/state": state,
        "next_obs/state": shifted(state),
        _VIDEO: frames,
        "next_obs/images.top": shifted(frames),
        "actions": rng.standard_normal((length, 4)).astype(np.float32),
        "rewards": rng.standard_normal(length).astype(np.float32),
        "dones": dones,
    }


def _store(path: Path, lengths: list[int], size: int) -> None:
    episodes = (_episode(n, size, seed) for seed, n in enumerate(lengths))
    write_episodes(episodes, path, {"format": "synthetic"})


def _episodes(path: Path) -> list[dict[str, np.ndarray]]:
    return [episode.fields for episode in read_episodes(path)]


def _decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def _error(found: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    diff = np.abs(found.astype(np.float64) - reference.astype(np.float64))
    mse = float((diff**2).mean())
    psnr = float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "psnr_db": psnr}


def _fidelity(work: Path, quick: bool) -> dict[str, Any]:
    lengths = [20, 30, 25] if quick else [60, 90, 75, 45]
    frames = sum(lengths)
    _store(work / "a", lengths, 64)
    started = time.perf_counter()
    export_dataset(work / "a", work / "l1", "lerobot", fps=30)
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    import_dataset(work / "l1", work / "b", "lerobot")
    import_s = time.perf_counter() - started
    export_dataset(work / "b", work / "l2", "lerobot")
    first, second = _episodes(work / "a"), _episodes(work / "b")
    store_exact = all(
        np.array_equal(one[key], two[key]) and one[key].dtype == two[key].dtype
        for one, two in zip(first, second, strict=True)
        for key in _COMPARED
    )
    data = "data/chunk-000/file-000.parquet"
    lerobot_exact = pq.read_table(work / "l1" / data).equals(pq.read_table(work / "l2" / data))
    video = "videos/observation.images.top/chunk-000/file-000.mp4"
    original = np.concatenate([episode[_VIDEO] for episode in first])
    imported = np.concatenate([episode[_VIDEO] for episode in second])
    again = _decoded(work / "l2" / video)
    return {
        "episodes": len(lengths),
        "frames": frames,
        "frame_shape": [64, 64, 3],
        "codec": "libsvtav1",
        "store_lerobot_store_bit_exact": store_exact,
        "lerobot_store_lerobot_bit_exact": bool(lerobot_exact),
        "import_equals_pyav_decode": bool(np.array_equal(imported, _decoded(work / "l1" / video))),
        "codec_round_trip": _error(imported, original),
        "export_round_trip": _error(again, imported),
        "import_frames_s": frames / import_s,
        "export_frames_s": frames / export_s,
    }


def _peak_import(source: str, destination: str, warm: str) -> dict[str, float]:
    """Import ``source`` under tracemalloc (run in a fresh process); peak bytes and seconds.

    A small dataset ``warm`` is imported first, so the modules and caches that any import
    loads once are not counted.
    """
    import tracemalloc  # noqa: PLC0415

    import pyarrow as pa  # noqa: PLC0415

    import_dataset(warm, f"{destination}-warm", "lerobot")
    tracemalloc.start()
    started = time.perf_counter()
    import_dataset(source, destination, "lerobot")
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    arrow = pa.default_memory_pool().max_memory()
    return {"python_numpy_peak": float(peak), "arrow_peak": float(arrow), "seconds": seconds}


def _memory(work: Path, quick: bool) -> dict[str, Any]:
    count = 100 if quick else 1000
    rng = np.random.default_rng(0)
    # Short episodes around one long one (a camera's 400 frames): what the import holds
    # beyond one episode is then visible, and the store stays small on disk.
    lengths = [int(n) for n in rng.integers(3, 10, size=count)]
    lengths[count // 2] = _LONGEST
    _store(work / "m", lengths, _MEMORY_FRAME)
    export_dataset(work / "m", work / "ml", "lerobot", fps=30, codec="mpeg4")
    _store(work / "w", [5, 5], _MEMORY_FRAME)
    export_dataset(work / "w", work / "wl", "lerobot", fps=30, codec="mpeg4")
    largest = sum(a.nbytes for a in _episode(_LONGEST, _MEMORY_FRAME, count // 2).values())
    code = (
        "import json, sys; from benchmarks.datasets_roundtrip import _peak_import; "
        "print(json.dumps(_peak_import(*sys.argv[1:])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(work / "ml"), str(work / "mb"), str(work / "wl")],
        capture_output=True,
        text=True,
        check=True,
    )
    peak = json.loads(result.stdout.strip().splitlines()[-1])
    total = peak["python_numpy_peak"] + peak["arrow_peak"]
    started = time.perf_counter()
    import_dataset(work / "ml", work / "untraced", "lerobot")
    untraced_s = time.perf_counter() - started
    return {
        "episodes": count,
        "frames": sum(lengths),
        "largest_episode_bytes": largest,
        **peak,
        "peak_vs_largest_episode": total / largest,
        "traced_import_frames_s": sum(lengths) / peak["seconds"],
        "import_frames_s": sum(lengths) / untraced_s,
        "import_episodes_s": count / untraced_s,
    }


_FORMATS = {"lerobot": ("lerobot", "lerobot", ""), "hdf5": ("hdf5", "robomimic", ".hdf5")}
_FORMATS["minari"] = ("minari", "minari", "")
_NUMERIC_TARGET = 3 * 283  # frames/s: 3x the import before bursts (1,000 short episodes)


def _numeric_episode(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = rng.standard_normal((length + 1, 6)).astype(np.float32)
    dones = np.zeros(length, dtype=bool)
    dones[-1] = True
    return {
        "curr_obs/state": state[:-1],
        "next_obs/state": state[1:],
        "actions": rng.standard_normal((length, 4)).astype(np.float32),
        "rewards": rng.standard_normal(length).astype(np.float32),
        "terminations": dones.copy(),
        "truncations": np.zeros(length, dtype=bool),
        "dones": dones,
    }


def _lerobot_writer(episodes: list[dict[str, np.ndarray]], root: Path) -> dict[str, Any]:
    """LeRobot's own writer on the same frames: frames/s, or why it is not measured."""
    if find_spec("lerobot") is None:
        return {"unavailable": "lerobot is not installed here (it needs Python >= 3.12)"}
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415
    except ImportError as exc:
        return {"unavailable": f"lerobot does not import here: {exc}"}
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    started = time.perf_counter()
    dataset = LeRobotDataset.create("rbzarr/bench", fps=30, features=features, root=root)
    for episode in episodes:
        for row in range(len(episode["actions"])):
            dataset.add_frame(
                {
                    "observation.state": episode["curr_obs/state"][row],
                    "action": episode["actions"][row],
                    "next.reward": episode["rewards"][row : row + 1],
                    "next.done": episode["dones"][row : row + 1],
                    "task": "bench",
                }
            )
        dataset.save_episode()
    dataset.finalize()
    frames = sum(len(e["actions"]) for e in episodes)
    return {"frames_s": frames / (time.perf_counter() - started)}


def _throughput(work: Path, quick: bool) -> dict[str, Any]:
    """Export and import frames/s of short numeric episodes, per format."""
    count = 100 if quick else 1000
    rng = np.random.default_rng(1)
    episodes = [_numeric_episode(int(n), seed) for seed, n in enumerate(rng.integers(3, 10, count))]
    frames = sum(len(e["actions"]) for e in episodes)
    write_episodes(iter(episodes), work / "store", {"format": "synthetic"})
    formats: dict[str, Any] = {}
    for name, (target_format, source_format, suffix) in _FORMATS.items():
        if name == "minari" and find_spec("minari") is None:
            formats[name] = {"unavailable": "minari is not installed here"}
            continue
        out = work / f"{name}-v0{suffix}"
        started = time.perf_counter()
        export_dataset(work / "store", out, target_format)
        export_s = time.perf_counter() - started
        started = time.perf_counter()
        import_dataset(out, work / f"{name}-store", source_format)
        import_s = time.perf_counter() - started
        formats[name] = {"export_frames_s": frames / export_s, "import_frames_s": frames / import_s}
    return {
        "episodes": count,
        "frames": frames,
        "formats": formats,
        "lerobot_writer": _lerobot_writer(episodes, work / "lerobot-writer"),
    }


def _torchrl_peer() -> dict[str, str]:
    """Why TorchRL's ``LeRobotExperienceReplay`` is not measured beside the import, if it is not."""
    missing = [
        name for name in ("datasets", "huggingface_hub", "torchcodec") if find_spec(name) is None
    ]
    if find_spec("torchrl") is None or missing:
        return {
            "unavailable": "TorchRL's LeRobotExperienceReplay reads an on-disk dataset through "
            f"{', '.join(('torchrl', *missing))} (not installed here)"
        }
    return {"unavailable": "not wired: its on-disk reader downloads from the Hugging Face hub"}


def run_datasets(quick: bool, workdir: str | None = None) -> dict[str, Any]:
    """The suite's results (see the module docs)."""
    with tempfile.TemporaryDirectory(prefix="rbzarr-datasets-", dir=workdir) as folder:
        work = Path(folder)
        (work / "f").mkdir()
        (work / "mem").mkdir()
        (work / "speed").mkdir()
        return {
            "fidelity": _fidelity(work / "f", quick),
            "throughput": _throughput(work / "speed", quick),
            "memory": _memory(work / "mem", quick),
            "torchrl_lerobot": _torchrl_peer(),
        }


def datasets_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on :func:`run_datasets`' results."""
    fidelity, memory = results["fidelity"], results["memory"]
    exact = (
        fidelity["store_lerobot_store_bit_exact"] and fidelity["lerobot_store_lerobot_bit_exact"]
    )
    codec, export = fidelity["codec_round_trip"], fidelity["export_round_trip"]
    return [
        target(
            "datasets: non-video fields bit-exact both directions",
            "store -> LeRobot -> store equal arrays and LeRobot -> store -> LeRobot equal "
            "data parquet (1 = both)",
            float(exact),
            1.0,
            ">=",
        ),
        target(
            "datasets: imported frames are PyAV's decode",
            "1 when every imported frame equals PyAV's decode of the source mp4",
            float(fidelity["import_equals_pyav_decode"]),
            1.0,
            ">=",
        ),
        target(
            "datasets: re-export error <= the codec's own round trip (mean abs)",
            f"mean |export frames - imported frames| / mean |first encode - original| "
            f"({export['mean_abs']:.2f} / {codec['mean_abs']:.2f})",
            export["mean_abs"] / max(codec["mean_abs"], 1e-9),
            1.0,
            "<=",
        ),
        target(
            "datasets: import of short numeric episodes (LeRobot) >= 3x 283 frames/s",
            f"frames/s importing {results['throughput']['episodes']} LeRobot episodes of 3-9 "
            "frames",
            results["throughput"]["formats"]["lerobot"]["import_frames_s"],
            float(_NUMERIC_TARGET),
            ">=",
        ),
        target(
            "datasets: peak import memory <= 2x the largest episode",
            f"(tracemalloc peak + pyarrow pool peak) / largest episode's stored bytes, "
            f"{memory['episodes']} episodes",
            memory["peak_vs_largest_episode"],
            2.0,
            "<=",
        ),
    ]
