"""Test doubles shaped exactly like RLinf's objects, without importing RLinf.

``RLinfTrajectory`` has the fields of ``rlinf.data.schema.embodied_types.Trajectory`` in
the same order with the same defaults (tensor fields default to ``None``, dict fields to an
empty dict), and nothing else: no rbzarr method, so rbzarr must read it by field name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from conftest import make_trajectory

from rbzarr import Trajectory


@dataclass
class RLinfTrajectory:
    max_episode_length: int = 0
    model_weights_id: str = ""
    actions: torch.Tensor = None
    intervene_flags: torch.Tensor = None
    rewards: torch.Tensor = None
    terminations: torch.Tensor = None
    truncations: torch.Tensor = None
    dones: torch.Tensor = None
    prev_logprobs: torch.Tensor = None
    prev_values: torch.Tensor = None
    versions: torch.Tensor = None
    forward_inputs: dict[str, Any] = field(default_factory=dict)
    curr_obs: dict[str, Any] = field(default_factory=dict)
    next_obs: dict[str, Any] = field(default_factory=dict)


def rlinf_copy(traj: Trajectory) -> RLinfTrajectory:
    """The same trajectory as an ``RLinfTrajectory`` (sharing its tensors)."""
    return RLinfTrajectory(**{f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)})


def make_rlinf_trajectory(T: int, B: int, base: int, epochs: int = 1) -> RLinfTrajectory:
    """:func:`conftest.make_trajectory` (rows encode ``base + i``) as an RLinf object."""
    return rlinf_copy(make_trajectory(T, B, base, epochs))
