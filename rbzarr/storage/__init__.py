"""Storage: where trajectories live (locations) and how they are laid out (layouts)."""

__all__: list[str] = []
