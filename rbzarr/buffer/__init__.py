"""The replay buffer: a coordinator of cache, index, sampler, background writer and checkpoints.

The RLinf compatibility surface lives here too.  :class:`TrajectoryReplayBuffer` is imported
on first use, so the torch-free parts (the index of a store's documents) load without torch.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbzarr.buffer.buffer import TrajectoryReplayBuffer

__all__ = ["TrajectoryReplayBuffer"]


def __getattr__(name: str) -> object:
    """Import :class:`TrajectoryReplayBuffer` on first use.

    Raises
    ------
    AttributeError
        For any other name, as a module without it would.
    """
    if name == "TrajectoryReplayBuffer":
        from rbzarr.buffer.buffer import TrajectoryReplayBuffer  # noqa: PLC0415 (torch)

        return TrajectoryReplayBuffer
    raise AttributeError(f"module 'rbzarr.buffer' has no attribute {name!r}")
