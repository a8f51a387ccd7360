"""rbzarr: a trajectory replay buffer for reinforcement learning, stored in Zarr.

A drop-in replacement for RLinf's ``TrajectoryReplayBuffer``, on local disk or any fsspec URL.
"""

import importlib
import warnings
from typing import TYPE_CHECKING

from rbzarr.errors import (
    BufferClosedError,
    ChannelClosedError,
    ChannelTimeoutError,
    CheckpointConflictError,
    CheckpointNotFoundError,
    CheckpointReferenceError,
    CodecConflictError,
    CodecUnavailableError,
    CorruptStoreError,
    DamagedTrajectoryWarning,
    DatasetFileNotFoundError,
    DatasetMismatchError,
    EmptyBufferError,
    InsertTimeoutError,
    InvalidCodecError,
    InvalidTrajectoryError,
    RbzarrError,
    RecodeWarning,
    SchedulerUnavailableError,
    StorageOptionError,
    StorageUnavailableError,
    StoreExistsError,
    StoreNotWritableError,
    UncommittedWritesWarning,
    UnsafePathError,
    UnsafePickleError,
    UnsupportedDatasetError,
    WorkerProcessError,
    WriterFailedError,
)

# The rest is imported when first used (torch, zarr and numpy take seconds to import), so
# ``import rbzarr`` and the command line's --help stay fast.
_LAZY = {
    "export_store": "rbzarr.analysis.export",
    "open_buffer": "rbzarr.analysis.view",
    "TrajectoryReplayBuffer": "rbzarr.buffer.buffer",
    "ReplayDataset": "rbzarr.data.datasets",
    "ReplayLoader": "rbzarr.data.datasets",
    "PreloadReplayBufferDataset": "rbzarr.data.rlinf_datasets",
    "ReplayBufferDataset": "rbzarr.data.rlinf_datasets",
    "replay_buffer_collate_fn": "rbzarr.data.rlinf_datasets",
    "PriorityStore": "rbzarr.data.rlinf_stores",
    "PrioritizedReplay": "rbzarr.sampling.priorities",
    "Retention": "rbzarr.storage.index.retention",
    "TrajectoryCache": "rbzarr.data.rlinf_stores",
    "Channel": "rbzarr.rollout.channel",
    "split_envs": "rbzarr.rollout.collected",
    "TrajectoryCollector": "rbzarr.rollout.collector",
    "Trajectory": "rbzarr.trajectory.model",
}

if TYPE_CHECKING:
    from rbzarr.analysis.export import export_store
    from rbzarr.analysis.view import open_buffer
    from rbzarr.buffer.buffer import TrajectoryReplayBuffer
    from rbzarr.data.datasets import ReplayDataset, ReplayLoader
    from rbzarr.data.rlinf_datasets import (
        PreloadReplayBufferDataset,
        ReplayBufferDataset,
        replay_buffer_collate_fn,
    )
    from rbzarr.data.rlinf_stores import PriorityStore, TrajectoryCache
    from rbzarr.rollout.channel import Channel
    from rbzarr.rollout.collected import split_envs
    from rbzarr.rollout.collector import TrajectoryCollector
    from rbzarr.sampling.priorities import PrioritizedReplay
    from rbzarr.storage.index.retention import Retention
    from rbzarr.trajectory.model import Trajectory

__all__ = [
    "BufferClosedError",
    "Channel",
    "ChannelClosedError",
    "ChannelTimeoutError",
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "CheckpointReferenceError",
    "CodecConflictError",
    "CodecUnavailableError",
    "CorruptStoreError",
    "DamagedTrajectoryWarning",
    "DatasetFileNotFoundError",
    "DatasetMismatchError",
    "EmptyBufferError",
    "InsertTimeoutError",
    "InvalidCodecError",
    "InvalidTrajectoryError",
    "PreloadReplayBufferDataset",
    "PrioritizedReplay",
    "PriorityStore",
    "RbzarrError",
    "RecodeWarning",
    "Retention",
    "SchedulerUnavailableError",
    "ReplayBufferDataset",
    "ReplayDataset",
    "ReplayLoader",
    "StorageOptionError",
    "StorageUnavailableError",
    "StoreExistsError",
    "StoreNotWritableError",
    "Trajectory",
    "TrajectoryCache",
    "TrajectoryCollector",
    "TrajectoryReplayBuffer",
    "UncommittedWritesWarning",
    "UnsafePathError",
    "UnsafePickleError",
    "UnsupportedDatasetError",
    "WorkerProcessError",
    "WriterFailedError",
    "export_store",
    "open_buffer",
    "replay_buffer_collate_fn",
    "split_envs",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """Import a public name on first use; ``rbzarr.split`` is the deprecated alias of
    :func:`split_envs`.

    Raises
    ------
    AttributeError
        For any other name, as a module without it would.
    """
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "split":
        warnings.warn(
            "rbzarr.split is deprecated; use rbzarr.split_envs (it splits a trajectory along B)",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__("split_envs")
    raise AttributeError(f"module 'rbzarr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
