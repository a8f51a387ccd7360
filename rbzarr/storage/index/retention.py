"""Retention: how much of what a buffer writes its store keeps (``retention=``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_GRACE", "Retention", "check_retention"]

# Seconds between a trajectory leaving the index and its data being deleted, by default:
# readers in other processes that re-read the index within it never miss a trajectory.
DEFAULT_GRACE = 60.0


@dataclass(frozen=True)
class Retention:
    """What a writer keeps of the trajectories of its slot of the store.

    A buffer with ``retention`` collects as it writes: once its slot holds more than this
    keeps (by an eighth: collections come in batches), the oldest trajectories beyond it
    leave the index and, ``grace`` seconds later, their data is deleted.  Trajectories a
    checkpoint pins and those in the buffer's sample window are always kept.  See
    docs/checkpoints.md.

    Parameters
    ----------
    last
        Keep the slot's last ``last`` trajectories (``None``: no bound by count).
    max_bytes
        Keep the newest trajectories whose stored bytes sum to at most ``max_bytes`` (the
        newest one always; ``None``: no bound by bytes).  Each committed trajectory's bytes
        are measured once (one listing of its folder).
    grace
        Seconds between a trajectory leaving the index and its data being deleted: readers
        of other processes that re-read the index (or draw with ``on_damaged="skip"``)
        within it never read a deleted trajectory.  0 for a lone process.

    Raises
    ------
    ValueError
        Neither bound is given, a bound is not a whole number >= 1, or ``grace`` is
        negative or not finite.
    """

    last: int | None = None
    max_bytes: int | None = None
    grace: float = DEFAULT_GRACE

    def __post_init__(self) -> None:
        if self.last is None and self.max_bytes is None:
            raise ValueError("Retention needs last=N trajectories, max_bytes=N, or both")
        for name in ("last", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"Retention {name} must be a whole number >= 1, got {value!r}")
        grace = self.grace
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not math.isfinite(grace)
            or grace < 0
        ):
            raise ValueError(f"Retention grace must be seconds >= 0, got {grace!r}")

    @classmethod
    def of(cls, value: Any) -> Retention | None:
        """A retention from what ``TrajectoryReplayBuffer(retention=...)`` takes.

        Parameters
        ----------
        value
            ``None``, a :class:`Retention`, or an int ``N`` (the last ``N`` trajectories,
            the default grace period).

        Returns
        -------
        Retention or None
            The retention (``None`` for none).

        Raises
        ------
        ValueError
            ``value`` is none of these, or an invalid bound.
        """
        if value is None or isinstance(value, Retention):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(last=value)
        raise ValueError(
            f"retention must be None, a whole number of trajectories or a Retention, got {value!r}"
        )

    def keeps(self, sizes: list[int]) -> int:
        """How many of the newest trajectories it keeps.

        Parameters
        ----------
        sizes
            The stored bytes of each trajectory, oldest first.

        Returns
        -------
        int
            The number of trajectories kept, from the newest back.
        """
        kept = len(sizes) if self.last is None else min(self.last, len(sizes))
        if self.max_bytes is not None:
            total = 0
            for count, size in enumerate(reversed(sizes[len(sizes) - kept :])):
                total += size
                if total > self.max_bytes and count:
                    return count
        return kept

    def is_due(self, count: int, total_bytes: int) -> bool:
        """Whether a collection is due: the trajectories exceed what it keeps by more than
        the batch a collection waits for (an eighth).

        Parameters
        ----------
        count, total_bytes
            The trajectories held (beyond those a collection may not remove) and their bytes.

        Returns
        -------
        bool
            Whether to collect now.
        """
        if self.last is not None and count > self.last + max(1, self.last // 8):
            return True
        return self.max_bytes is not None and total_bytes > self.max_bytes + self.max_bytes // 8


def check_retention(retention: Retention | None, auto_save: bool, window: int) -> None:
    """Refuse a retention without a store, or one that keeps fewer than the sample window.

    Raises
    ------
    ValueError
        ``retention`` is given without ``auto_save``, or its ``last`` is below ``window``.
    """
    if retention is None:
        return
    if not auto_save:
        raise ValueError(
            "retention needs auto_save=True: it bounds the auto_save store (a buffer without "
            "one keeps sample_window_size trajectories in memory)"
        )
    if retention.last is not None and window > 0 and retention.last < window:
        raise ValueError(
            f"retention keeps the last {retention.last} trajectories, fewer than "
            f"sample_window_size={window}: keep at least the window"
        )
