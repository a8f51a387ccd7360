"""From environment steps to trajectories: the collector, autoreset, step checks.

And the channel that carries trajectories from rollout workers to the learner.
"""

from rbzarr.rollout.channel import Channel
from rbzarr.rollout.collected import split_envs
from rbzarr.rollout.collector import TrajectoryCollector

__all__ = ["Channel", "TrajectoryCollector", "split_envs"]
