"""Steps a human intervened in: RLinf's ``Trajectory.extract_intervene_traj`` rule.

From a trajectory ``[T, B, ...]`` and its ``intervene_flags`` ``[T, B, D]``, every
environment column with at least one intervened step becomes its own ``[k, 1, ...]``
trajectory holding only those steps (RLinf's DAgger, SAC and RLT workers feed them to a demo
buffer).  Reset-row fields (``dones``, ``terminations``, ``truncations`` with ``T + E`` rows)
keep the intervened steps and, as in RLinf, every reset row, so the part has ``k + E`` rows.
That is a valid trajectory only when every epoch kept as many steps (always so for one
epoch); otherwise RLinf's result is one its own buffer refuses or misreads, and rbzarr keeps
the first reset row only (``k + 1`` rows: one epoch) **(fix)**.  ``versions`` is not carried
over, as in RLinf.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rbzarr.trajectory.fields import RESET_ROW_FIELDS, raw_time_rows

__all__ = ["intervened_columns", "intervention_mask"]

_MODES = {"any": torch.Tensor.any, "all": torch.Tensor.all}


def intervention_mask(flags: torch.Tensor | None, mode: str = "any") -> torch.Tensor | None:
    """The ``[T, B]`` mask of intervened steps, or ``None`` when no step was intervened.

    ``mode="any"`` marks a step where any of the ``D`` flags is set, ``"all"`` where all are.
    Flags are read as booleans (RLinf's ``~flags`` test assumes a bool tensor).

    Parameters
    ----------
    flags
        The trajectory's ``intervene_flags`` (``[T, B, D]``), or ``None`` when it has none.
    mode
        ``"any"`` or ``"all"``: how the ``D`` flags of a step combine.

    Returns
    -------
    torch.Tensor or None
        ``[T, B]`` booleans, or ``None`` when ``flags`` is ``None`` or no flag is set.

    Raises
    ------
    NotImplementedError
        For another ``mode`` (RLinf raises the same).
    ValueError
        If ``flags`` is not shaped ``[T, B, D]``.
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
    """Which raw rows of field ``path`` to keep, given the kept time ``steps`` (``[T]``).

    Raises
    ------
    ValueError
        If ``rows`` is neither ``T`` nor, for a reset-row field, ``T + E`` with ``E | T``.
    """
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

    ``fields`` maps field paths to raw ``[T(+E), B, ...]`` tensors; values with fewer than
    two dimensions, and ``versions``, are left out.  Each result holds ``[k(+E), 1, ...]``
    tensors: the column's intervened steps (and its reset rows), in time order.

    Parameters
    ----------
    fields
        Field paths to raw tensors of one trajectory.
    mask
        ``[T, B]`` booleans from :func:`intervention_mask`: the steps to keep.

    Returns
    -------
    list of dict
        One ``{path: tensor}`` per column with an intervened step, in column order; empty
        when no step is marked.

    Raises
    ------
    ValueError
        If a field has neither ``T`` rows nor (for a reset-row field) ``T + E`` rows with
        ``E`` dividing ``T``.
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
