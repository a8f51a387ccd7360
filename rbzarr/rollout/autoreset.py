"""Autoreset modes of gymnasium vector envs, and realigning next-step rollouts per environment.

In next-step mode the step after an episode end is no transition; each environment loses it
at its own time, so row ``t`` of column ``b`` is environment ``b``'s ``t``-th transition.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["NEXT_STEP", "SAME_STEP", "aligned_rows", "autoreset_mode_name"]

NEXT_STEP = "next_step"
SAME_STEP = "same_step"


def autoreset_mode_name(mode: Any) -> str:
    """``"next_step"`` or ``"same_step"`` for a name or a gymnasium ``AutoresetMode``."""
    value = getattr(mode, "value", mode)  # gymnasium's AutoresetMode is a str-valued Enum
    key = str(value).replace("_", "").replace("-", "").lower()
    if key == "nextstep":
        return NEXT_STEP
    if key == "samestep":
        return SAME_STEP
    if key == "disabled":
        raise ValueError(
            "autoreset_mode Disabled is not supported: the collector cannot see the resets "
            "you make; build the vector env with gymnasium's default autoreset mode "
            "(AutoresetMode.NEXT_STEP) or vector_kwargs={'autoreset_mode': "
            "AutoresetMode.SAME_STEP}"
        )
    raise ValueError(
        f"unknown autoreset_mode {mode!r}: expected 'next_step', 'same_step' or a gymnasium "
        "AutoresetMode"
    )


def aligned_rows(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack each column's valid rows: which step feeds row ``t`` of column ``b``."""
    S, B = int(valid.shape[0]), int(valid.shape[1])
    T = int(valid.sum(dim=0).min()) if S and B else 0
    # A stable sort on "not valid" puts each column's valid steps first, in time order.
    order = torch.sort((~valid).to(torch.uint8), dim=0, stable=True).indices
    steps = order[:T]
    left = valid.clone()
    left[steps, torch.arange(B).expand(T, B)] = False
    return steps, left
