"""rbzarr: a trajectory replay buffer for reinforcement learning, stored in Zarr.

A drop-in replacement for RLinf's ``TrajectoryReplayBuffer``: the same constructor, calls,
sampled batches and checkpoint files, on a Zarr storage engine that reads only the chunks
holding sampled rows, on local disk or any fsspec URL (``s3://bucket/prefix``).
"""

from rbzarr.analysis import open_buffer
from rbzarr.buffer import TrajectoryReplayBuffer
from rbzarr.errors import (
    BufferClosedError,
    CheckpointNotFoundError,
    CorruptStoreError,
    InvalidTrajectoryError,
    RbzarrError,
    StorageUnavailableError,
    StoreExistsError,
    UnsafePathError,
    UnsafePickleError,
    WriterFailedError,
)
from rbzarr.trajectory import Trajectory

__all__ = [
    "BufferClosedError",
    "CheckpointNotFoundError",
    "CorruptStoreError",
    "InvalidTrajectoryError",
    "RbzarrError",
    "StorageUnavailableError",
    "StoreExistsError",
    "Trajectory",
    "TrajectoryReplayBuffer",
    "UnsafePathError",
    "UnsafePickleError",
    "WriterFailedError",
    "open_buffer",
]

__version__ = "0.1.0"
