"""Real camera frames for the ``images`` suite, shaped as RLinf rollouts, cached on disk.

Sources (``SOURCES``):

* ``mujoco128``: gymnasium's ``HalfCheetah-v5`` rendered by MuJoCo at 128x128;
* ``mujoco224``: gymnasium's ``Ant-v5`` rendered at 224x224;
* ``photos224``: scikit-image's bundled photographs (astronaut, chelsea, coffee, rocket),
  224x224 crops of a camera moving by sub-pixel steps (bilinear resampling).

Each has two cameras (``main_images``: a free camera tracking the body, or one photo;
``wrist_images``: the model's own ``track`` camera, or another photo) and a state
(``states``: the environment's observation, or the crops' positions and velocities).
MuJoCo renders with ``MUJOCO_GL=egl`` (set here when unset; software EGL works).

A rollout is ``B`` environments stepped together with random actions, episodes of
``EPISODE_STEPS`` steps (staggered, so that dones fall anywhere) or until the environment
terminates, then reset (auto-reset): trajectory ``k`` holds steps ``k*T .. k*T+T-1``,
``curr_obs[t]`` the frames before step ``t``, ``next_obs[t]`` those after it (the episode's
last frames where it ended), ``dones[t + 1]`` whether step ``t`` ended an episode
(``dones[0]``: the previous trajectory's last).  So ``next_obs[t] == curr_obs[t + 1]``
except at dones and the last step.

Rendering is slow (tens of ms a frame on a CPU): trajectories are cached as ``.npz`` files
under ``<cache>/<source>-T<T>-B<B>-v1/`` and read back on later runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from rbzarr.trajectory.model import Trajectory

__all__ = ["SOURCES", "FrameSource", "image_keys", "load_trajectories", "rollout"]

EPISODE_STEPS = 50
CAMERAS = ("main_images", "wrist_images")
ACTION_DIM = 8
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
VERSION = 1


class Scenes(Protocol):
    """``B`` environments, each stepped, observed and reset on its own."""

    def observe(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Environment ``b``'s two camera frames (``[H, W, 3]`` uint8) and its state."""
        ...

    def step(self, b: int, action: np.ndarray) -> tuple[float, bool]:
        """Step environment ``b``: its reward and whether it terminated."""
        ...

    def reset(self, b: int) -> None:
        """Start a new episode in environment ``b``."""
        ...


@dataclasses.dataclass(frozen=True)
class FrameSource:
    """One kind of frames: its name, frame size and how its scenes are built."""

    name: str
    size: int
    kind: str
    detail: str

    def scenes(self, B: int, seed: int) -> Scenes:
        """The source's ``B`` environments."""
        if self.kind == "mujoco":
            return MujocoScenes(self.detail, self.size, B, seed)
        return PhotoScenes(self.size, B, seed)

    def missing(self) -> str | None:
        """``None`` when the source's packages import, else why not."""
        try:
            if self.kind == "mujoco":
                os.environ.setdefault("MUJOCO_GL", "egl")
                import gymnasium  # noqa: F401, PLC0415
                import mujoco  # noqa: F401, PLC0415
            else:
                import skimage.data  # noqa: F401, PLC0415
        except ImportError as exc:
            return f"{self.name}: {exc} (install the bench-images extra)"
        return None


SOURCES = {
    source.name: source
    for source in (
        FrameSource("mujoco128", 128, "mujoco", "HalfCheetah-v5"),
        FrameSource("mujoco224", 224, "mujoco", "Ant-v5"),
        FrameSource("photos224", 224, "photos", ",".join(PHOTOS)),
    )
}


