"""From environment steps to trajectories: the collector, autoreset, step checks, the channel."""

from rbzarr.rollout.channel import Channel
from rbzarr.rollout.collected import split_envs
from rbzarr.rollout.collector import TrajectoryCollector

__all__ = ["Channel", "TrajectoryCollector", "split_envs"]
