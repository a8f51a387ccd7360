"""RLinf's two small stores, exported by ``rbzarr`` as RLinf exports them."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

import torch

from rbzarr.trajectory import tree

__all__ = ["PriorityStore", "TrajectoryCache"]


class PriorityStore:
    """The ``maxsize`` items of highest priority; among equal priorities the newest stay.

    Priorities compare as tuples (RLinf uses ``(min_version, mean_version)``).  It also
    counts ``discarded_unused``: items refused or evicted without ever being returned by
    :meth:`topn`.

    Parameters
    ----------
    maxsize
        How many items it keeps; must be positive.

    Raises
    ------
    ValueError
        If ``maxsize`` is not positive.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize <= 0:
            raise ValueError(f"maxsize must be > 0, got {maxsize}")
        self.maxsize = maxsize
        self._items: list[tuple[Any, int, Any]] = []  # (priority, seq, data), ascending
        self._seq = 0
        self._used: set[int] = set()
        self._discarded_unused = 0

    def __len__(self) -> int:
        return len(self._items)

    def _forget(self, item: tuple[Any, int, Any]) -> None:
        if item[1] in self._used:
            self._used.discard(item[1])
        else:
            self._discarded_unused += 1

    def add(self, priority: Any, data: Any) -> bool:
        """Keep ``data`` unless the store is full of items of higher priority.

        Parameters
        ----------
        priority
            A value comparable with the other items' (a tuple such as
            ``(min_version, mean_version)``; :meth:`remove_below` reads its first element).
        data
            The item to keep, e.g. a trajectory.

        Returns
        -------
        bool
            ``False`` when ``data`` was refused; otherwise ``True`` (the lowest item, the
            oldest among equals, is evicted when full).
        """
        if len(self._items) == self.maxsize and priority < self._items[0][0]:
            self._discarded_unused += 1
            return False
        bisect.insort(self._items, (priority, self._seq, data), key=lambda item: item[:2])
        self._seq += 1
        if len(self._items) > self.maxsize:
            self._forget(self._items.pop(0))
        return True

    def topn(self, n: int) -> list[Any]:
        """The ``n`` highest-priority items, highest first; they count as used.

        ``n <= 0`` gives ``[]`` (RLinf's slice ``[-0:]`` returns every item).

        Parameters
        ----------
        n
            How many items to return; fewer when the store holds fewer.

        Returns
        -------
        list
            The items' ``data``, highest priority first (the newest first among equals).
        """
        chosen = self._items[-n:] if n > 0 else []
        self._used.update(seq for _, seq, _ in chosen)
        return [data for _, _, data in reversed(chosen)]

    def remove_below(self, threshold: Any) -> None:
        """Drop every item whose priority's first element is below ``threshold``.

        Parameters
        ----------
        threshold
            Compared with ``priority[0]`` of each item, e.g. the oldest version to keep.
        """
        kept = []
        for item in self._items:
            if item[0][0] < threshold:
                self._forget(item)
            else:
                kept.append(item)
        self._items = kept

    def get_metric(self) -> dict[Any, Any]:
        """Share of each (rounded) version over the stored items' ``versions`` tensors.

        Returns
        -------
        dict
            ``{version: {"ratio": share}}`` for every version seen, and
            ``"discarded_unused"``.
        """
        counts: dict[int, int] = {}
        for _, _, data in self._items:
            versions = getattr(data, "versions", None)
            if versions is None:
                continue
            values, found = torch.unique(
                torch.round(versions.reshape(-1)).to(torch.int64), return_counts=True
            )
            for value, n in zip(values.tolist(), found.tolist(), strict=True):
                counts[value] = counts.get(value, 0) + n
        total = sum(counts.values())
        metric: dict[Any, Any] = {v: {"ratio": n / total} for v, n in counts.items()}
        metric["discarded_unused"] = self._discarded_unused
        return metric


class TrajectoryCache:
    """RLinf's FIFO cache of flattened trajectories: ``put(id, flat)``, ``get(id)``.

    A flattened trajectory is a (nested) dict of ``[rows, ...]`` tensors, as
    ``buffer._flatten_trajectory`` returns.  ``put`` copies it; putting an id already
    cached replaces it in place, a new id evicts the oldest insert when full.

    Parameters
    ----------
    max_size
        How many trajectories it keeps; must be positive.

    Raises
    ------
    ValueError
        If ``max_size`` is not positive.
    """

    def __init__(self, max_size: int = 5) -> None:
        if max_size <= 0:
            raise ValueError(f"max_size must be > 0, got {max_size}")
        self.max_size = max_size
        self._entries: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self._slots: dict[int, int] = {}
        self._next_slot = 0

    @property
    def cache(self) -> dict[int, int]:
        """``{trajectory_id: slot}`` of the cached trajectories (a copy), as RLinf's."""
        return dict(self._slots)

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, trajectory_id: int, trajectory: dict[str, Any]) -> None:
        """Cache a copy of the flattened ``trajectory`` under ``trajectory_id``.

        Parameters
        ----------
        trajectory_id
            The key; an id already cached is replaced in place.
        trajectory
            A (nested) dict of tensors; its tensors are detached and cloned, other values
            are dropped.

        Raises
        ------
        ValueError
            If ``trajectory`` holds no tensor.
        """
        flat = {
            path: value.detach().clone()
            for path, value in tree.flatten(trajectory).items()
            if isinstance(value, torch.Tensor)
        }
        if not flat:
            raise ValueError("Trajectory contains no tensor fields.")
        if trajectory_id not in self._entries:
            if len(self._entries) == self.max_size:
                oldest, _ = self._entries.popitem(last=False)
                self._slots.pop(oldest)
            self._slots[trajectory_id] = self._next_slot
            self._next_slot = (self._next_slot + 1) % self.max_size
        self._entries[trajectory_id] = flat

    def get(self, trajectory_id: int) -> dict[str, Any] | None:
        """The cached flattened trajectory (nested as it was put), or ``None``.

        Parameters
        ----------
        trajectory_id
            The key given to :meth:`put`.

        Returns
        -------
        dict or None
            The cached tensors themselves (not copies), or ``None`` for an id not cached.
        """
        flat = self._entries.get(trajectory_id)
        return None if flat is None else tree.unflatten(flat)

    def clear(self) -> None:
        """Drop every cached trajectory."""
        self._entries.clear()
        self._slots.clear()
        self._next_slot = 0
