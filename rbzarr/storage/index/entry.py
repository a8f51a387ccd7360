"""IndexEntry: one trajectory's index entry, frozen, and checked in one place.

An entry is what RLinf's ``trajectory_index.json`` records of a trajectory (its uuid, id,
sample count, shape, episode length and weights id); rbzarr's log records, a zarr
trajectory group's attributes and commit notices hold the same keys.  Every entry read
from storage or handed in by a caller becomes an :class:`IndexEntry` through
:meth:`IndexEntry.parse`, the one check of an entry; :meth:`IndexEntry.new` makes the entry
of a new trajectory.  It reads like the JSON object it is written as (a read-only
mapping), and :meth:`IndexEntry.to_json` gives that object.
"""

from __future__ import annotations

import os
import random
import uuid as uuid_module
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.names import number_name

__all__ = ["ENTRY_KEYS", "IndexEntry", "count"]

# The keys of an index entry, in RLinf's order.
ENTRY_KEYS = (
    "uuid",
    "trajectory_id",
    "num_samples",
    "shape",
    "max_episode_length",
    "model_weights_id",
)
# Ids, sizes and counts in the documents are below this (int64, as tensors hold them).
MAX_COUNT = 2**63

# New trajectories' uuids: version 4, drawn from a generator seeded from the system's random
# source once per process (again in a forked child).  ``uuid4`` reads that source for each
# one, and the read lets go of the GIL: a writer thread taking it then holds it until its
# next file call while the caller waits.
_uuids = random.Random(os.urandom(32))


def _reseed_uuids() -> None:
    """A forked child's generator: its uuids must differ from those its parent goes on making."""
    _uuids.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reseed_uuids)


def new_uuid() -> str:
    """A fresh random (version 4) uuid, as ``str(uuid.uuid4())`` writes it."""
    return str(uuid_module.UUID(int=_uuids.getrandbits(128), version=4))


@dataclass(frozen=True, slots=True, eq=False)
class IndexEntry(Mapping[str, Any]):
    """One trajectory's index entry (read-only; reads like its JSON object).

    Parameters
    ----------
    uuid
        The trajectory's uuid (``""`` in an entry that records none).
    trajectory_id
        Its id.
    num_samples
        ``shape[0] * shape[1]``.
    shape
        ``(T, B, ...)`` of its fields.
    max_episode_length
        As the trajectory records it (``0`` if the entry records none).
    model_weights_id
        As the trajectory records it (``""`` if the entry records none).
    """

    uuid: str
    trajectory_id: int
    num_samples: int
    shape: tuple[int, ...]
    max_episode_length: int
    model_weights_id: str

    @classmethod
    def new(
        cls,
        trajectory_id: int,
        shape: Iterable[int],
        max_episode_length: int,
        model_weights_id: str,
        uuid: str | None = None,
    ) -> IndexEntry:
        """The entry of a new trajectory (a fresh uuid unless ``uuid`` is given)."""
        dims = tuple(int(d) for d in shape)
        return cls(
            uuid=new_uuid() if uuid is None else uuid,
            trajectory_id=int(trajectory_id),
            num_samples=dims[0] * dims[1],
            shape=dims,
            max_episode_length=int(max_episode_length),
            model_weights_id=str(model_weights_id),
        )

    @classmethod
    def parse(cls, raw: Any, where: str, trajectory_id: int | None = None) -> IndexEntry:
        """Check ``raw`` (a JSON object, or an entry) as every reader does and return it.

        Whole counts (ints, or strings of ASCII digits, below 2**63), a shape of at least
        two dimensions whose first two give ``num_samples``, and the id it is listed under
        (``trajectory_id``, where known); the optional keys default.

        Raises
        ------
        CorruptStoreError
            ``raw`` is not such an entry (the message names ``where``).
        """
        if isinstance(raw, IndexEntry) and trajectory_id in (None, raw.trajectory_id):
            return raw
        listed = raw.get("trajectory_id") if isinstance(raw, Mapping) else None
        name = listed if trajectory_id is None else trajectory_id
        try:
            if not isinstance(raw, Mapping):
                raise TypeError(f"an entry is a JSON object, got {type(raw).__name__}")
            if not isinstance(raw["shape"], list | tuple):
                raise TypeError(f"a shape is a list, got {type(raw['shape']).__name__}")
            shape = tuple(count(d) for d in raw["shape"])
            entry = cls(
                uuid=str(raw.get("uuid", "")),
                trajectory_id=count(raw["trajectory_id"]),
                num_samples=count(raw["num_samples"]),
                shape=shape,
                max_episode_length=count(raw.get("max_episode_length", 0)),
                model_weights_id=str(raw.get("model_weights_id", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: index entry {name!r} is malformed: {exc!r}") from exc
        consistent = len(shape) >= 2 and entry.num_samples == shape[0] * shape[1]
        if not consistent or trajectory_id not in (None, entry.trajectory_id):
            raise CorruptStoreError(f"{where}: index entry {name!r} is inconsistent: {dict(raw)}")
        return entry

    def to_json(self) -> dict[str, Any]:
        """The entry as its JSON object, keys in RLinf's order."""
        return {key: self[key] for key in ENTRY_KEYS}

    def __getitem__(self, key: str) -> Any:
        if key not in ENTRY_KEYS:
            raise KeyError(key)
        value = getattr(self, key)
        return list(value) if key == "shape" else value

    def __iter__(self) -> Iterator[str]:
        return iter(ENTRY_KEYS)

    def __len__(self) -> int:
        return len(ENTRY_KEYS)


def count(value: Any) -> int:
    """``value`` (an int, or a str of one in ASCII digits) as an id, size or count:
    ``0 <= n < 2**63``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a whole number, got {value!r}")
    number = number_name(value) if isinstance(value, str) else value
    if number is None:
        raise ValueError(f"{str(value)[:40]!r} is not a whole number written in ASCII digits")
    if not 0 <= number < MAX_COUNT:
        raise ValueError(f"{value!r} is not in [0, 2**63)")
    return number
