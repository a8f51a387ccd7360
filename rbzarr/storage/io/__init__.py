"""Byte access: locations and backends, local files, names, deadlines, object ranges."""

__all__: list[str] = []
