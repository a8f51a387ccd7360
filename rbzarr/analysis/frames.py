"""The rows a picture shows: one env column of a trajectory, or one episode, read row by row.

Only the shown rows are read (:meth:`~rbzarr.storage.layout.TrajectoryLayout.read_rows`:
on a zarr store, the frames' own chunks, decoded into numpy without torch), never whole
trajectories of frames.  Episodes are numbered and cut as
:meth:`~rbzarr.analysis.view.BufferView.iter_episodes` yields them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from rbzarr.analysis.codec_trial import image_keys as schema_image_keys
from rbzarr.errors import EpisodeNotFoundError, NotAnImageError
from rbzarr.storage.zarr.codecs import image_layout
from rbzarr.storage.zarr.describe import recorded_arrays
from rbzarr.trajectory.steps import DONES, REWARDS

if TYPE_CHECKING:
    from rbzarr.analysis.episodes import Episode
    from rbzarr.analysis.store_arrays import StoreArrays
    from rbzarr.analysis.view import BufferView

    # What the steps are read from: a view (tensors, sampling) or the store's arrays.
    Store = BufferView | StoreArrays

__all__ = [
    "MARKS",
    "ShownSteps",
    "episode_steps",
    "find_episode",
    "image_keys",
    "trajectory_steps",
]

# Per-step flags the strip marks, where the store has them.
MARKS = (DONES, "terminations", "truncations", "intervene_flags")
# Per-step values read besides frames: what the strip and the report's plots draw.
_SIGNALS = (REWARDS, *MARKS)


@dataclass(frozen=True)
class ShownSteps:
    """The rows one picture shows, in time order, of one environment column.

    ``frames`` holds each camera key's ``[N, H, W, 3]`` uint8 RGB frames, ``values`` each
    per-step field as ``[N, D]`` float64 (``rewards``, the flags of :data:`MARKS`, the
    extra keys asked for), ``steps`` each row's ``(trajectory_id, t)``, ``episode_starts``
    the rows (after the first) where a new episode begins, and ``psnr`` the PSNR a lossy
    codec recorded for a key (the worst of the shown trajectories).
    """

    title: str
    frames: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    steps: list[tuple[int, int]]
    episode_starts: list[int]
    psnr: dict[str, float]

    def __len__(self) -> int:
        return len(self.steps)

    def flags(self, key: str) -> np.ndarray | None:
        """``[N]`` bool: the rows where ``key`` (of :data:`MARKS`) is set; ``None`` if absent."""
        value = self.values.get(key)
        return None if value is None else (value != 0).any(axis=1)


def image_keys(view: Store, keys: Sequence[str] | None = None, required: bool = True) -> list[str]:
    """The camera keys to show: ``keys`` (each checked), else every image-like ``curr_obs``
    key (else every image-like key; else none, unless ``required``).

    Raises
    ------
    KeyError
        A key the store does not have.
    NotAnImageError
        A key that is not image-like (uint8 ``[H, W, C]`` or ``[C, H, W]``, ``C`` in 1, 3,
        4), or (``required``) a store without any.
    """
    schema = view.schema()
    images = schema_image_keys(schema)
    if keys:
        for key in keys:
            if key not in schema:
                raise KeyError(f"{view.url}: no key {key!r}; the keys are {sorted(schema)}")
            if key not in images:
                dtype, shape = schema[key]
                raise NotAnImageError(
                    f"{view.url}: key {key!r} is not image-like: expected uint8 [H, W, C] or "
                    f"[C, H, W] with C in 1, 3, 4 and sides >= 8, got {dtype} {list(shape)}"
                )
        return list(keys)
    if not images and required:
        raise NotAnImageError(f"{view.url}: no image-like key among {sorted(schema)}")
    return [key for key in images if key.startswith("curr_obs/")] or images


def trajectory_steps(
    view: Store,
    trajectory_id: int,
    env: int,
    keys: Sequence[str],
    extra: Sequence[str] = (),
) -> ShownSteps:
    """Every time step of env column ``env`` of one trajectory.

    Raises
    ------
    KeyError
        The index does not list ``trajectory_id``.
    ValueError
        ``env`` is not a column of the trajectory.
    """
    entry = view.entry(trajectory_id)
    T, B = int(entry["shape"][0]), int(entry["shape"][1])
    if not 0 <= env < B:
        raise ValueError(
            f"{view.url}: trajectory {trajectory_id} has envs 0..{B - 1}, got --env {env}"
        )
    shown = _read(view, [(trajectory_id, env, 0, T)], keys, extra)
    dones = shown.flags(DONES)
    starts = [] if dones is None else [int(i) + 1 for i in np.flatnonzero(dones) if i + 1 < T]
    return replace(shown, title=f"trajectory {trajectory_id}, env {env}", episode_starts=starts)


def find_episode(view: Store, number: int, across_trajectories: bool = True) -> Episode:
    """Episode ``number`` (from 0) in the order :meth:`BufferView.iter_episodes` yields them;
    only ``dones`` is read (into numpy), and only until it is found.

    Raises
    ------
    EpisodeNotFoundError
        The store has no episode ``number``.
    """
    from rbzarr.analysis.cluster import TrajectoryTasks  # noqa: PLC0415

    count = 0
    for episode in TrajectoryTasks().episodes(
        view, [DONES], across_trajectories=across_trajectories
    ):
        if count == number:
            return episode
        count += 1
    raise EpisodeNotFoundError(
        f"{view.url}: no episode {number}; the store has episodes 0..{count - 1}"
        if count
        else f"{view.url}: no episode {number}; the store has no episode"
    )


def episode_steps(
    view: Store, episode: Episode, keys: Sequence[str], extra: Sequence[str] = ()
) -> ShownSteps:
    """The rows of ``episode`` (found by :func:`find_episode`), across its trajectories."""
    pieces = []
    start, left = episode.start, episode.length
    for trajectory_id in episode.trajectory_ids or (episode.trajectory_id,):
        T = int(view.entry(trajectory_id)["shape"][0])
        stop = min(T, start + left)
        pieces.append((trajectory_id, episode.env, start, stop))
        left -= stop - start
        start = 0
    shown = _read(view, pieces, keys, extra)
    ids = pieces[0][0], pieces[-1][0]
    where = f"trajectory {ids[0]}" if ids[0] == ids[1] else f"trajectories {ids[0]}-{ids[1]}"
    done = "" if episode.done else ", incomplete"
    title = f"env {episode.env}, {where} ({len(shown)} steps{done})"
    return replace(shown, title=title)


def _read(
    view: Store,
    pieces: Iterable[tuple[int, int, int, int]],
    keys: Sequence[str],
    extra: Sequence[str],
) -> ShownSteps:
    """The rows ``start..stop`` of env ``env`` of each ``(trajectory_id, env, start, stop)``."""
    available = set(view.keys())
    signals = [k for k in dict.fromkeys([*_SIGNALS, *extra]) if k in available and k not in keys]
    frames: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    values: dict[str, list[np.ndarray]] = {key: [] for key in signals}
    steps: list[tuple[int, int]] = []
    psnr: dict[str, float] = {}
    for trajectory_id, env, start, stop in pieces:
        entry = view.entry(trajectory_id)
        B = int(entry["shape"][1])
        rows = np.arange(start, stop, dtype=np.int64) * B + env
        read = view.layout.read_rows(entry, rows, [*keys, *signals])
        for key in keys:
            frames[key].append(_rgb(read[key]))
        for key in signals:
            values[key].append(read[key].reshape(len(rows), -1).astype(np.float64))
        steps.extend((trajectory_id, t) for t in range(start, stop))
        for key, measured in _recorded_psnr(view, trajectory_id, keys).items():
            psnr[key] = min(measured, psnr.get(key, measured))
    return ShownSteps(
        "",
        {key: np.concatenate(parts) for key, parts in frames.items()},
        {key: np.concatenate(parts) for key, parts in values.items()},
        steps,
        [],
        psnr,
    )


def _rgb(frames: np.ndarray) -> np.ndarray:
    """``[N, H, W, C]`` or ``[N, C, H, W]`` uint8 frames as ``[N, H, W, 3]`` RGB."""
    if image_layout((1, *frames.shape), frames.dtype) == "chw":
        frames = frames.transpose(0, 2, 3, 1)
    channels = frames.shape[-1]
    if channels == 1:
        return np.repeat(frames, 3, axis=-1)
    return np.ascontiguousarray(frames[..., :3])


def _recorded_psnr(view: Store, trajectory_id: int, keys: Sequence[str]) -> dict[str, float]:
    """The PSNR a lossy codec recorded at encode for each of ``keys`` of one trajectory (a
    pack member's: its pack's, recorded over the pack)."""
    if view.layout.format != "zarr":  # only zarr layout 2 records what its codecs did
        return {}
    arrays, _ = recorded_arrays(view.layout.location, view.entry(trajectory_id))
    arrays = arrays or {}
    found = {}
    for key in keys:
        measured = (arrays.get(key) or {}).get("psnr")
        if isinstance(measured, int | float):
            found[key] = float(measured)
    return found
