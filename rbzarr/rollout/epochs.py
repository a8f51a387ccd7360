"""Rollout epochs of a collector, and stacking their steps into raw ``[S, B, ...]`` rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rbzarr.rollout.step_checks import Signature
from rbzarr.trajectory.fields import RESET_ROW_FIELDS

__all__ = ["RolloutEpoch", "epoch_rows", "stack_epochs", "stacked"]


def stacked(steps: list[dict[str, torch.Tensor]], paths: list[str]) -> dict[str, torch.Tensor]:
    """``[S, B, ...]`` per path from ``S`` step rows."""
    return {path: torch.stack([step[path] for step in steps]) for path in paths}


@dataclass
class RolloutEpoch:
    """One rollout epoch: the reset row given to ``reset`` and the steps after it."""

    reset_row: dict[str, torch.Tensor | None]
    steps: list[dict[str, torch.Tensor]] = field(default_factory=list)
    valid: list[torch.Tensor] = field(default_factory=list)


def epoch_rows(
    epoch: RolloutEpoch,
    name: str,
    signature: Signature,
    step_rows: torch.Tensor,
    num_envs: int,
    device: torch.device,
) -> torch.Tensor:
    """``name``'s rows of one epoch: its reset row, then ``step_rows``."""
    dtype, trailing = signature[name]
    given = epoch.reset_row[name]
    if given is None and name == "dones":
        terms, truncs = epoch.reset_row["terminations"], epoch.reset_row["truncations"]
        if terms is not None or truncs is not None:
            given = torch.logical_or(
                _reset_value(terms, signature["terminations"], num_envs, device),
                _reset_value(truncs, signature["truncations"], num_envs, device),
            )
    first = _reset_value(given, (dtype, trailing), num_envs, device)
    return torch.cat([first.unsqueeze(0), step_rows])


def stack_epochs(
    epochs: list[RolloutEpoch], signature: Signature, num_envs: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The raw fields of equally long epochs, one after the other along time."""
    rows = [step for epoch in epochs for step in epoch.steps]
    fields = stacked(rows, [path for path in signature if path not in RESET_ROW_FIELDS])
    for name in RESET_ROW_FIELDS:
        fields[name] = torch.cat(
            [
                epoch_rows(
                    epoch, name, signature, stacked(epoch.steps, [name])[name], num_envs, device
                )
                for epoch in epochs
            ]
        )
    return fields


def _reset_value(
    value: torch.Tensor | None,
    sig: tuple[torch.dtype, tuple[int, ...]],
    num_envs: int,
    device: torch.device,
) -> torch.Tensor:
    if value is None:
        return torch.zeros((num_envs, *sig[1]), dtype=sig[0], device=device)
    return value.detach().to(device, sig[0], copy=True)
