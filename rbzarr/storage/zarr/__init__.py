"""The zarr layout: one group per trajectory, sharded arrays, rows read by byte ranges.

Reads go through a memory map for local files and coalesced ranges for remote ones.
"""

__all__: list[str] = []
