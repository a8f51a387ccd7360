"""Steps a human intervened in: RLinf's ``Trajectory.extract_intervene_traj`` rule."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rbzarr.trajectory.fields import RESET_ROW_FIELDS, raw_time_rows

__all__ = ["intervened_columns", "intervention_mask"]

_MODES = {"any": torch.Tensor.any, "all": torch.Tensor.all}


def intervention_mask(flags: torch.Tensor | None, mode: str = "any") -> torch.Tensor | None:
    """The ``[T, B]`` mask of intervened steps, or ``None`` when no step was intervened.

    Flags are read as booleans (RLinf's ``~flags`` test assumes a bool tensor).
    """
    if mode not in _MODES:
        raise NotImplementedError(
            f"unsupported extract_intervene_traj mode {mode!r}; use 'any' or 'all'"
        )
    if flags is None:
        return None
    flags = flags.to(torch.bool)
    if not bool(flags.any()):
        return None
    if flags.dim() != 3:
        raise ValueError(
            f"field 'intervene_flags': expected [T, B, D], got shape {tuple(flags.shape)}"
        )
    return _MODES[mode](flags, dim=-1)


def _row_mask(path: str, rows: int, steps: torch.Tensor) -> torch.Tensor:
    """Which raw rows of field ``path`` to keep, given the kept time ``steps`` (``[T]``)."""
    T = int(steps.shape[0])
    if rows == T:
        return steps
    epochs = rows - T
    if path not in RESET_ROW_FIELDS or epochs < 0 or T % epochs != 0:
        raise ValueError(
            f"field {path!r}: expected T={T} rows"
            + (", or T+E rows with E dividing T" if path in RESET_ROW_FIELDS else "")
            + f", got {rows}"
        )
    per_epoch = steps.reshape(epochs, T // epochs).sum(dim=1)
    keep = torch.ones(rows, dtype=torch.bool)
    if bool((per_epoch != per_epoch[0]).any()):
        keep[1:] = False  # uneven epochs: one leading reset row, one epoch
    keep[raw_time_rows(torch.arange(T), T, rows)] = steps
    return keep


def intervened_columns(
    fields: Mapping[str, torch.Tensor], mask: torch.Tensor
) -> list[dict[str, torch.Tensor]]:
    """One dict of raw fields per environment column with an intervened step.

    Each holds the column's intervened steps, ``versions`` left out as in RLinf.  RLinf keeps
    every reset row (``k + E`` rows), which is valid only when every epoch kept as many steps;
    otherwise rbzarr keeps the first reset row only (``k + 1`` rows: one epoch) **(fix)**.
    """
    kept = {
        path: value
        for path, value in fields.items()
        if path != "versions" and isinstance(value, torch.Tensor) and value.dim() >= 2
    }
    columns = []
    for column in range(int(mask.shape[1])):
        steps = mask[:, column].cpu()
        if not bool(steps.any()):
            continue
        columns.append(
            {
                path: value[:, column : column + 1][_row_mask(path, int(value.shape[0]), steps)]
                for path, value in kept.items()
            }
        )
    return columns
