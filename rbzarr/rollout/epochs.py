"""Rollout epochs of a collector, and stacking their steps into raw ``[S, B, ...]`` rows.

An epoch is the reset row given to ``TrajectoryCollector.reset`` and the steps recorded
after it.  ``dones``, ``terminations`` and ``truncations`` lead each epoch's rows with its
reset row (:func:`epoch_rows`); every other field has one row per step (:func:`stacked`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rbzarr.rollout.step_checks import Signature
from rbzarr.trajectory.fields import RESET_ROW_FIELDS

__all__ = ["RolloutEpoch", "epoch_rows", "stack_epochs", "stacked"]


def stacked(steps: list[dict[str, torch.Tensor]], paths: list[str]) -> dict[str, torch.Tensor]:
    """``[S, B, ...]`` per path from ``S`` step rows.

    Parameters
    ----------
    steps
        ``S`` step rows, each mapping field paths to ``[B, ...]`` tensors.
    paths
        The field paths to stack; every step must hold each of them.

    Returns
    -------
    dict of str to torch.Tensor
        One ``[S, B, ...]`` tensor per path.
    """
    return {path: torch.stack([step[path] for step in steps]) for path in paths}


@dataclass
class RolloutEpoch:
    """One rollout epoch: the reset row given to ``reset`` and the steps after it.

    Parameters
    ----------
    reset_row
        ``dones``, ``terminations`` and ``truncations`` of the reset row (``[B, ...]``);
        ``None`` where the caller gave none (zeros, or ``dones`` from the other two).
    steps
        The accepted step rows, in order, each mapping field paths to ``[B, ...]`` tensors.
    valid
        Per step, ``[B]`` booleans: which environments made a transition (next-step mode
        skips reset steps; all true in same-step mode).
    """

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
    """``name``'s rows of one epoch: its reset row, then ``step_rows``.

    Parameters
    ----------
    epoch
        The epoch whose reset row leads.
    name
        ``"dones"``, ``"terminations"`` or ``"truncations"``.
    signature
        The steps' signature: dtype and trailing shape of every field.
    step_rows
        ``[S, B, ...]`` rows of ``name`` for the epoch's steps.
    num_envs
        ``B``, for a reset row the caller did not give (zeros).
    device
        Where a zero or copied reset row is put.

    Returns
    -------
    torch.Tensor
        ``[S + 1, B, ...]``: the reset row (given; for ``dones`` otherwise
        ``terminations | truncations`` when either was given; else zeros), then ``step_rows``.
    """
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
    """The raw fields of equally long epochs, one after the other along time.

    Parameters
    ----------
    epochs
        The epochs to stack, each with at least one step and all with the same number.
    signature
        The steps' signature: dtype and trailing shape of every field.
    num_envs
        ``B``, for the reset rows the caller did not give (zeros).
    device
        Where zero or copied reset rows are put.

    Returns
    -------
    dict of str to torch.Tensor
        ``[T, B, ...]`` per field path for ``T`` steps in all; ``dones``, ``terminations``
        and ``truncations`` get ``T + E`` rows, each epoch led by its reset row.
    """
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
