"""Plots of a store's rewards and episodes, and the demo's learning curve (``analysis`` extra)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from rbzarr.trajectory.steps import DONES, REWARDS

if TYPE_CHECKING:
    from rbzarr.analysis.cluster import TrajectoryTasks
    from rbzarr.analysis.store_arrays import StoreArrays
    from rbzarr.analysis.view import BufferView

__all__ = [
    "DPI",
    "FIGURE_SIZE",
    "IMAGE_FORMATS",
    "image_format_of",
    "plot_learning_curve",
    "plot_store",
]

FIGURE_SIZE = (10.0, 8.0)  # inches
DPI = 100


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'rbzarr[analysis]'") from exc
    return plt


def _collect(
    view: BufferView | StoreArrays,
    progress: bool,
    across_trajectories: bool,
    tasks: TrajectoryTasks,
) -> tuple[np.ndarray, list[tuple[int, int, float]]]:
    """All per-step reward elements, and ``(trajectory_id, length, return)`` per complete episode,
    the id being the trajectory the episode ended in.
    """
    available = view.keys()
    if REWARDS not in available:
        raise ValueError(f"{view.url}: cannot plot rewards, the store has no 'rewards' field")
    keys = [key for key in (REWARDS, DONES) if key in available]
    rewards: list[np.ndarray] = []
    episodes: list[tuple[int, int, float]] = []
    stream = tasks.steps_and_episodes(
        view,
        keys,
        _flat_rewards,
        progress=progress,
        across_trajectories=across_trajectories,
        with_episodes=DONES in available,
    )
    for _, flat_rewards, ended in stream:
        rewards.append(flat_rewards)
        episodes.extend(
            (e.trajectory_ids[-1], e.length, float(e.episode_return or 0.0))
            for e in ended
            if e.done
        )
    flat = np.concatenate(rewards) if rewards else np.empty(0)
    return flat, episodes


def _flat_rewards(steps: Mapping[str, np.ndarray]) -> np.ndarray:
    """One trajectory's reward elements as float64 (run where it is read)."""
    return steps[REWARDS].astype(np.float64).reshape(-1)


# File suffixes and the image formats they name.
IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}


def image_format_of(
    path: str | os.PathLike[str], formats: Mapping[str, str] = IMAGE_FORMATS
) -> str:
    """The image format ``path``'s suffix names in ``formats``, e.g. ``"jpeg"`` for ``x.jpg``."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    try:
        return formats[suffix]
    except KeyError:
        raise ValueError(
            f"{os.fspath(path)!r}: unknown image suffix {suffix!r}; expected one of "
            f"{sorted(formats)}"
        ) from None


def _store_name(url: str) -> str:
    """How a title names a store: a local one below the working directory by its relative
    path (as the command that made it named it), any other by its URL."""
    if "://" in url or not os.path.isabs(url):
        return url
    relative = os.path.relpath(url)
    return url if relative.startswith("..") else relative


def plot_store(
    view: BufferView | StoreArrays,
    path: str | os.PathLike[str] | IO[bytes],
    progress: bool = False,
    across_trajectories: bool = True,
    tasks: TrajectoryTasks | None = None,
    image_format: str | None = None,
) -> dict[str, int]:
    """Draw the four panels of ``view`` into the image file ``path`` (1000 x 800 pixels).

    ``path`` may be a binary file object, ``image_format`` (``"png"``, ...) then naming its
    format; ``tasks`` reads the trajectories (on a dask cluster with a client).
    """
    if image_format is None:
        image_format = image_format_of(path if isinstance(path, str | os.PathLike) else "")
    plt = _pyplot()
    from rbzarr.analysis.cluster import TrajectoryTasks  # noqa: PLC0415 (torch)

    rewards, episodes = _collect(view, progress, across_trajectories, tasks or TrajectoryTasks())
    figure, axes = plt.subplots(2, 2, figsize=FIGURE_SIZE, dpi=DPI)
    try:
        figure.suptitle(f"{_store_name(view.url)} ({len(view)} trajectories)")
        _histogram(axes[0, 0], rewards, "per-step reward")
        _histogram(axes[0, 1], np.array([e[2] for e in episodes]), "episode return")
        _histogram(axes[1, 0], np.array([e[1] for e in episodes]), "episode length")
        _returns_by_trajectory(axes[1, 1], episodes)
        target = path if not isinstance(path, str | os.PathLike) else os.fspath(path)
        figure.savefig(target, dpi=DPI, format=image_format)
    finally:
        plt.close(figure)
    return {"rewards": int(rewards.size), "episodes": len(episodes)}


def _histogram(axis: Any, values: np.ndarray, label: str) -> None:
    axis.set_xlabel(label)
    axis.set_ylabel("count")
    if values.size == 0:
        axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
        return
    axis.hist(values, bins=min(50, max(1, int(np.unique(values).size))))


def _returns_by_trajectory(axis: Any, episodes: list[tuple[int, int, float]]) -> None:
    axis.set_xlabel("trajectory id")
    axis.set_ylabel("episode return")
    if not episodes:
        axis.text(0.5, 0.5, "no episodes", ha="center", va="center", transform=axis.transAxes)
        return
    ids = np.array([e[0] for e in episodes])
    returns = np.array([e[2] for e in episodes])
    axis.scatter(ids, returns, s=6, alpha=0.4, label="episode")
    order = np.unique(ids)
    axis.plot(order, [returns[ids == i].mean() for i in order], color="C1", label="mean")
    axis.legend(loc="best")


def plot_learning_curve(
    evaluations: list[tuple[int, float]], view: BufferView, path: str | os.PathLike[str]
) -> None:
    """Returns over training into the PNG file ``path`` (1000 x 500 pixels)."""
    plt = _pyplot()
    samples_until = dict(
        zip(view.ids, np.cumsum([view.entry(i)["num_samples"] for i in view.ids]), strict=True)
    )
    keys = [REWARDS, DONES]
    steps, returns = [], []
    for _, _, ended in view.iter_steps_and_episodes(keys, episode_keys=keys):
        for episode in ended:
            if episode.done:
                steps.append(samples_until[episode.trajectory_ids[-1]])
                returns.append(episode.episode_return or 0.0)
    figure, axis = plt.subplots(figsize=(FIGURE_SIZE[0], FIGURE_SIZE[1] / 1.6), dpi=DPI)
    try:
        axis.scatter(steps, returns, s=4, alpha=0.25, color="C0", label="training episode")
        if evaluations:
            x, y = zip(*evaluations, strict=True)
            axis.plot(x, y, marker="o", color="C1", label="greedy evaluation (mean)")
        axis.set_xlabel("env steps")
        axis.set_ylabel("episode return")
        axis.set_title(f"returns over training ({_store_name(view.url)})")
        axis.legend(loc="upper left")
        figure.savefig(os.fspath(path), dpi=DPI, format="png")
    finally:
        plt.close(figure)
