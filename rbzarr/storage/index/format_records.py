"""What a layout records of its format beside the index, and how the catalog writes the
two documents through it.

:class:`TrajectoryLayout` holds trajectory data only.  A layout that also keeps records of
its format in the catalog (the zarr layout: its ``layout_version`` and codecs in
``metadata.json``, and a copy of the documents' head in its root group) implements
:class:`FormatRecords`; the functions here fall back to plain RLinf documents for the
others (pt / pkl).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rbzarr.storage.rlinf import documents as store_documents
from rbzarr.storage.rlinf.documents import Documents, Finding

if TYPE_CHECKING:
    from rbzarr.storage.layout import TrajectoryLayout

__all__ = [
    "FormatRecords",
    "adopt_store_metadata",
    "check_documents",
    "format_metadata",
    "write_documents",
    "written_attributes",
]


@runtime_checkable
class FormatRecords(Protocol):
    """A layout that records its format in the catalog (see the module docs)."""

    def format_metadata(self) -> dict[str, Any]:
        """Keys the layout adds to ``metadata.json`` to describe its format."""

    def adopt_store_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Take on what an existing store's ``metadata.json`` records of the format."""

    def write_documents(self, documents: Documents) -> Documents:
        """Write the two documents (and the layout's copies of them); those written."""

    def check_documents(self, documents: Documents) -> list[Finding]:
        """The layout's copies of ``documents`` that disagree with them."""

    def written_attributes(self, trajectory_id: int) -> dict[str, Any] | None:
        """The attributes of a trajectory's commit marker, ``None`` without a complete one."""


def format_metadata(layout: TrajectoryLayout) -> dict[str, Any]:
    """Keys ``layout`` adds to ``metadata.json`` to describe its format (none for most)."""
    return layout.format_metadata() if isinstance(layout, FormatRecords) else {}


def adopt_store_metadata(layout: TrajectoryLayout, metadata: Mapping[str, Any]) -> None:
    """Make ``layout`` take on what the store's ``metadata.json`` records of its format
    (a writer appending to it does this once, before writing)."""
    if isinstance(layout, FormatRecords):
        layout.adopt_store_metadata(metadata)


def write_documents(layout: TrajectoryLayout, documents: Documents) -> Documents:
    """Commit or mirror the two documents at ``layout``'s root: the index, then the
    metadata, each atomically (call only once every trajectory they list is written); the
    documents as written (a layout may add what describes its format)."""
    if isinstance(layout, FormatRecords):
        return layout.write_documents(documents)
    store_documents.write_documents(layout.location, documents)
    return documents


def check_documents(layout: TrajectoryLayout, documents: Documents) -> list[Finding]:
    """Copies of ``documents`` that ``layout`` keeps and that disagree with them (each is
    repaired by :func:`write_documents`)."""
    return layout.check_documents(documents) if isinstance(layout, FormatRecords) else []


def written_attributes(layout: TrajectoryLayout, trajectory_id: int) -> dict[str, Any] | None:
    """The attributes a trajectory's commit marker records beside its data (its index entry
    among them), ``None`` where it has no complete marker (a layout without markers:
    always)."""
    if isinstance(layout, FormatRecords):
        return layout.written_attributes(trajectory_id)
    return None
