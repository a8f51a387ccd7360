"""Random-access reads of LeRobot's own ``LeRobotDataset`` on a video dataset of given frames.

Run by :mod:`benchmarks.lerobot_peer` with LeRobot's interpreter (LeRobot 0.6 needs Python
3.12: ``scripts/lerobot_env.sh``); it imports only numpy and lerobot.  Reads ``frames.npz``
(``main``, ``wrist``: ``[N, T, B, H, W, 3]`` uint8; ``state``: ``[N, T, B, D]``; ``action``:
``[N, T, B, A]``), writes (once) a dataset whose episodes are the ``B`` columns of each of
the ``N`` trajectories, two cameras as video (LeRobot's default encoder), then times
``dataset[i]`` for random ``i`` and prints one JSON line.

    python benchmarks/lerobot_reads.py FRAMES.npz ROOT READS SEED
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

CAMERAS = ("main", "wrist")


def build(frames: dict[str, np.ndarray], root: Path) -> float:
    """The dataset at ``root`` (written when missing); seconds spent writing it."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415  (LeRobot env)

    if (root / "meta" / "info.json").exists():
        return 0.0
    N, T, B, H, W, _ = frames["main"].shape
    features = {
        f"observation.images.{camera}": {
            "dtype": "video",
            "shape": (H, W, 3),
            "names": ["height", "width", "channels"],
        }
        for camera in CAMERAS
    }
    features["observation.state"] = {
        "dtype": "float32",
        "shape": (frames["state"].shape[-1],),
        "names": None,
    }
    features["action"] = {"dtype": "float32", "shape": (frames["action"].shape[-1],), "names": None}
    start = time.perf_counter()
    dataset = LeRobotDataset.create("rbzarr/bench-images", fps=20, features=features, root=root)
    for n in range(N):
        for b in range(B):
            for t in range(T):
                frame = {
                    f"observation.images.{camera}": frames[camera][n, t, b] for camera in CAMERAS
                }
                frame["observation.state"] = frames["state"][n, t, b]
                frame["action"] = frames["action"][n, t, b]
                frame["task"] = "run"
                dataset.add_frame(frame)
            dataset.save_episode()
    dataset.finalize()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    """Build (once), then time random reads; print ``{"items_s", "frames_s", ...}``."""
    path, root, reads, seed = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    with np.load(path) as stored:
        frames = {key: stored[key] for key in stored.files}
    built_s = build(frames, root)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415  (LeRobot env)

    dataset = LeRobotDataset("rbzarr/bench-images", root=root, return_uint8=True)
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, len(dataset), reads + 5).tolist()
    for i in indices[:5]:  # warm-up: decoders opened
        dataset[i]
    latencies = []
    for i in indices[5:]:
        start = time.perf_counter()
        item = dataset[i]
        latencies.append(time.perf_counter() - start)
    shape = list(item[f"observation.images.{CAMERAS[0]}"].shape)
    video_bytes = sum(f.stat().st_size for f in (root / "videos").rglob("*") if f.is_file())
    median = float(np.median(latencies))
    print(
        json.dumps(
            {
                "reads": reads,
                "items_s": 1 / median,
                "items_s_mean": len(latencies) / sum(latencies),
                "frames_s": len(CAMERAS) / median,
                "frame_shape": shape,
                "video_bytes": video_bytes,
                "build_s": built_s,
                "episodes": int(dataset.num_episodes),
                "frames": int(dataset.num_frames),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
