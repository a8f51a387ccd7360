"""What a :class:`~rbzarr.data.datasets.ReplayDataset` samples, in the trainer and in workers."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Protocol

from rbzarr.analysis.view import BufferView, open_buffer
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.errors import CheckpointNotFoundError
from rbzarr.sampling.priorities import PrioritizedReplay
from rbzarr.storage.index.slots import ID_STRIDE

__all__ = [
    "BufferIds",
    "SampleSource",
    "StoreSpec",
    "store_spec",
    "takes_generator",
    "worker_source",
]


class SampleSource(Protocol):
    """Anything with ``sample(num_chunks) -> dict`` (a replay buffer, a view, a demo buffer)."""

    def sample(self, num_chunks: int) -> dict[str, Any]:
        """A batch of ``num_chunks`` rows, as a (nested) dict of ``[num_chunks, ...]``."""
        ...  # pragma: no cover - a protocol


def takes_generator(source: SampleSource) -> bool:
    """Whether ``source.sample`` accepts a ``generator`` keyword (or any keyword)."""
    try:
        params = inspect.signature(source.sample).parameters
    except (TypeError, ValueError):
        return False
    return "generator" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


@dataclass(frozen=True)
class BufferIds:
    """The ids a buffer samples: those it lists now and the ones its own writer adds next
    (``[next_id, end_id)``, the rest of its writer slot), not an earlier run's of its store."""

    listed: frozenset[int]
    next_id: int
    end_id: int

    @classmethod
    def of(cls, buffer: TrajectoryReplayBuffer) -> BufferIds:
        """The ids of ``buffer`` as they are now."""
        counter = buffer.trajectory_counter
        return cls(
            frozenset(buffer.trajectory_ids), counter, (counter // ID_STRIDE + 1) * ID_STRIDE
        )

    def __contains__(self, trajectory_id: object) -> bool:
        if trajectory_id in self.listed:
            return True
        return isinstance(trajectory_id, int) and self.next_id <= trajectory_id < self.end_id


@dataclass(frozen=True)
class StoreSpec:
    """Where a worker opens its view: a store's URL, fsspec options, sampling window,
    ``on_damaged`` policy, local shard cache, trajectories (the buffer's) and prioritized
    replay settings (the view draws by the priorities the buffer last flushed)."""

    url: str
    storage_options: dict[str, Any]
    sample_window_size: int
    on_damaged: str = "raise"
    local_cache_dir: str | None = None
    local_cache_bytes: int | None = None
    trajectories: BufferIds | None = None
    prioritized: PrioritizedReplay | None = None

    def open(self, refresh_interval: float) -> BufferView:
        """Open the store as a read-only view, in the calling process."""
        try:
            return open_buffer(
                self.url,
                self.storage_options,
                sample_window_size=self.sample_window_size,
                refresh_interval=refresh_interval,
                on_damaged=self.on_damaged,
                local_cache_dir=self.local_cache_dir,
                local_cache_bytes=self.local_cache_bytes,
                trajectories=self.trajectories,
                prioritized=self.prioritized,
            )
        except CheckpointNotFoundError as exc:
            raise CheckpointNotFoundError(
                f"ReplayDataset: DataLoader workers sample the store at {self.url}, which has "
                "no committed trajectory yet; add trajectories to the buffer (and flush()) "
                "before iterating the DataLoader"
            ) from exc


def store_spec(source: object) -> StoreSpec | None:
    """The store a worker samples instead of ``source``; ``None`` for other sources."""
    if isinstance(source, BufferView):
        return StoreSpec(
            source.url,
            source.storage_options,
            source.sample_window_size,
            source.on_damaged,
            prioritized=source.prioritized,
        )
    if not isinstance(source, TrajectoryReplayBuffer):
        return None
    if source.store_url is None:
        raise ValueError(
            "ReplayDataset: a TrajectoryReplayBuffer without auto_save keeps its trajectories "
            "in this process's memory, so DataLoader workers cannot sample it (each would "
            "draw from a frozen copy). Use num_workers=0 (ReplayDataset prefetches on a "
            "thread), or build the buffer with auto_save=True so workers read its store"
        )
    cache = source.local_cache
    return StoreSpec(
        source.store_url,
        dict(source.storage_options),
        source.sample_window_size,
        source.on_damaged,
        local_cache_dir=cache.directory,
        local_cache_bytes=cache.capacity if cache.directory is not None else None,
        trajectories=BufferIds.of(source),
        prioritized=None if source.prioritized is None else replace(source.prioritized),
    )


def worker_source(source: Any, max_staleness: float) -> SampleSource:
    """In a worker: a view of ``source``'s store, opened here, or ``source`` itself."""
    spec = source if isinstance(source, StoreSpec) else store_spec(source)
    if spec is not None:
        return spec.open(max_staleness)
    if not takes_generator(source):
        raise ValueError(
            f"ReplayDataset: {type(source).__name__}.sample() takes no generator, so "
            "every DataLoader worker would draw the same batches; accept a "
            "'generator' keyword or use num_workers=0"
        )
    return source
