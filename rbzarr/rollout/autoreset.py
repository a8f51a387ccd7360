"""Autoreset modes of vector environments, and realigning next-step rollouts per environment.

gymnasium 1.x vector envs reset a finished sub-environment by themselves, in one of two ways:

- **next-step** (gymnasium's default): the step that ends an episode returns the true last
  observation; the *following* step ignores that environment's action and returns its
  reset observation with reward 0 and no termination.  That following step is no
  transition, and must not be stored as one (it would lead from the terminal observation to
  the reset observation).
- **same-step**: the ending step already returns the reset observation, and the true last
  one in ``info["final_obs"]``.

In next-step mode the environments of a vector env lose a step at every episode end, each
at its own time, so a collector keeps each environment's real transitions in order and
stacks row ``t`` of column ``b`` from environment ``b``'s ``t``-th transition
(:func:`aligned_rows`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["NEXT_STEP", "SAME_STEP", "aligned_rows", "autoreset_mode_name"]

NEXT_STEP = "next_step"
SAME_STEP = "same_step"


def autoreset_mode_name(mode: Any) -> str:
    """``"next_step"`` or ``"same_step"`` for a name or a gymnasium ``AutoresetMode``.

    Parameters
    ----------
    mode
        A mode name (case, ``_`` and ``-`` ignored, e.g. ``"NextStep"``) or a gymnasium
        ``AutoresetMode`` member.

    Returns
    -------
    str
        :data:`NEXT_STEP` or :data:`SAME_STEP`.

    Raises
    ------
    ValueError
        For gymnasium's ``Disabled`` mode (the collector cannot see the resets the caller
        makes) or an unknown mode; the message names the fix.
    """
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
    """Stack each column's valid rows: which step feeds row ``t`` of column ``b``.

    Parameters
    ----------
    valid
        ``[S, B]`` booleans: whether step ``s`` of environment ``b`` is a transition.

    Returns
    -------
    tuple
        ``(steps, left)``: ``steps[t, b]`` (``[T, B]`` int64, ``T`` the fewest valid rows of
        any column) is the step holding column ``b``'s ``t``-th transition, and ``left``
        (``[S, B]``) marks the valid rows not taken, kept for the next trajectory.
    """
    S, B = int(valid.shape[0]), int(valid.shape[1])
    T = int(valid.sum(dim=0).min()) if S and B else 0
    # A stable sort on "not valid" puts each column's valid steps first, in time order.
    order = torch.sort((~valid).to(torch.uint8), dim=0, stable=True).indices
    steps = order[:T]
    left = valid.clone()
    left[steps, torch.arange(B).expand(T, B)] = False
    return steps, left
