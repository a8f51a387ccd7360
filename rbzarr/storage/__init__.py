"""Storage: where trajectories live (locations, backends) and how they are laid out there.

The layout interface, the pt/pkl layouts (zarr in ``zarr/``), the JSON documents, the registry.
"""

__all__: list[str] = []
