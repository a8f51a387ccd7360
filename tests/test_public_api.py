"""The curated public API is pinned: a change here is a deliberate API change."""

from __future__ import annotations

import rbzarr


def test_public_api_is_pinned():
    assert sorted(rbzarr.__all__) == [
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
        "split_envs",
    ]
    for name in rbzarr.__all__:
        assert getattr(rbzarr, name) is not None


def test_errors_are_catchable_as_builtins():
    assert issubclass(rbzarr.InvalidTrajectoryError, ValueError)
    assert issubclass(rbzarr.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(rbzarr.StorageUnavailableError, OSError)
    assert issubclass(rbzarr.BufferClosedError, RuntimeError)
    assert issubclass(rbzarr.StoreExistsError, FileExistsError)
    assert issubclass(rbzarr.EmptyBufferError, RuntimeError)
    assert issubclass(rbzarr.CheckpointConflictError, ValueError)
    assert issubclass(rbzarr.WorkerProcessError, RuntimeError)
    for name in (
        "EmptyBufferError",
        "CheckpointConflictError",
        "WriterFailedError",
        "WorkerProcessError",
    ):
        assert issubclass(getattr(rbzarr, name), rbzarr.RbzarrError)
