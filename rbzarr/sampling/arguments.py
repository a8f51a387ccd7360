"""Checks of the arguments users pass in, where they enter: named errors before any work.

Integers are taken through :func:`operator.index` (Python and NumPy integers, 0-d integer
tensors); ``bool`` and floats (``2.5``, also ``2.0``) are refused with ``TypeError``, and
values out of range with ``ValueError``.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["SEED_MAX", "SEED_MIN", "check_count", "check_seed", "check_window_size"]

# What torch.Generator.manual_seed accepts: a signed or unsigned 64-bit integer.
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


def _as_int(name: str, value: Any, expected: str) -> int:
    """``value`` as an ``int``; ``TypeError`` naming ``name`` for a bool or a non-integer."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be {expected}, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be {expected}, got {type(value).__name__} {value!r}"
        ) from None


def check_count(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int ≥ ``minimum``, else ``TypeError`` / ``ValueError`` naming ``name``."""
    expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    number = _as_int(name, value, expected)
    if number < minimum:
        raise ValueError(f"{name} must be {expected}, got {number}")
    return number


def check_seed(seed: Any) -> int | None:
    """``None`` or an int torch can seed with (:data:`SEED_MIN` to :data:`SEED_MAX`)."""
    if seed is None:
        return None
    expected = f"None or an int from {SEED_MIN} to {SEED_MAX} (what torch.manual_seed takes)"
    number = _as_int("seed", seed, expected)
    if not SEED_MIN <= number <= SEED_MAX:
        raise ValueError(f"seed must be {expected}, got {number}")
    return number


def check_window_size(value: Any) -> int:
    """``sample_window_size`` as an int (0 or negative: every trajectory, as in RLinf), else
    ``TypeError``."""
    return _as_int("sample_window_size", value, "an int (0 or negative: every trajectory)")
