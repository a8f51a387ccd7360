"""The opt-in finiteness check of added trajectories (``check_finite=True``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rbzarr.errors import InvalidTrajectoryError

__all__ = ["check_finite", "non_finite_counts"]


def non_finite_counts(values: torch.Tensor) -> tuple[int, int]:
    """How many elements of ``values`` are NaN and how many are ±inf (0, 0 for integers)."""
    if not (values.is_floating_point() or values.is_complex()):
        return 0, 0
    return int(torch.isnan(values).sum()), int(torch.isinf(values).sum())


def check_finite(fields: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`InvalidTrajectoryError` naming every field holding NaN or inf."""
    found = []
    for key, values in fields.items():
        nan, inf = non_finite_counts(values)
        if nan or inf:
            found.append(f"field {key!r}: {nan} NaN and {inf} inf of {values.numel()} values")
    if found:
        raise InvalidTrajectoryError(
            "check_finite=True refuses non-finite values: " + "; ".join(found)
        )
