"""What a :class:`~rbzarr.data.datasets.ReplayDataset` samples, in the trainer and in workers.

A source is anything with ``sample(num_chunks) -> dict`` (:class:`SampleSource`).  A
DataLoader worker process never samples the training process's buffer: it samples a
read-only :class:`~rbzarr.analysis.view.BufferView` of the buffer's ``auto_save`` store, opened
inside the worker from a picklable :class:`StoreSpec` (:func:`worker_source`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

from rbzarr.analysis.view import BufferView, open_buffer
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.errors import CheckpointNotFoundError

__all__ = ["SampleSource", "StoreSpec", "store_spec", "takes_generator", "worker_source"]


class SampleSource(Protocol):
    """Anything with ``sample(num_chunks) -> dict`` (a replay buffer, a view, a demo buffer).

    Parameters
    ----------
    *args, **kwargs
        None accepted: a protocol only describes its implementations and cannot be
        instantiated (``typing.Protocol`` raises ``TypeError``).
    """

    def sample(self, num_chunks: int) -> dict[str, Any]:
        """A batch of ``num_chunks`` rows, as a (nested) dict of ``[num_chunks, ...]``.

        Parameters
        ----------
        num_chunks
            Rows to draw; a source that clamps to the rows it holds may return fewer.

        Returns
        -------
        dict
            Field names to ``[num_chunks, ...]`` tensors, nested as the trajectories are.
        """
        ...  # pragma: no cover - a protocol


def takes_generator(source: SampleSource) -> bool:
    """Whether ``source.sample`` accepts a ``generator`` keyword (or any keyword).

    Parameters
    ----------
    source
        The object whose ``sample`` signature is read.

    Returns
    -------
    bool
        ``True`` for a ``generator`` parameter or ``**kwargs``; ``False`` otherwise, and
        when the signature cannot be read.
    """
    try:
        params = inspect.signature(source.sample).parameters
    except (TypeError, ValueError):
        return False
    return "generator" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


@dataclass(frozen=True)
class StoreSpec:
    """Where a worker opens its view: a store's URL, fsspec options and sampling window.

    Parameters
    ----------
    url
        The store's path or URL.
    storage_options
        fsspec options for the store (credentials, endpoint).
    sample_window_size
        The source's sampling window, in trajectories (see ``TrajectoryReplayBuffer``).
    """

    url: str
    storage_options: dict[str, Any]
    sample_window_size: int

    def open(self, refresh_interval: float) -> BufferView:
        """Open the store as a read-only view, in the calling process.

        Parameters
        ----------
        refresh_interval
            Seconds: the view re-reads the store's index before a draw when its last read
            is older than this.

        Returns
        -------
        BufferView
            A view of the store's committed trajectories.

        Raises
        ------
        CheckpointNotFoundError
            When the store has no committed trajectory yet (the message says to add and
            ``flush()`` before iterating).
        """
        try:
            return open_buffer(
                self.url,
                self.storage_options,
                sample_window_size=self.sample_window_size,
                refresh_interval=refresh_interval,
            )
        except CheckpointNotFoundError as exc:
            raise CheckpointNotFoundError(
                f"ReplayDataset: DataLoader workers sample the store at {self.url}, which has "
                "no committed trajectory yet; add trajectories to the buffer (and flush()) "
                "before iterating the DataLoader"
            ) from exc


def store_spec(source: object) -> StoreSpec | None:
    """The store a worker samples instead of ``source``; ``None`` for other sources.

    Parameters
    ----------
    source
        A :class:`~rbzarr.TrajectoryReplayBuffer`, a view, or any other source.

    Returns
    -------
    StoreSpec or None
        The store of a view or of a buffer with ``auto_save``; ``None`` for any other
        kind of source.

    Raises
    ------
    ValueError
        For a buffer without ``auto_save`` (workers cannot sample its memory).
    """
    if isinstance(source, BufferView):
        return StoreSpec(source.url, source.storage_options, source.sample_window_size)
    if not isinstance(source, TrajectoryReplayBuffer):
        return None
    if source.store_url is None:
        raise ValueError(
            "ReplayDataset: a TrajectoryReplayBuffer without auto_save keeps its trajectories "
            "in this process's memory, so DataLoader workers cannot sample it (each would "
            "draw from a frozen copy). Use num_workers=0 (ReplayDataset prefetches on a "
            "thread), or build the buffer with auto_save=True so workers read its store"
        )
    return StoreSpec(source.store_url, dict(source.storage_options), source.sample_window_size)


def worker_source(source: Any, max_staleness: float) -> SampleSource:
    """In a worker: a view of ``source``'s store, opened here, or ``source`` itself.

    Parameters
    ----------
    source
        A :class:`StoreSpec` (what a worker receives for a buffer or view) or a source.
    max_staleness
        Seconds, the opened view's ``refresh_interval``.

    Returns
    -------
    SampleSource
        The opened view, or ``source`` when it has no store and its ``sample`` takes a
        ``generator``.

    Raises
    ------
    ValueError
        For a buffer without ``auto_save``, or a storeless source whose ``sample`` takes
        no ``generator`` (every worker would draw the same batches).
    CheckpointNotFoundError
        When the store has no committed trajectory yet.
    """
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
