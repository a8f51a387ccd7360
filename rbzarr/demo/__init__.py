"""The main job: a DQN on CartPole that trains through the buffer on a local store.

Rollout thread, collector, channel and learner, seeded and reproducible.
"""

__all__: list[str] = []
