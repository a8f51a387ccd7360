"""What a layout tells a verifier about the data below its root: :class:`LayoutAudit`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbzarr.storage.rlinf.documents import Entry

__all__ = ["LayoutAudit"]


@dataclass(frozen=True)
class LayoutAudit:
    """A layout's checks of its stored data, for ``verify``, ``recode`` and whoever asks
    whether a trajectory's data is there.

    Attributes
    ----------
    contains
        ``contains(entry)``: whether the trajectory's data is present (its
        ``trajectory_path`` exists), one request, however large the store.
    stored_paths
        ``stored_paths()``: every trajectory's data present, indexed or not, as
        ``{path: trajectory_id}`` (paths ``/``-joined below the root as the layout's
        ``trajectory_path`` names them).
    foreign_files
        ``foreign_files(path)``: files at or below the trajectory path ``path`` that rbzarr
        did not write, relative to ``path``.  A repair deletes an orphan only when this is
        empty: a user's file that happens to lie there is never removed.
    missing_parts
        ``missing_parts(entry)``: parts of a present trajectory that are absent, one message
        each (damage that decoding would not reveal, such as a Zarr chunk that reads as fill
        values when it is missing).
    unneeded_groups
        ``unneeded_groups(entries)``: groups of data several trajectories share (a zarr
        store's packs) of which none of ``entries`` (the listed trajectories by id) is a
        member, ``/``-joined below the root: what a pack's last member left when it went
        without it (an interrupted write, a repair).
    """

    contains: Callable[[Entry], bool]
    stored_paths: Callable[[], dict[str, int]]
    foreign_files: Callable[[str], list[str]]
    missing_parts: Callable[[Entry], list[str]]
    unneeded_groups: Callable[[Mapping[int, Entry]], list[str]]
