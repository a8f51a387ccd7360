"""Warnings that point at the user's line, however deep inside rbzarr they are raised."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn_caller"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside the rbzarr package.

    The stack level is counted here, not written at each call, so a warning keeps pointing
    at the caller's line when the calls inside the package change.
    """
    frame = sys._getframe(1)  # the function that warns
    level = 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
