"""rbzarr: a trajectory replay buffer for reinforcement learning, stored in Zarr.

A drop-in replacement for RLinf's ``TrajectoryReplayBuffer``: the same constructor, calls,
sampled batches and checkpoint files, on a Zarr storage engine that reads only the chunks
holding sampled rows, on local disk or any fsspec URL (``s3://bucket/prefix``).
"""

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
from rbzarr.errors import (
    BufferClosedError,
    ChannelClosedError,
    ChannelTimeoutError,
    CheckpointConflictError,
    CheckpointNotFoundError,
    CorruptStoreError,
    EmptyBufferError,
    InvalidTrajectoryError,
    RbzarrError,
    StorageUnavailableError,
    StoreExistsError,
    UncommittedWritesWarning,
    UnsafePathError,
    UnsafePickleError,
    WorkerProcessError,
    WriterFailedError,
)
from rbzarr.rollout.channel import Channel
from rbzarr.rollout.collector import TrajectoryCollector, split
from rbzarr.trajectory.model import Trajectory

__all__ = [
    "BufferClosedError",
    "Channel",
    "ChannelClosedError",
    "ChannelTimeoutError",
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "CorruptStoreError",
    "EmptyBufferError",
    "InvalidTrajectoryError",
    "PreloadReplayBufferDataset",
    "PriorityStore",
    "RbzarrError",
    "ReplayBufferDataset",
    "ReplayDataset",
    "ReplayLoader",
    "StorageUnavailableError",
    "StoreExistsError",
    "Trajectory",
    "TrajectoryCache",
    "TrajectoryCollector",
    "TrajectoryReplayBuffer",
    "UncommittedWritesWarning",
    "UnsafePathError",
    "UnsafePickleError",
    "WorkerProcessError",
    "WriterFailedError",
    "export_store",
    "open_buffer",
    "replay_buffer_collate_fn",
    "split",
]

__version__ = "0.1.0"
