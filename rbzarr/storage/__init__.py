"""Storage: where trajectories live and how they are laid out there.

Four concepts, one folder each: byte access (``io/``: locations, backends, files, names,
deadlines, object ranges), the store's catalog (``index/``: the index log, writer slots,
schema, priorities), RLinf's pt/pkl format (``rlinf/``: file layouts, JSON documents, safe
pickle) and Zarr (``zarr/``).  At the root: the layout interface, the registry of formats and
a batch's row groups."""

__all__: list[str] = []
