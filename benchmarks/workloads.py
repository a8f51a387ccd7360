"""Synthetic, deterministic trajectories the benchmarks sample from, and how each is sampled."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from benchmarks.settings import Settings
from rbzarr.trajectory.model import Trajectory

__all__ = [
    "WORKLOAD_NAMES",
    "Workload",
    "atari_workload",
    "embodied_trajectory",
    "image_frames",
    "image_trajectory",
    "state_trajectory",
    "trajectory_sequence",
    "workloads",
]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named trajectory generator: ``make(seed)`` returns one ``[T, B, ...]`` trajectory."""

    name: str
    T: int
    B: int
    batch: int
    make: Callable[[int], Trajectory]
    window: int = 100
    modes: tuple[str, ...] = ("hot", "warm")


def _scalars(
    generator: torch.Generator, T: int, B: int, actions: tuple[int, ...]
) -> dict[str, Any]:
    return {
        "actions": torch.randn(T, B, *actions, generator=generator),
        "rewards": torch.randn(T, B, generator=generator),
        "dones": torch.rand(T + 1, B, generator=generator) < 0.02,
        "prev_logprobs": torch.randn(T, B, generator=generator),
        "prev_values": torch.randn(T, B, generator=generator),
    }


def state_trajectory(seed: int, T: int = 64, B: int = 32) -> Trajectory:
    """A state trajectory: 42 float32 observations (smooth, as from a simulator), 8 actions."""
    generator = torch.Generator().manual_seed(seed)
    state = torch.cumsum(0.05 * torch.randn(T + 1, B, 42, generator=generator), dim=0)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={"state": state[:T].clone()},
        next_obs={"state": state[1:].clone()},
        **_scalars(generator, T, B, (8,)),
    )


def image_frames(generator: torch.Generator, steps: int, envs: int, size: int = 84) -> torch.Tensor:
    """``[steps, envs, 3, size, size]`` uint8 frames: 7x7-pixel flat blocks, a 14-pixel square
    moving across them and noise on 5% of the pixels.
    """
    count = -(-size // 7)
    blocks = torch.randint(0, 8, (envs, 3, count, count), generator=generator, dtype=torch.uint8)
    base = (blocks * 32).repeat_interleave(7, dim=-1).repeat_interleave(7, dim=-2)
    frames = base[..., :size, :size].unsqueeze(0).repeat(steps, 1, 1, 1, 1)
    span = size - 14
    start = torch.randint(0, span, (envs, 2), generator=generator)
    for t in range(steps):
        for b in range(envs):
            y, x = ((start[b] + 2 * t) % span).tolist()
            frames[t, b, :, y : y + 14, x : x + 14] = 255
    noisy = torch.rand(frames.shape, generator=generator) < 0.05
    noise = torch.randint(0, 16, frames.shape, generator=generator, dtype=torch.uint8)
    return frames + noise * noisy


def image_trajectory(seed: int, T: int = 32, B: int = 16) -> Trajectory:
    """An image trajectory: ``3x84x84`` uint8 curr/next observations, 8 actions."""
    generator = torch.Generator().manual_seed(seed)
    frames = image_frames(generator, T + 1, B)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={"image": frames[:T].clone()},
        next_obs={"image": frames[1:].clone()},
        **_scalars(generator, T, B, (8,)),
    )


def camera_and_state_trajectory(seed: int, T: int = 32, B: int = 8) -> Trajectory:
    """The S3 suite's trajectory: ``3x64x64`` uint8 camera frames and a 42-d state."""
    generator = torch.Generator().manual_seed(seed)
    frames = image_frames(generator, T + 1, B, size=64)
    state = torch.cumsum(0.05 * torch.randn(T + 1, B, 42, generator=generator), dim=0)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={"image": frames[:T].clone(), "state": state[:T].clone()},
        next_obs={"image": frames[1:].clone(), "state": state[1:].clone()},
        **_scalars(generator, T, B, (8,)),
    )


