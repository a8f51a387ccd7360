"""RLinf's pt/pkl format: file-per-trajectory layouts, its JSON documents, safe pickle."""

__all__: list[str] = []
