"""A Ray actor that owns a replay buffer, for programs that are not RLinf.

:class:`BufferActor` wraps one :class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer`; every
call is a remote method (``add_trajectories``, ``add_committed``, ``sample``,
``save_checkpoint``, ``update_priority``, ...).  :func:`remote_buffer` starts one on the
current Ray cluster.  With ``prioritized``, the actor is the one owner of the priorities:
learners draw with ``sample_with_info`` and send their updates back with
``update_priority``; a draw sees every update the actor received before it.
Sending commit notices instead of trajectories (``add_committed``) keeps the bytes out of
Ray: rollout actors write to the shared store themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.distributed.notices import CommitNotice
from rbzarr.trajectory.model import Trajectory

__all__ = ["BufferActor", "remote_buffer"]


class BufferActor:
    """The state of one buffer actor: a replay buffer built from ``buffer_options``.

    Parameters
    ----------
    buffer_options
        Keyword arguments of :class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer`.
    """

    def __init__(self, **buffer_options: Any) -> None:
        self._buffer = TrajectoryReplayBuffer(**buffer_options)

    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> int:
        """Add trajectories (their bytes pass through Ray); return the buffer's size."""
        self._buffer.add_trajectories(trajectories)
        return len(self._buffer)

    def add_committed(self, notices: Iterable[CommitNotice]) -> int:
        """Add committed trajectories of the shared store by reference; return the size."""
        self._buffer.add_committed(notices)
        return len(self._buffer)

    def sample(self, num_chunks: int) -> dict[str, Any]:
        """``num_chunks`` rows drawn as the buffer draws them (the caller gets a plain dict)."""
        return _OutgoingBatch(self._buffer.sample(num_chunks))

    def sample_with_info(self, num_chunks: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """:meth:`sample` and the rows' info (``"index"``, ``"weight"``; see
        ``TrajectoryReplayBuffer.sample(..., return_info=True)``)."""
        batch, info = self._buffer.sample(num_chunks, return_info=True)
        return _OutgoingBatch(batch), _OutgoingBatch(info)

    def sample_sequences(self, n: int, length: int, **options: Any) -> Any:
        """``n`` sequences of ``length`` steps (``return_info=True``: and their info)."""
        drawn = self._buffer.sample_sequences(n, length, **options)
        if isinstance(drawn, tuple):
            return _OutgoingBatch(drawn[0]), _OutgoingBatch(drawn[1])
        return _OutgoingBatch(drawn)

    def update_priority(self, indices: Any, priorities: Any) -> int:
        """Set priorities of rows by global index (this actor owns the buffer's priorities:
        every caller's updates land here, in the order Ray delivers them); return the
        stale updates counted so far."""
        self._buffer.update_priority(indices, priorities)
        return int(self._buffer.get_stats()["stale_priority_updates"])

    def size(self) -> int:
        """Trajectories in the buffer."""
        return len(self._buffer)

    def trajectory_ids(self) -> list[int]:
        """The buffer's ids, in insertion order."""
        return self._buffer.trajectory_ids

    def get_stats(self) -> dict[str, Any]:
        """The buffer's counters."""
        return self._buffer.get_stats()

    def save_checkpoint(self, save_path: str | os.PathLike[str], copy: bool | None = None) -> None:
        """Save a checkpoint of the buffer at ``save_path`` (``copy`` as the buffer's)."""
        self._buffer.save_checkpoint(save_path, copy)

    def load_checkpoint(self, load_path: str | os.PathLike[str], **options: Any) -> int:
        """Load a checkpoint into the buffer; return its size."""
        self._buffer.load_checkpoint(load_path, **options)
        return len(self._buffer)

    def flush(self) -> None:
        """Wait until every queued write is committed."""
        self._buffer.flush()

    def close(self) -> None:
        """Flush and close the buffer."""
        self._buffer.close()


class _OutgoingBatch(dict[str, Any]):
    """A sampled batch leaving the actor: it pickles its tensors as numpy arrays, whose bytes
    Ray moves out of band, where a tensor's own pickling serialises each through
    ``torch.save``; it unpickles as a plain dict of tensors (copies the caller owns)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_tensors_of, (_arrays_of(self),))


def _arrays_of(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The nested dict with each tensor numpy can hold as an array (bfloat16 stays a tensor)."""
    return {
        key: _arrays_of(value)
        if isinstance(value, Mapping)
        else value.numpy()
        if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16
        else value
        for key, value in tree.items()
    }


def _tensors_of(tree: Mapping[str, Any]) -> dict[str, Any]:
    """Unpickle an :class:`_OutgoingBatch`: the nested dict of (writable, copied) tensors."""
    return {
        key: _tensors_of(value)
        if isinstance(value, Mapping)
        else torch.from_numpy(np.array(value))
        if isinstance(value, np.ndarray)
        else value
        for key, value in tree.items()
    }


def remote_buffer(actor_options: Mapping[str, Any] | None = None, **buffer_options: Any) -> Any:
    """Start a :class:`BufferActor` on the current Ray cluster and return its handle.

    Parameters
    ----------
    actor_options
        Passed to the actor's ``.options()`` (``num_cpus``, ``name``, ...).
    **buffer_options
        Keyword arguments of the buffer.

    Returns
    -------
    ray.actor.ActorHandle
        Call its methods with ``.remote(...)`` and ``ray.get``.
    """
    import ray  # noqa: PLC0415  (the optional "ray" extra)

    actor = ray.remote(BufferActor).options(**dict(actor_options or {"num_cpus": 0}))
    return actor.remote(**buffer_options)