class MujocoScenes:
    """gymnasium MuJoCo environments rendered by one ``mujoco.Renderer``."""

    def __init__(self, env_id: str, size: int, B: int, seed: int) -> None:
        os.environ.setdefault("MUJOCO_GL", "egl")
        import gymnasium  # noqa: PLC0415  (bench-images extra)
        import mujoco  # noqa: PLC0415

        self.envs = [gymnasium.make(env_id) for _ in range(B)]
        self.observations = []
        for b, env in enumerate(self.envs):
            observation, _ = env.reset(seed=seed + b)
            self.observations.append(np.asarray(observation, dtype=np.float32))
        model = self.envs[0].unwrapped.model  # every environment has the same model
        self.renderer = mujoco.Renderer(model, size, size)
        self.free = mujoco.MjvCamera()
        self.free.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        self.free.trackbodyid = 1
        self.free.distance = 3.0
        self.free.elevation = -20.0
        self.free.azimuth = 135.0

    def _render(self, b: int, camera: Any) -> np.ndarray:
        self.renderer.update_scene(self.envs[b].unwrapped.data, camera=camera)
        return np.array(self.renderer.render(), dtype=np.uint8)

    def observe(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Environment ``b``'s free-camera and ``track``-camera frames, its observation."""
        return self._render(b, self.free), self._render(b, 0), self.observations[b]

    def step(self, b: int, action: np.ndarray) -> tuple[float, bool]:
        """Step environment ``b`` (actions scaled into its action space)."""
        space = self.envs[b].action_space
        scaled = np.clip(action[: space.shape[0]], space.low, space.high)
        observation, reward, terminated, _, _ = self.envs[b].step(scaled)
        self.observations[b] = np.asarray(observation, dtype=np.float32)
        return float(reward), bool(terminated)

    def reset(self, b: int) -> None:
        """A new episode of environment ``b``."""
        observation, _ = self.envs[b].reset()
        self.observations[b] = np.asarray(observation, dtype=np.float32)


class PhotoScenes:
    """Two cameras per environment over photographs, moving by sub-pixel steps."""

    def __init__(self, size: int, B: int, seed: int) -> None:
        import skimage.data  # noqa: PLC0415  (bench-images extra)

        self.photos = [getattr(skimage.data, name)().astype(np.float32) for name in PHOTOS]
        self.size = size
        self.rng = np.random.default_rng(seed)
        # per environment and camera: photo index, position (y, x), velocity (px per step)
        self.which = np.array([[b % len(PHOTOS), (b + 2) % len(PHOTOS)] for b in range(B)])
        self.position = np.zeros((B, 2, 2))
        self.velocity = np.zeros((B, 2, 2))
        for b in range(B):
            self.reset(b)

    def _room(self, b: int, camera: int) -> np.ndarray:
        height, width = self.photos[self.which[b, camera]].shape[:2]
        return np.array([height - self.size - 1, width - self.size - 1], dtype=np.float64)

    def _crop(self, b: int, camera: int) -> np.ndarray:
        """The bilinear crop at the camera's (fractional) position."""
        photo = self.photos[self.which[b, camera]]
        y, x = self.position[b, camera]
        y0, x0 = int(y), int(x)
        fy, fx = y - y0, x - x0
        s = self.size
        window = photo[y0 : y0 + s + 1, x0 : x0 + s + 1]
        top = (1 - fx) * window[:s, :s] + fx * window[:s, 1:]
        bottom = (1 - fx) * window[1:, :s] + fx * window[1:, 1:]
        return np.rint((1 - fy) * top + fy * bottom).clip(0, 255).astype(np.uint8)

    def observe(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Both cameras' crops; the state is their positions and velocities."""
        state = np.concatenate([self.position[b].ravel(), self.velocity[b].ravel()])
        return self._crop(b, 0), self._crop(b, 1), state.astype(np.float32)

    def step(self, b: int, action: np.ndarray) -> tuple[float, bool]:
        """Move both cameras: velocity nudged by the action, kept under 0.8 px a step."""
        for camera in range(2):
            velocity = self.velocity[b, camera] + 0.05 * action[2 * camera : 2 * camera + 2]
            self.velocity[b, camera] = velocity.clip(-0.8, 0.8)
            position = self.position[b, camera] + self.velocity[b, camera]
            room = self._room(b, camera)
            bounced = (position < 0) | (position > room)
            self.velocity[b, camera][bounced] *= -1
            self.position[b, camera] = position.clip(0, room)
        return float(-np.abs(self.velocity[b]).sum()), False

    def reset(self, b: int) -> None:
        """Both cameras jump to a random place and start drifting."""
        for camera in range(2):
            self.position[b, camera] = self.rng.uniform(0, 1, 2) * self._room(b, camera)
            self.velocity[b, camera] = self.rng.uniform(-0.6, 0.6, 2)


def rollout(
    scenes: Scenes, count: int, T: int, B: int, seed: int
) -> Iterator[dict[str, np.ndarray]]:
    """``count`` RLinf-shaped trajectories of ``B`` environments stepped together."""
    rng = np.random.default_rng(seed)
    age = [(b * EPISODE_STEPS) // B for b in range(B)]  # staggered episodes
    seen = [scenes.observe(b) for b in range(B)]
    carried = np.zeros(B, dtype=bool)
    for _ in range(count):
        curr: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(T)]
        after: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(T)]
        actions = rng.uniform(-1, 1, (T, B, ACTION_DIM)).astype(np.float32)
        rewards = np.zeros((T, B), dtype=np.float32)
        dones = np.zeros((T + 1, B), dtype=bool)
        dones[0] = carried
        for t in range(T):
            for b in range(B):
                curr[t].append(seen[b])
                rewards[t, b], terminated = scenes.step(b, actions[t, b])
                after[t].append(scenes.observe(b))
                age[b] += 1
                if terminated or age[b] >= EPISODE_STEPS:
                    dones[t + 1, b] = True
                    scenes.reset(b)
                    age[b] = 0
                    seen[b] = scenes.observe(b)
                else:
                    seen[b] = after[t][b]
        carried = dones[T].copy()
        arrays = {"actions": actions, "rewards": rewards, "dones": dones}
        arrays["prev_logprobs"] = rng.normal(size=(T, B)).astype(np.float32)
        for prefix, steps in (("curr_obs", curr), ("next_obs", after)):
            for i, key in enumerate((*CAMERAS, "states")):
                arrays[f"{prefix}/{key}"] = np.stack(
                    [np.stack([o[i] for o in row]) for row in steps]
                )
        yield arrays


def image_keys() -> list[str]:
    """The flat keys of the camera frames."""
    return [f"{prefix}/{camera}" for prefix in ("curr_obs", "next_obs") for camera in CAMERAS]


def to_trajectory(arrays: dict[str, np.ndarray], T: int) -> Trajectory:
    """A cached trajectory's arrays as a :class:`Trajectory`."""
    tensors = {key: torch.from_numpy(value) for key, value in arrays.items()}
    observations: dict[str, dict[str, torch.Tensor]] = {"curr_obs": {}, "next_obs": {}}
    for key in list(tensors):
        prefix, _, leaf = key.partition("/")
        if prefix in observations:
            observations[prefix][leaf] = tensors.pop(key)
    return Trajectory(max_episode_length=T, **observations, **tensors)


def load_trajectories(
    source: FrameSource,
    count: int,
    T: int,
    B: int,
    cache: Path,
    say: Callable[[str], None] = lambda label: None,
    seed: int = 0,
) -> list[Trajectory]:
    """``count`` trajectories of ``source``: read from ``cache``, rendered (and cached) if not."""
    folder = cache / f"{source.name}-T{T}-B{B}-s{seed}-v{VERSION}"
    paths = [folder / f"{k:04d}.npz" for k in range(count)]
    if not all(path.exists() for path in paths):
        say(f"[images] rendering {count} trajectories of {source.name} (cached in {folder})")
        folder.mkdir(parents=True, exist_ok=True)
        for path, arrays in zip(
            paths, rollout(source.scenes(B, seed), count, T, B, seed), strict=True
        ):
            partial = path.with_suffix(".tmp.npz")
            np.savez(partial, **{key.replace("/", "."): value for key, value in arrays.items()})
            partial.replace(path)
    return [_read(path, T) for path in paths]


def _read(path: Path, T: int) -> Trajectory:
    with np.load(path) as stored:
        arrays = {key.replace(".", "/"): stored[key] for key in stored.files}
    return to_trajectory(arrays, T)


def frames_of(trajectories: Sequence[Trajectory], key: str) -> np.ndarray:
    """Every frame of ``key`` in ``trajectories``, ``[N, H, W, 3]``."""
    return np.concatenate([t.tensors()[key].flatten(0, 1).numpy() for t in trajectories])
