"""The replay buffer: a coordinator of cache, index, sampler, background writer and checkpoints.

The RLinf compatibility surface lives here too.
"""

from rbzarr.buffer.buffer import TrajectoryReplayBuffer

__all__ = ["TrajectoryReplayBuffer"]
