"""Storage: where trajectories live (locations, backends) and how they are laid out there.

The layout interface, pt/pkl layouts (zarr in ``zarr/``), JSON documents, safe pickle, registry."""

__all__: list[str] = []
