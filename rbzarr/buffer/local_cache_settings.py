"""The buffer's local cache settings: where remote shards are kept, and the checks on its bound."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.zarr.shard_cache import DEFAULT_LOCAL_CACHE_BYTES
from rbzarr.trajectory.dtypes import storage_dtype

if TYPE_CHECKING:
    from rbzarr.trajectory.model import Schema
    from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["LocalCacheSettings"]


@dataclass(frozen=True)
class LocalCacheSettings:
    """``local_cache_dir`` and ``local_cache_bytes`` as a buffer was given them (checked).

    Parameters
    ----------
    directory
        The cache directory, or ``None`` for no cache.
    capacity
        Its bound in bytes.
    """

    directory: str | None
    capacity: int

    @classmethod
    def of(
        cls, directory: str | os.PathLike[str] | None, capacity: int | None
    ) -> LocalCacheSettings:
        """Check the two arguments.

        Raises
        ------
        ValueError
            ``capacity`` is not a positive integer, or is given without a directory.
        """
        if directory is None:
            if capacity is not None:
                raise ValueError("local_cache_bytes needs local_cache_dir")
            return cls(None, 0)
        if capacity is None:
            capacity = DEFAULT_LOCAL_CACHE_BYTES
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"local_cache_bytes must be a positive int, got {capacity!r}")
        if not os.fspath(directory):
            raise ValueError("local_cache_dir is empty")
        return cls(os.fspath(directory), capacity)

    def check_layout(self, layout: type[TrajectoryLayout]) -> None:
        """Refuse a cache for a layout without one (pt/pkl objects are read whole anyway).

        Raises
        ------
        ValueError
            A cache directory is set and ``layout`` does not support a local cache.
        """
        if self.directory is not None and not layout.capabilities.local_cache:
            raise ValueError(
                f"local_cache_dir works with zarr stores; this store's format is {layout.format!r}"
            )

    def layout_options(self, layout: type[TrajectoryLayout]) -> dict[str, Any]:
        """The keyword arguments that give a layout of class ``layout`` this cache."""
        if self.directory is None or not layout.capabilities.local_cache:
            return {}
        return {"local_cache_dir": self.directory, "local_cache_bytes": self.capacity}

    def check_shapes(self, schema: Schema | None, shapes: Iterable[Sequence[int]]) -> None:
        """Refuse a bound smaller than the largest of trajectories ``[T, B]`` of ``schema``.

        Raises
        ------
        ValueError
            One trajectory would not fit in the cache.
        """
        if self.directory is None or schema is None:
            return
        row = sum(
            math.prod(shape) * storage_dtype(name).itemsize for name, shape in schema.values()
        )
        largest = max((int(s[0]) * int(s[1]) for s in shapes), default=0) * row
        self._check(largest)

    def check_trajectories(self, trajectories: Sequence[ValidatedTrajectory]) -> None:
        """Refuse trajectories that would not fit in the cache (nothing is added).

        Raises
        ------
        ValueError
            One of them is larger than the bound.
        """
        if self.directory is None:
            return
        self._check(
            max(
                sum(value.numel() * value.element_size() for value in t.flat.values())
                for t in trajectories
            )
        )

    def _check(self, nbytes: int) -> None:
        if nbytes > self.capacity:
            raise ValueError(
                f"local_cache_bytes={self.capacity} is smaller than one trajectory "
                f"({nbytes} bytes): the cache must hold at least one; raise it"
            )
