"""Packs: small trajectories of one shape written together, as one group.

A trajectory's own group costs the filesystem a folder per array and a file per shard
(16 inodes for an RLinf-shaped state trajectory), more than a few hundred rows' bytes: a
burst of small trajectories of the same field shapes and dtypes is written as one *pack*.

* ``packs/<id>-<tag>`` (its first member's id and the start of its uuid) is a group
  described as one trajectory's is (:mod:`rbzarr.storage.zarr.sharded`), whose arrays
  hold the members' rows end to end along time: member ``i``'s rows of a key are rows
  ``[i * R, (i + 1) * R)``, ``R`` being each member's own rows of that key (``T``, or
  ``T + E`` with reset rows; the same for every member).  Its attributes
  name its members in order (``rbzarr_pack: {"members": [[id, uuid], ...]}``), and its
  ``shape`` is ``[members * T, B]``.  Plain zarr reads its arrays.
* Each member keeps its own group ``trajectories/<id>`` holding no array: its attributes
  are its index entry, its fields and ``rbzarr_layout: {"version": 2, "pack": {"group":
  "packs/<id>-<tag>", "member": i, "members": n}}``, and are its commit marker, as every
  trajectory's.  A reader opens the member's group, then the pack's.
* The pack is written first, its members' markers after it: a member whose marker exists
  has its rows stored.  A pack goes with the last of its members (a member deleted, the
  pack is deleted once no other member's group is left).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rbzarr.errors import CorruptStoreError

__all__ = [
    "DEFAULT_PACK_BYTES",
    "MAX_MEMBERS",
    "PACKS",
    "PACK_ATTR",
    "PACK_LIMIT_BYTES",
    "Membership",
    "member_layout",
    "membership",
    "check_member",
    "pack_group",
    "pack_members",
]

# The folder of packs below the root.
PACKS = "packs"
# The pack group's attribute naming its members.
PACK_ATTR = "rbzarr_pack"
# A trajectory of at most this many raw bytes is packed with those queued behind it.
DEFAULT_PACK_BYTES = 1 << 20
# The most raw bytes one pack holds, and the most members.
PACK_LIMIT_BYTES = 8 << 20
MAX_MEMBERS = 64

_PACK_NAME = re.compile(r"packs/(0|[1-9][0-9]{0,18})-[0-9a-f]{0,8}")


def pack_group(first_id: int, first_uuid: str) -> str:
    """The path below the root of the pack whose first member is trajectory ``first_id``
    of uuid ``first_uuid``: another write under the same id never names the same pack."""
    tag = "".join(c for c in first_uuid.lower() if c in "0123456789abcdef")[:8]
    return f"{PACKS}/{int(first_id)}-{tag}"


def member_layout(group: str, member: int, members: int) -> dict[str, Any]:
    """The ``rbzarr_layout`` attribute of member ``member`` of the ``members`` of pack
    ``group``."""
    return {"version": 2, "pack": {"group": group, "member": member, "members": members}}


class Membership:
    """Where a pack member's rows are: pack ``group``, member ``member`` of ``members``."""

    __slots__ = ("group", "member", "members")

    def __init__(self, group: str, member: int, members: int) -> None:
        self.group = group
        self.member = member
        self.members = members


def membership(layout: Any, where: str) -> Membership | None:
    """The pack a trajectory group's ``rbzarr_layout`` names (``None``: the group holds its
    own arrays); a pack reference that does not read is :class:`CorruptStoreError`."""
    if not isinstance(layout, Mapping) or "pack" not in layout:
        return None
    pack = layout["pack"]
    try:
        group, member, members = pack["group"], pack["member"], pack["members"]
    except (TypeError, KeyError):
        raise CorruptStoreError(f"{where}: its pack reference {pack!r} does not read") from None
    if (
        not isinstance(group, str)
        or not _PACK_NAME.fullmatch(group)
        or type(member) is not int
        or type(members) is not int
        or not 0 <= member < members <= MAX_MEMBERS
    ):
        raise CorruptStoreError(f"{where}: its pack reference {pack!r} does not read")
    return Membership(group, member, members)


def pack_members(attrs: Mapping[str, Any], where: str) -> list[tuple[int, str]]:
    """The ``(id, uuid)`` of each member a pack group's attributes list, in order."""
    try:
        members = attrs[PACK_ATTR]["members"]
        found = [(int(tid), str(uuid)) for tid, uuid in members]
    except (TypeError, KeyError, ValueError):
        raise CorruptStoreError(f"{where}: not a pack's attributes (no member list)") from None
    if not 2 <= len(found) <= MAX_MEMBERS:
        raise CorruptStoreError(f"{where}: a pack of {len(found)} members")
    return found


def check_member(
    members: Sequence[tuple[int, str]], place: Membership, tid: int, uuid: str, where: str
) -> None:
    """Refuse a pack whose member list does not hold trajectory ``tid`` (``uuid``) where
    its group says it is."""
    if len(members) != place.members or members[place.member] != (tid, uuid):
        raise CorruptStoreError(
            f"{where}: trajectory {tid} is not member {place.member} of the {place.members} "
            "this pack lists: the pack or the trajectory's group was replaced; run "
            "`rbzarr verify`"
        )