def embodied_trajectory(seed: int, T: int = 32, B: int = 16) -> Trajectory:
    """An embodied-scale trajectory: two ``3x128x128`` uint8 cameras, a 32-d state and a chunk of 8
    seven-d actions per step.
    """
    generator = torch.Generator().manual_seed(seed)
    cameras = [image_frames(generator, T + 1, B, size=128) for _ in range(2)]
    state = torch.cumsum(0.05 * torch.randn(T + 1, B, 32, generator=generator), dim=0)
    observations = [
        {"camera_0": cameras[0][rows], "camera_1": cameras[1][rows], "state": state[rows]}
        for rows in (slice(0, T), slice(1, T + 1))
    ]
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{seed}",
        curr_obs={key: value.clone() for key, value in observations[0].items()},
        next_obs={key: value.clone() for key, value in observations[1].items()},
        **_scalars(generator, T, B, (8, 7)),
    )


def atari_workload(T: int = 32, B: int = 16, batch: int = 256) -> Workload:
    """Frames of ALE Pong (grayscale ``1x210x160``) under random actions, ``B`` episodes."""
    import ale_py  # noqa: PLC0415  (optional; usually not installed)
    import gymnasium  # noqa: PLC0415

    gymnasium.register_envs(ale_py)
    try:
        env = gymnasium.make("ALE/Pong-v5", obs_type="grayscale")
    except gymnasium.error.Error as exc:
        raise RuntimeError(f"ALE/Pong-v5 is not available: {exc}") from exc
    columns = []
    for b in range(B):
        obs, _ = env.reset(seed=b)
        frames = [torch.from_numpy(np.asarray(obs))]
        for _ in range(T):
            obs, *_ = env.step(env.action_space.sample())
            frames.append(torch.from_numpy(np.asarray(obs)))
        columns.append(torch.stack(frames))
    env.close()
    recorded = torch.stack(columns, dim=1).unsqueeze(2)  # [T+1, B, 1, 210, 160]

    def make(seed: int) -> Trajectory:
        generator = torch.Generator().manual_seed(seed)
        frames = torch.roll(recorded, shifts=seed % B, dims=1)
        return Trajectory(
            max_episode_length=T,
            model_weights_id=f"w{seed}",
            curr_obs={"image": frames[:T].clone()},
            next_obs={"image": frames[1:].clone()},
            **_scalars(generator, T, B, (1,)),
        )

    return Workload("atari", T, B, batch, make)


WORKLOAD_NAMES = ("state", "image", "embodied", "atari")
BATCHES = {"state": 4096, "image": 256, "embodied": 64, "atari": 256}
QUICK_BATCHES = {"state": 128, "image": 32, "embodied": 8, "atari": 32}


def workloads(
    names: Iterable[str], batches: Mapping[str, int], quick: bool = False
) -> tuple[list[Workload], list[str]]:
    """The named workloads, and a note for each one skipped."""
    found: list[Workload] = []
    notes: list[str] = []
    defaults = QUICK_BATCHES if quick else BATCHES
    for name in names:
        batch = batches.get(name) or defaults.get(name, 0)
        if name == "state":
            found.append(Workload("state", 64, 32, batch, state_trajectory))
        elif name == "image":
            modes = ("hot", "warm", "cold")
            found.append(Workload("image", 32, 16, batch, image_trajectory, modes=modes))
        elif name == "embodied":
            T, B = (8, 4) if quick else (32, 16)
            make = functools.partial(embodied_trajectory, T=T, B=B)
            found.append(Workload("embodied", T, B, batch, make, 40, ("cold",)))
        elif name == "atari":
            try:
                found.append(atari_workload(batch=batch))
            except (ImportError, RuntimeError, OSError) as exc:
                notes.append(f"atari skipped: {type(exc).__name__}: {exc}")
        else:
            raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOAD_NAMES}")
    return found, notes


def trajectory_sequence(workload: Workload, settings: Settings) -> list[Trajectory]:
    """The trajectories a mode adds: ``settings.trajectories`` (default: the workload's window)
    cycling over ``settings.pool`` distinct ones (the buffer copies each, so repeats cost no memory
    here).
    """
    count = settings.trajectories or settings.window or workload.window
    pool = [workload.make(settings.seed + i) for i in range(min(settings.pool, count))]
    return [pool[i % len(pool)] for i in range(count)]
