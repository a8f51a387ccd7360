"""Synthetic, deterministic trajectories the benchmarks sample from.

* ``state``: ``T=64, B=32``; 42 float32 ``curr_obs/state`` and ``next_obs/state`` (smooth, as
  from a simulator), 8 float32 actions, rewards, ``T+1``-row dones, log-probs and values;
* ``image``: ``T=32, B=16``; ``3x84x84`` uint8 ``curr_obs/image`` and ``next_obs/image``
  (flat regions, a moving square, sparse noise) plus the same per-step scalars;
* ``atari``: real frames from ``ale-py`` when it and its ROMs are installed, else skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from rbzarr.trajectory import Trajectory

__all__ = [
    "Workload",
    "atari_workload",
    "image_frames",
    "image_trajectory",
    "state_trajectory",
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


def _scalars(generator: torch.Generator, T: int, B: int, actions: int) -> dict[str, Any]:
    return {
        "actions": torch.randn(T, B, actions, generator=generator),
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
        **_scalars(generator, T, B, 8),
    )


def image_frames(generator: torch.Generator, steps: int, envs: int) -> torch.Tensor:
    """``[steps, envs, 3, 84, 84]`` uint8 frames: 7x7-pixel flat blocks, a square moving
    across them and noise on 5% of the pixels."""
    blocks = torch.randint(0, 8, (envs, 3, 12, 12), generator=generator, dtype=torch.uint8) * 32
    base = blocks.repeat_interleave(7, dim=-1).repeat_interleave(7, dim=-2)
    frames = base.unsqueeze(0).repeat(steps, 1, 1, 1, 1)
    start = torch.randint(0, 70, (envs, 2), generator=generator)
    for t in range(steps):
        for b in range(envs):
            y, x = ((start[b] + 2 * t) % 70).tolist()
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
        **_scalars(generator, T, B, 8),
    )


def atari_workload(T: int = 32, B: int = 16, batch: int = 256) -> Workload:
    """Frames of ALE Pong (grayscale ``1x210x160``) under random actions, ``B`` episodes.

    Raises
    ------
    ImportError
        ale-py or gymnasium is not installed.
    RuntimeError
        Its ROMs are missing (nothing is downloaded).
    """
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
            **_scalars(generator, T, B, 1),
        )

    return Workload("atari", T, B, batch, make)


def workloads(
    names: Iterable[str], state_batch: int, image_batch: int
) -> tuple[list[Workload], list[str]]:
    """The named workloads, and a note for each one skipped.

    Raises
    ------
    ValueError
        A name is not one of ``state``, ``image``, ``atari``.
    """
    found: list[Workload] = []
    notes: list[str] = []
    for name in names:
        if name == "state":
            found.append(Workload("state", 64, 32, state_batch, state_trajectory))
        elif name == "image":
            found.append(Workload("image", 32, 16, image_batch, image_trajectory))
        elif name == "atari":
            try:
                found.append(atari_workload(batch=image_batch))
            except (ImportError, RuntimeError, OSError) as exc:
                notes.append(f"atari skipped: {type(exc).__name__}: {exc}")
        else:
            raise ValueError(f"unknown workload {name!r}; expected state, image or atari")
    return found, notes
