"""The trajectory index: entries, insertion order, counters, windows and shares.

It is the in-memory form of ``trajectory_index.json`` plus the counters of
``metadata.json``.  It never touches storage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index.entry import IndexEntry, count
from rbzarr.storage.index.slots import earlier_counts
from rbzarr.storage.rlinf.documents import Documents

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMAT_VERSION",
    "TrajectoryIndex",
    "share_bounds",
]

# Version of the documents rbzarr writes; a newer one than this code knows is refused.
FORMAT_VERSION = 1


def share_bounds(count: int, rank: int, world_size: int) -> tuple[int, int]:
    """The ``[start, end)`` slice of ``count`` items that ``rank`` of ``world_size`` owns."""
    if world_size <= 0:
        raise ValueError(f"world_size must be > 0, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"local_rank must be in [0, {world_size}), got {rank}")
    # Shares differ by at most one item: the first count % world_size ranks get the extra.
    quotient, remainder = divmod(count, world_size)
    start = rank * quotient + min(rank, remainder)
    return start, start + quotient + (1 if rank < remainder else 0)


@dataclass
class TrajectoryIndex:
    """Index entries by id, their insertion order (windows and shares follow it), the counter.

    An index read from the last trajectories of a large store holds only those: ``earlier``
    and ``earlier_samples`` count the trajectories before them, which it does not hold
    (``len`` and :attr:`total_samples` include them).
    """

    entries: dict[int, IndexEntry] = field(default_factory=dict)
    id_list: list[int] = field(default_factory=list)
    trajectory_counter: int = 0
    earlier: int = 0
    earlier_samples: int = 0

    def __len__(self) -> int:
        return self.earlier + len(self.id_list)

    @property
    def total_samples(self) -> int:
        """Samples over every listed trajectory."""
        return self.earlier_samples + sum(self.entries[i].num_samples for i in self.id_list)

    @property
    def is_complete(self) -> bool:
        """Whether the index holds every trajectory it counts."""
        return self.earlier == 0

    def new_entry(
        self,
        shape: Iterable[int],
        max_episode_length: int,
        model_weights_id: str,
        uuid: str | None = None,
    ) -> IndexEntry:
        """Append an entry with the next id and a fresh uuid (or ``uuid``), and return it
        (the index holds it)."""
        entry = IndexEntry.new(
            self.trajectory_counter, shape, max_episode_length, model_weights_id, uuid
        )
        self.add_reference(entry)
        self.trajectory_counter += 1
        return entry

    def add_reference(self, entry: IndexEntry) -> None:
        """Append an entry made elsewhere as it is (its id and uuid); the counter stays."""
        self.entries[entry.trajectory_id] = entry
        self.id_list.append(entry.trajectory_id)

    def clear_earlier(self) -> None:
        """Forget the trajectories counted but not held (the index becomes what it holds)."""
        self.earlier = self.earlier_samples = 0

    def remove(self, ids: Iterable[int]) -> None:
        """Drop ``ids`` from the index (the counter stays: their ids are never reused)."""
        gone = set(ids)
        self.id_list = [i for i in self.id_list if i not in gone]
        for i in gone:
            self.entries.pop(i, None)

    def window(self, size: int) -> list[int]:
        """The last ``size`` ids, oldest first; all of them when ``size <= 0``.

        Raises
        ------
        ValueError
            The window reaches before the trajectories the index holds.
        """
        if (size <= 0 or size > len(self.id_list)) and not self.is_complete:
            raise ValueError(
                f"a window of {size} trajectories reaches past the last {len(self.id_list)} "
                "this index holds: it was opened with a smaller sample_window_size (open or "
                "load the store again with this window)"
            )
        return list(self.id_list) if size <= 0 else self.id_list[-size:]

    def sample_counts(self, ids: Iterable[int]) -> torch.Tensor:
        """``num_samples`` of each id, as an int64 tensor."""
        import torch  # noqa: PLC0415 (an index of documents loads without torch: rbzarr info)

        return torch.tensor([self.entries[i].num_samples for i in ids], dtype=torch.int64)

    def subset(self, ids: Iterable[int]) -> TrajectoryIndex:
        """An index of ``ids``' entries only (in the order given), keeping the counter."""
        ids = list(ids)
        return TrajectoryIndex(
            entries={i: self.entries[i] for i in ids},
            id_list=ids,
            trajectory_counter=self.trajectory_counter,
        )

    def share(self, rank: int, world_size: int) -> TrajectoryIndex:
        """This rank's contiguous share; its counter is ``max(id) + 1`` (0 for an empty share).

        Call it on a complete index (:attr:`is_complete`).
        """
        start, end = share_bounds(len(self.id_list), rank, world_size)
        share = self.subset(self.id_list[start:end])
        share.trajectory_counter = max(share.id_list, default=-1) + 1
        return share

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready copies: ``{"entries", "id_list", "trajectory_counter", "earlier",
        "earlier_samples"}``."""
        return {
            "entries": {str(i): entry.to_json() for i, entry in self.entries.items()},
            "id_list": list(self.id_list),
            "trajectory_counter": self.trajectory_counter,
            "earlier": self.earlier,
            "earlier_samples": self.earlier_samples,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace this index by :meth:`state_dict`'s (string or int ids); each entry is
        checked (:meth:`IndexEntry.parse`)."""
        self.entries = {
            count(i): IndexEntry.parse(entry, "a trajectory index's state", count(i))
            for i, entry in state["entries"].items()
        }
        self.id_list = [int(i) for i in state["id_list"]]
        self.trajectory_counter = int(state["trajectory_counter"])
        self.earlier = int(state.get("earlier", 0))
        self.earlier_samples = int(state.get("earlier_samples", 0))

    def to_documents(self, trajectory_format: str, extra: Mapping[str, Any]) -> Documents:
        """Both JSON documents in RLinf's schema; ``extra`` adds metadata keys.

        Raises
        ------
        ValueError
            The index does not hold every trajectory it counts.
        """
        if not self.is_complete:
            raise ValueError("an index of the last trajectories only cannot be written whole")
        metadata = {
            "trajectory_format": trajectory_format,
            "size": len(self.id_list),
            "total_samples": self.total_samples,
            "trajectory_counter": self.trajectory_counter,
            **extra,
            "rbzarr_format_version": FORMAT_VERSION,
        }
        index = {
            "trajectory_index": {str(i): self.entries[i].to_json() for i in self.id_list},
            "trajectory_id_list": list(self.id_list),
        }
        return Documents(metadata=metadata, trajectory_index=index)

    @classmethod
    def from_documents(
        cls, documents: Documents, where: str, keep_repeated_once: bool = False
    ) -> TrajectoryIndex:
        """Parse and check the documents of the store at ``where`` (named in errors); an id
        listed twice is refused, unless ``keep_repeated_once`` (``verify``'s repair)."""
        version = documents.metadata.get("rbzarr_format_version", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CorruptStoreError(
                f"{where}: format version {version!r} is newer than this rbzarr "
                f"understands ({FORMAT_VERSION}); upgrade rbzarr"
            )
        try:
            raw_entries = documents.trajectory_index["trajectory_index"]
            listed = documents.trajectory_index["trajectory_id_list"]
            if not isinstance(listed, list):
                raise TypeError(f"trajectory_id_list is a {type(listed).__name__}, not a list")
            listed_ids = [count(i) for i in listed]
            id_list = list(dict.fromkeys(listed_ids))
            raw = {count(k): v for k, v in raw_entries.items()}
            # Never below max(id) + 1: a crash between the index and the metadata write
            # leaves the metadata's counter behind, and reusing an id would overwrite data.
            counter = max(
                count(documents.metadata.get("trajectory_counter", 0)), max(id_list, default=-1) + 1
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptStoreError(f"{where}: malformed trajectory index: {exc!r}") from exc
        if len(id_list) != len(listed_ids) and not keep_repeated_once:
            repeated = sorted({i for i in listed_ids if listed_ids.count(i) > 1})
            raise CorruptStoreError(
                f"{where}: trajectory_id_list names trajectories {repeated[:10]} more than "
                "once (each must be listed once); `rbzarr verify --repair` keeps one of each"
            )
        missing = [i for i in id_list if i not in raw]
        if missing:
            raise CorruptStoreError(
                f"{where}: trajectory_id_list names ids {missing} that have no index entry"
            )
        entries = {i: IndexEntry.parse(raw[i], where, i) for i in id_list}
        earlier, earlier_samples = earlier_counts(documents.trajectory_index)
        return cls(entries, id_list, counter, earlier, earlier_samples)
