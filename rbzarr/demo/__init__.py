"""The demo: a DQN on CartPole that trains through the buffer on a local store."""

__all__: list[str] = []
