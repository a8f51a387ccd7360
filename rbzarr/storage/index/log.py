"""IndexLog: one writer slot's trajectory index as an append-only log, compacted in the background.

A commit writes bytes in proportion to its own entries, never to the store.  Below a slot's
folder (the store's root for slot 0, ``writers/<s>`` for the others)::

    index/head.json                   counters, metadata, the blocks (rewritten at compaction)
    index/log/<seq>.json              one commit record: one burst's entries, with their time
    index/blocks/<first>-<last>.json  records first..last compacted (immutable)

The slot's list of trajectories is the blocks the head names, in order, then the records
after ``head["compacted_seq"]``.  A record is written atomically (a temporary file renamed
locally, one PUT on object stores) after the data it lists is complete, so a reader never
sees an entry without data.  Every :data:`COMPACT_RECORDS` records the writer folds the
log's tail into a block, and once the blocks after the last full one hold
:data:`SEGMENT_SIZE` entries it merges them into one; each step writes the new file first,
then the head that names it, then deletes what the head no longer names.  The head names
about ``size / SEGMENT_SIZE`` blocks (with their counts), so a reader finds any position.
A crash at any step leaves either the old head (which still names every file it needs) or
the new one; files no head names are rewritten by the next compaction or removed by
``rbzarr verify --repair``.

A reader reads the head, lists ``index/log`` (at most :data:`COMPACT_RECORDS` names), reads
those records and the blocks that cover what it wants: the last ``W`` entries
cost ``O(W + SEGMENT_SIZE)`` bytes whatever the store holds.  A file that vanished under it
(a concurrent compaction) makes it read the new head and start again.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rbzarr.errors import CorruptStoreError, StorageUnavailableError
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.io.json_limits import DocumentTooLargeError, read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import is_digits

__all__ = [
    "COMPACT_RECORDS",
    "INDEX_DIR",
    "SEGMENT_SIZE",
    "IndexLog",
    "LogEntry",
    "SlotIndex",
    "has_log",
    "read_slot_index",
    "read_slot_metadata",
]

INDEX_DIR = "index"
HEAD_FILE = "head.json"
RECORDS = "log"
BLOCKS = "blocks"
HEAD_VERSION = 1
# Records the writer lets pile up before it compacts them into a block.
COMPACT_RECORDS = 16
# Entries of a full block (at least: a merge takes every block after the last full one).
SEGMENT_SIZE = 1024
# Attempts of a reader that keeps losing files to concurrent compactions.
READ_ATTEMPTS = 8


class LogGapError(FileNotFoundError):
    """A record missing between the head's last and the next present one."""


# An index entry with its commit time (seconds since the epoch).
LogEntry = tuple[dict[str, Any], float]


@dataclass
class SlotIndex:
    """What a reader learnt of one slot: counters, metadata, and the entries it asked for.

    Parameters
    ----------
    size, total_samples, trajectory_counter
        The slot's counters (over every entry, read or not).
    max_rows
        The largest ``T * B`` of its entries.
    metadata
        The slot's latest ``metadata.json`` keys.
    begun
        Whether the slot has a head or a complete record (a writer whose first record is
        still on its way has made the log's folder and nothing else).
    entries
        The entries read (the last ones, or all), oldest first, each with its commit time.
    """

    size: int = 0
    total_samples: int = 0
    trajectory_counter: int = 0
    max_rows: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    begun: bool = False
    entries: list[LogEntry] = field(default_factory=list)

    @property
    def is_complete(self) -> bool:
        """Whether every entry of the slot was read."""
        return len(self.entries) == self.size


def has_log(location: Location) -> bool:
    """Whether the slot at ``location`` keeps its index as a log."""
    return bool(location.list_names(INDEX_DIR))  # one listing (an exists is two on S3)


def read_slot_index(location: Location, last: int | None = None) -> SlotIndex:
    """Read the slot's counters and its last ``last`` entries (all of them for ``None``).

    Raises
    ------
    CorruptStoreError
        A head, record or block is malformed, or one the head names is missing.
    StorageUnavailableError
        The backend failed.
    """
    for _ in range(READ_ATTEMPTS - 1):
        try:
            return _read_once(location, last)
        except FileNotFoundError:
            continue  # a compaction replaced what the head named: read the new head
    try:
        return _read_once(location, last)
    except FileNotFoundError as exc:
        raise CorruptStoreError(f"{location.url}/{INDEX_DIR}: {exc}") from exc


def read_slot_metadata(location: Location) -> dict[str, Any] | None:
    """The slot's ``metadata.json`` keys: the head's (one read), or the log's before its
    first compaction; ``None`` before its first record is complete.

    Raises
    ------
    CorruptStoreError
        The head or a record is malformed.
    StorageUnavailableError
        The backend failed.
    """
    try:
        raw = location.read_bytes(INDEX_DIR, HEAD_FILE)
    except FileNotFoundError:
        state = read_slot_index(location, last=0)
        return state.metadata if state.begun else None
    return dict(_parse_head(raw, f"{location.url}/{INDEX_DIR}/{HEAD_FILE}")["metadata"])


def _read_once(location: Location, last: int | None) -> SlotIndex:
    raw = _head_bytes(location)
    head = _head_from(location, raw)
    records = _read_records(location, head)
    if not records and _head_bytes(location) != raw:
        # No record after the head: a compaction may have deleted them between the head's
        # read and the listing (a non-empty listing shows such a gap itself).
        raise LogGapError(f"{location.url}/{INDEX_DIR}: the head changed during the read")
    state = SlotIndex(
        size=head["size"],
        total_samples=head["total_samples"],
        trajectory_counter=head["trajectory_counter"],
        max_rows=head["max_rows"],
        metadata=dict(head["metadata"]),
        begun=raw is not None or bool(records),
    )
    tail: list[LogEntry] = []
    for record in records:
        state.metadata.update(record.get("metadata") or {})
        _count_record(state, record)
        tail.extend((entry, record["time"]) for entry in record["entries"])
    state.entries = _last_entries(location, head["blocks"], tail, state.size, last)
    return state


def _last_entries(
    location: Location,
    blocks: Sequence[Sequence[Any]],
    tail: list[LogEntry],
    size: int,
    last: int | None,
    check: bool = True,
) -> list[LogEntry]:
    """The last ``last`` of a slot's ``size`` entries (all for ``None``): ``tail``, after
    the named ``blocks`` read from the newest back as far as needed; each checked unless
    ``check`` is false (a caller that parses them all next)."""
    want = size if last is None else min(last, size)
    parts: list[list[LogEntry]] = [tail]
    have = len(tail)
    for name, count in reversed(blocks):
        if have >= want:
            break
        parts.append(_read_block(location, name, count))
        have += count
    if have < want:
        raise CorruptStoreError(
            f"{location.url}/{INDEX_DIR}: the head counts {size} entries, its blocks and "
            f"records hold {have}; run `rbzarr verify --repair`"
        )
    entries = [item for part in reversed(parts) for item in part]
    window = entries[len(entries) - want :] if want else []
    for entry, _ in window if check else ():  # only what is handed out, entry by entry
        IndexEntry.parse(entry, f"{location.url}/{INDEX_DIR}")
    return window


class IndexLog:
    """The writer's side of one slot's log: append commit records, compact them.

    Only the holder of the slot's claim writes it.  Reading the current state costs the
    head, the log's tail and the blocks after the last full one (full ones are never read
    back).

    Parameters
    ----------
    location
        The slot's folder; a durable one (``Location.with_durable``) makes each record and
        each compacted file reach the disk before it counts.
    """

    def __init__(self, location: Location) -> None:
        self.location = location
        for attempt in range(READ_ATTEMPTS):
            try:
                self._head = _read_head(location)
                self._records = _read_records(location, self._head)
                self._open = [_read_block(location, *b) for b in _open_blocks(self._head)]
                break
            except FileNotFoundError as exc:
                if attempt == READ_ATTEMPTS - 1:
                    raise CorruptStoreError(f"{location.url}/{INDEX_DIR}: {exc}") from exc
        state = SlotIndex(
            self._head["size"],
            self._head["total_samples"],
            self._head["trajectory_counter"],
            self._head["max_rows"],
        )
        self.metadata: dict[str, Any] = dict(self._head["metadata"])
        for record in self._records:
            self.metadata.update(record.get("metadata") or {})
            _count_record(state, record)
        self._state = state
        self._next_seq = max(
            [self._head["compacted_seq"], *(r["seq"] for r in self._records)], default=-1
        )
        self._next_seq += 1
        self._written_metadata = dict(self.metadata)
        self._fold_due = False  # a compaction failed: the next append, flush or close retries
        self._unsure = False  # a record write failed: it may have been written all the same
        self._garbage: list[tuple[str, ...]] = []  # files a head no longer names, not deleted

    @classmethod
    def for_repair(cls, location: Location) -> IndexLog:
        """A writer of a log that may not read (only :meth:`rewrite` is meant to follow)."""
        log = cls.__new__(cls)
        log.location = location
        log._head = _empty_head()
        log._records = []
        log._open = []
        log._state = SlotIndex()
        log.metadata = {}
        log._written_metadata = {}
        log._fold_due = False
        log._unsure = False
        log._garbage = []
        seqs = [-1]
        for name in location.list_files(INDEX_DIR) if has_log(location) else []:
            digits = [
                int(p)
                for p in name.replace(".json", "").replace("/", "-").split("-")
                if is_digits(p)
            ]
            seqs.extend(digits)
        log._next_seq = max(seqs) + 1
        return log

    @property
    def size(self) -> int:
        """Entries the slot lists."""
        return self._state.size

    @property
    def total_samples(self) -> int:
        """Samples over the slot's entries."""
        return self._state.total_samples

    @property
    def trajectory_counter(self) -> int:
        """The slot's counter (above every id it committed)."""
        return self._state.trajectory_counter

    @property
    def max_rows(self) -> int:
        """The largest ``T * B`` the slot committed."""
        return self._state.max_rows

    def read(self, last: int | None = None, check: bool = True) -> SlotIndex:
        """The slot's counters and its last ``last`` entries (all for ``None``), as
        :func:`read_slot_index` reads them, from what this writer holds: only the blocks
        before its open ones are read (only it writes the slot).  ``check=False`` leaves
        the entries unchecked, for a caller that parses every one next.

        Raises
        ------
        CorruptStoreError
            A block is malformed or missing.
        """
        if self._unsure:
            return read_slot_index(self.location, last)  # a record it may have written
        state = SlotIndex(
            self._state.size,
            self._state.total_samples,
            self._state.trajectory_counter,
            self._state.max_rows,
            dict(self.metadata),
            begun=not self.is_empty(),
        )
        held = [*self._open, [(e, r["time"]) for r in self._records for e in r["entries"]]]
        tail = [item for block in held for item in block]
        stored = self._head["blocks"][: len(self._head["blocks"]) - len(self._open)]
        try:
            state.entries = _last_entries(self.location, stored, tail, state.size, last, check)
        except FileNotFoundError as exc:
            raise CorruptStoreError(f"{self.location.url}/{INDEX_DIR}: {exc}") from exc
        return state

    def is_empty(self) -> bool:
        """Whether nothing was ever committed to the slot (not even an empty claim)."""
        return self._next_seq == 0

    def append(
        self,
        entries: Sequence[Mapping[str, Any]],
        *,
        counter: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Commit ``entries`` (their data complete) as one record; compact when it is time.

        A record whose write failed may still have been written (a reply lost on the way
        back): the next append reads it first, counts it, and leaves out the entries it
        lists, so a retry neither overwrites nor repeats it.
        """
        listed = self._settle()
        kept = [dict(e) for e in entries if int(e["trajectory_id"]) not in listed]
        changed = {k: v for k, v in (metadata or {}).items() if self._written_metadata.get(k) != v}
        if entries and not kept and not changed:
            return  # the failed write had committed them all
        record: dict[str, Any] = {
            "seq": self._next_seq,
            "time": time.time(),
            "counter": int(counter),
            "entries": kept,
        }
        if changed:
            record["metadata"] = changed
        self._unsure = True
        self._write(_dump(record), RECORDS, _record_name(self._next_seq))
        self._unsure = False
        self._adopt(record)
        self._after_append(bool(changed))

    def _settle(self) -> set[int]:
        """After a failed record write: adopt the record if it was written after all; the
        ids it lists (none if it was not written)."""
        if not self._unsure:
            return set()
        seq = self._next_seq
        where = f"{self.location.url}/{INDEX_DIR}/{RECORDS}/{_record_name(seq)}"
        try:
            raw = self.location.read_bytes(INDEX_DIR, RECORDS, _record_name(seq))
        except FileNotFoundError:
            self._unsure = False
            return set()
        record = _check_record(_load(raw, where), seq, where)
        self._unsure = False
        self._adopt(record)
        return {int(e["trajectory_id"]) for e in record["entries"]}

    def _adopt(self, record: dict[str, Any]) -> None:
        """Count a written record into this writer's state."""
        changed = dict(record.get("metadata") or {})
        self._next_seq += 1
        self._written_metadata.update(changed)
        self.metadata.update(changed)
        self._records.append(record)
        _count_record(self._state, record)
        if changed:
            self._fold_due = True

    def _after_append(self, changed: bool) -> None:
        """The record is written: the entries are committed, whatever compaction does next.
        A change of metadata is compacted at once: readers of the metadata read the head."""
        if changed or self._fold_due or len(self._records) >= COMPACT_RECORDS:
            self._fold_due = True
            self.compact_if_due()

    @property
    def compaction_due(self) -> bool:
        """Whether a compaction failed and waits for :meth:`compact_if_due`."""
        return self._fold_due or bool(self._garbage)

    def compact_if_due(self) -> None:
        """Retry a compaction that failed; a failure again leaves it for the next call."""
        if not self.compaction_due:
            return
        try:
            self.compact()
        except StorageUnavailableError:
            return  # every entry is in a record already: only the compaction waits

    def rewrite(
        self, entries: Sequence[LogEntry], *, counter: int, metadata: Mapping[str, Any]
    ) -> None:
        """Replace the slot's whole list by ``entries`` (an upgrade from an earlier store's
        ``trajectory_index.json``, or a repair); no data moves.

        The new blocks get names no earlier head used; the head is written after them, so a
        crash before it leaves the earlier list in charge.
        """
        self._settle()  # a record whose write failed may be there: it is replaced too
        items = list(entries)
        old = _own_files(self.location)
        blocks = []
        for start in range(0, max(len(items), 1), SEGMENT_SIZE):
            block = items[start : start + SEGMENT_SIZE]
            name = _block_name(self._next_seq, self._next_seq)
            self._next_seq += 1
            if block:
                self._write(_dump_block(block, metadata), BLOCKS, f"{name}.json")
                blocks.append([name, len(block)])
        record = {"entries": [e for e, _ in items], "counter": int(counter)}
        self._state = SlotIndex()
        _count_record(self._state, record)
        self.metadata = dict(metadata)
        self._written_metadata = dict(metadata)
        self._head = {
            **_empty_head(),
            "compacted_seq": self._next_seq - 1,
            "blocks": blocks,
            "size": self._state.size,
            "total_samples": self._state.total_samples,
            "trajectory_counter": self._state.trajectory_counter,
            "max_rows": self._state.max_rows,
            "metadata": dict(metadata),
        }
        self._write(_dump(self._head), HEAD_FILE)
        self._records = []
        rest = items[(len(items) // SEGMENT_SIZE) * SEGMENT_SIZE :]
        self._open = [rest] if rest else []
        self._fold_due = False
        self._garbage = [tuple(n.split("/")) for n in old - named_files(self.location)]
        self._delete_garbage()

    def compact(self) -> None:
        """Fold the log's tail into a block (merging the blocks after the last full one with
        it once they hold :data:`SEGMENT_SIZE` entries)."""
        self._settle()
        self._fold_due = bool(self._records)
        self._delete_garbage()
        if not self._records:
            return
        first, last = self._records[0]["seq"], self._records[-1]["seq"]
        block = [(e, r["time"]) for r in self._records for e in r["entries"]]
        head = {
            **self._head,
            "metadata": dict(self.metadata),
            "compacted_seq": last,
            "size": self._state.size,
            "total_samples": self._state.total_samples,
            "trajectory_counter": self._state.trajectory_counter,
            "max_rows": self._state.max_rows,
        }
        name = _block_name(first, last)
        full = [b for b in self._head["blocks"] if b[1] >= SEGMENT_SIZE]
        opened = self._head["blocks"][len(full) :]
        dropped: list[str] = []
        # Each step is idempotent: a failure leaves this object as it was, and the retry
        # writes the same files again.
        if not block:
            head["blocks"] = list(self._head["blocks"])  # records of no entries: nothing to keep
            still_open = self._open
        elif sum(len(b) for b in self._open) + len(block) >= SEGMENT_SIZE and opened:
            # Merge the blocks after the last full one with this one into one full block.
            merged = [item for b in self._open for item in b] + block
            name = _block_name(int(opened[0][0].split("-")[0]), last)
            self._write(_dump_block(merged, self.metadata), BLOCKS, f"{name}.json")
            head["blocks"] = [*full, [name, len(merged)]]
            dropped = [n for n, _ in opened]
            still_open = []
        else:
            self._write(_dump_block(block, self.metadata), BLOCKS, f"{name}.json")
            head["blocks"] = [*self._head["blocks"], [name, len(block)]]
            still_open = [] if len(block) >= SEGMENT_SIZE else [*self._open, block]
        self._write(_dump(head), HEAD_FILE)
        self._open = still_open
        self._garbage.extend((RECORDS, _record_name(r["seq"])) for r in self._records)
        self._garbage.extend((BLOCKS, f"{n}.json") for n in dropped)
        self._head = head
        self._records = []
        self._fold_due = False
        # The new head names everything a reader needs: what it dropped goes.
        self._delete_garbage()

    def _delete_garbage(self) -> None:
        """Delete the files no head names any more (the oldest first; a failure keeps the rest)."""
        while self._garbage:
            self.location.delete(INDEX_DIR, *self._garbage[0])
            self._garbage.pop(0)

    def _write(self, data: bytes, *names: str) -> None:
        self.location.write_bytes(data, INDEX_DIR, *names)


def salvage(location: Location) -> tuple[list[LogEntry], int, dict[str, Any]]:
    """What still reads of a damaged log: the entries of the head's readable blocks and of
    the records up to the first unreadable one, the counter and the metadata."""
    try:
        raw = _head_bytes(location)
        if raw is None:
            raise CorruptStoreError(f"{location.url}/{INDEX_DIR}/{HEAD_FILE} is missing")
        head = _parse_head(raw, f"{location.url}/{INDEX_DIR}/{HEAD_FILE}")
        blocks = [(name, count) for name, count in head["blocks"]]
    except CorruptStoreError:
        # No head: the blocks found, each range once (the widest first), and the blocks' or
        # the mirror's metadata (the store's format and schema), never nothing.
        blocks = [(name, None) for name in _found_blocks(location)]
        head = {**_empty_head(), "metadata": _lost_metadata(location, [n for n, _ in blocks])}
        if blocks:
            head["compacted_seq"] = int(blocks[-1][0].split("-")[1])
    entries: list[LogEntry] = []
    for name, count in blocks:
        try:
            entries.extend(_read_block(location, name, count))
        except (CorruptStoreError, FileNotFoundError):
            continue
    counter = head["trajectory_counter"]
    metadata = dict(head["metadata"])
    names = location.list_names(INDEX_DIR, RECORDS)
    for seq in sorted(int(n[:12]) for n in names if _is_record_name(n)):
        if seq <= head["compacted_seq"]:
            continue
        where = f"{location.url}/{INDEX_DIR}/{RECORDS}/{_record_name(seq)}"
        try:
            raw = location.read_bytes(INDEX_DIR, RECORDS, _record_name(seq))
            record = _check_record(_load(raw, where), seq, where)
        except (CorruptStoreError, FileNotFoundError):
            break
        metadata.update(record.get("metadata") or {})
        counter = max(counter, record["counter"])
        entries.extend((e, record["time"]) for e in record["entries"])
    seen: set[int] = set()
    unique = []
    for entry, when in entries:
        try:
            IndexEntry.parse(entry, location.url)
        except CorruptStoreError:
            continue  # a damaged entry: its trajectory's group lists it again (verify)
        if entry["trajectory_id"] not in seen:
            seen.add(entry["trajectory_id"])
            unique.append((entry, when))
    counter = max([counter, *(e["trajectory_id"] + 1 for e, _ in unique)])
    return unique, counter, metadata


def _found_blocks(location: Location) -> list[str]:
    """The block files present, covering each range of records once, in order."""
    names = [n.removesuffix(".json") for n in location.list_names(INDEX_DIR, BLOCKS)]
    ranges = sorted(
        (int(first), -int(last), name)
        for name in names
        if _is_block([name, 1])
        for first, last in [name.split("-")]
    )
    chosen, covered = [], -1
    for first, negative_last, name in ranges:
        if first > covered:
            chosen.append(name)
            covered = -negative_last
    return chosen


def _lost_metadata(location: Location, blocks: list[str]) -> dict[str, Any]:
    """The metadata of a slot whose head is lost: the newest block's that reads, else the
    mirror ``metadata.json``'s (without counters), else none."""
    for name in reversed(blocks):
        where = f"{location.url}/{INDEX_DIR}/{BLOCKS}/{name}.json"
        try:
            metadata = _load(location.read_bytes(INDEX_DIR, BLOCKS, f"{name}.json"), where)
        except (CorruptStoreError, FileNotFoundError):
            continue
        if isinstance(metadata.get("metadata"), dict):
            return dict(metadata["metadata"])
    try:
        metadata = _load(location.read_bytes("metadata.json"), f"{location.url}/metadata.json")
    except (CorruptStoreError, FileNotFoundError):
        return {}
    return {
        k: v
        for k, v in metadata.items()
        if k not in {"size", "total_samples", "trajectory_counter", "layout_version"}
    }


def named_files(location: Location) -> set[str]:
    """The files below ``index/`` that the slot's head and log name (for ``verify``)."""
    head = _read_head(location)
    names = {HEAD_FILE} if location.exists(INDEX_DIR, HEAD_FILE) else set()
    names.update(f"{BLOCKS}/{n}.json" for n, _ in head["blocks"])
    names.update(f"{RECORDS}/{_record_name(r['seq'])}" for r in _read_records(location, head))
    return names


def _own_files(location: Location) -> set[str]:
    """The files below ``index/`` that an index log writes (``/``-joined below it)."""
    if not has_log(location):
        return set()
    found = set()
    for name in location.list_files(INDEX_DIR):
        folder, _, leaf = name.rpartition("/")
        if (
            (folder == "" and leaf == HEAD_FILE)
            or (folder == RECORDS and _is_record_name(leaf))
            or (folder == BLOCKS and _is_block([leaf.removesuffix(".json"), 1]))
        ):
            found.add(name)
    return found


def _is_record_name(name: str) -> bool:
    return len(name) == 17 and name.endswith(".json") and is_digits(name[:12], 12)


def _open_blocks(head: Mapping[str, Any]) -> list[list[Any]]:
    """The head's blocks after its last full one."""
    blocks = head["blocks"]
    full = 0
    for position, (_, count) in enumerate(blocks):
        if count >= SEGMENT_SIZE:
            full = position + 1
    return blocks[full:]


def _block_name(first: int, last: int) -> str:
    return f"{first:012d}-{last:012d}"


def _count_record(state: SlotIndex, record: Mapping[str, Any]) -> None:
    """Add a record's entries to ``state``'s counters."""
    entries = record["entries"]
    state.size += len(entries)
    state.total_samples += sum(int(e["num_samples"]) for e in entries)
    state.trajectory_counter = max(state.trajectory_counter, record["counter"])
    rows = (int(e["shape"][0]) * int(e["shape"][1]) for e in entries)
    state.max_rows = max(state.max_rows, *rows, 0)


def _record_name(seq: int) -> str:
    return f"{seq:012d}.json"


def _empty_head() -> dict[str, Any]:
    return {
        "version": HEAD_VERSION,
        "compacted_seq": -1,
        "blocks": [],
        "size": 0,
        "total_samples": 0,
        "trajectory_counter": 0,
        "max_rows": 0,
        "metadata": {},
    }


def _head_bytes(location: Location) -> bytes | None:
    """The head's bytes, ``None`` when it does not exist."""
    try:
        return location.read_bytes(INDEX_DIR, HEAD_FILE)
    except FileNotFoundError:
        return None


def _read_head(location: Location) -> dict[str, Any]:
    """The slot's head (an empty one before the first compaction)."""
    return _head_from(location, _head_bytes(location))


def _head_from(location: Location, raw: bytes | None) -> dict[str, Any]:
    """The head of ``raw`` (its bytes, ``None`` for a missing head).

    A missing head with blocks present is damage unless the first record is still there
    (the first compaction is under way or failed): a compaction writes the head before it
    deletes any record.
    """
    where = f"{location.url}/{INDEX_DIR}/{HEAD_FILE}"
    if raw is None:
        if location.list_names(INDEX_DIR, BLOCKS) and _record_name(0) not in (
            location.list_names(INDEX_DIR, RECORDS)
        ):
            raise CorruptStoreError(
                f"{where} is missing but the log has compacted blocks: run "
                "`rbzarr verify --repair` to rebuild it"
            )
        return _empty_head()
    return _parse_head(raw, where)


def _parse_head(raw: bytes, where: str) -> dict[str, Any]:
    """A head's checked contents."""
    head = _load(raw, where)
    try:
        version = head["version"]
        if not isinstance(version, int) or version > HEAD_VERSION:
            raise CorruptStoreError(
                f"{where}: index version {version!r} is newer than this rbzarr understands "
                f"({HEAD_VERSION}); upgrade rbzarr"
            )
        checked = {
            "compacted_seq": _count(head["compacted_seq"], where, "compacted_seq", low=-1),
            "size": _count(head["size"], where, "size"),
            "total_samples": _count(head["total_samples"], where, "total_samples"),
            "trajectory_counter": _count(head["trajectory_counter"], where, "trajectory_counter"),
            "max_rows": _count(head.get("max_rows", 0), where, "max_rows"),
        }
        blocks = head["blocks"]
        metadata = head["metadata"]
    except KeyError as exc:
        raise CorruptStoreError(f"{where}: missing {exc}") from exc
    if not isinstance(blocks, list) or not all(_is_block(b) for b in blocks):
        raise CorruptStoreError(f"{where}: malformed 'blocks'")
    # Each block holds records first..last, after the one before it: a block named twice
    # (or out of order) would be read twice, and a head may name it 100,000 times.
    ranges = [[int(part) for part in name.split("-")] for name, _ in blocks]
    if any(first > last for first, last in ranges) or any(
        earlier[1] >= later[0] for earlier, later in itertools.pairwise(ranges)
    ):
        raise CorruptStoreError(
            f"{where}: 'blocks' must name distinct blocks of records in order; a block is "
            "named twice or out of order"
        )
    if not isinstance(metadata, dict):
        raise CorruptStoreError(f"{where}: 'metadata' is not an object")
    if sum(b[1] for b in blocks) > checked["size"]:
        raise CorruptStoreError(f"{where}: the blocks hold more entries than 'size'")
    return {**head, **checked, "blocks": [list(b) for b in blocks], "metadata": metadata}


def _read_records(location: Location, head: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The records after the head's ``compacted_seq``, in order (a gap is corruption)."""
    names = location.list_names(INDEX_DIR, RECORDS)
    seqs = sorted(int(n[:12]) for n in names if _is_record_name(n))
    seqs = [s for s in seqs if s > head["compacted_seq"]]
    records = []
    expected = head["compacted_seq"] + 1
    for seq in seqs:
        where = f"{location.url}/{INDEX_DIR}/{RECORDS}/{_record_name(seq)}"
        if seq != expected:
            # A concurrent compaction deleted records the head read before it names: a
            # reader reads the new head again; a gap that stays is damage.
            raise LogGapError(
                f"{where}: the log has a gap (record {expected} is missing); run "
                "`rbzarr verify --repair` to drop the records after it"
            )
        record = _load(location.read_bytes(INDEX_DIR, RECORDS, _record_name(seq)), where)
        records.append(_check_record(record, seq, where))
        expected += 1
    return records


def _check_record(record: dict[str, Any], seq: int, where: str) -> dict[str, Any]:
    try:
        ok = record["seq"] == seq and isinstance(record["entries"], list)
        when = float(record["time"])
        counter = _count(record["counter"], where, "counter")
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"{where}: malformed commit record: {exc!r}") from exc
    if not ok or not all(isinstance(e, dict) for e in record["entries"]):
        raise CorruptStoreError(f"{where}: malformed commit record")
    if "metadata" in record and not isinstance(record["metadata"], dict):
        raise CorruptStoreError(f"{where}: 'metadata' is not an object")
    for entry in record["entries"]:
        IndexEntry.parse(entry, where)
    return {**record, "time": when, "counter": counter}


def _read_block(location: Location, name: str, count: int | None) -> list[LogEntry]:
    """A block's ``count`` entries (any number for ``None``) with their times."""
    where = f"{location.url}/{INDEX_DIR}/{BLOCKS}/{name}.json"
    block = _load(location.read_bytes(INDEX_DIR, BLOCKS, f"{name}.json"), where)
    entries, times = block.get("entries"), block.get("times")
    if not isinstance(entries, list) or not isinstance(times, list) or len(entries) != len(times):
        raise CorruptStoreError(f"{where}: malformed index block")
    if count is not None and len(entries) != count:
        raise CorruptStoreError(
            f"{where}: holds {len(entries)} entries, the head says {count}; run "
            "`rbzarr verify --repair`"
        )
    if not all(isinstance(entry, dict) for entry in entries):
        raise CorruptStoreError(f"{where}: malformed index block")
    try:
        return [(e, float(t)) for e, t in zip(entries, times, strict=True)]
    except (TypeError, ValueError) as exc:
        raise CorruptStoreError(f"{where}: malformed commit time: {exc!r}") from exc


def _count(value: Any, where: str, name: str, low: int = 0) -> int:
    """A non-negative (``>= low``) integer below 2**63, or a named error."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:
        raise CorruptStoreError(f"{where}: {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _is_block(block: Any) -> bool:
    if not isinstance(block, list) or len(block) != 2:
        return False
    name, count = block
    parts = name.split("-") if isinstance(name, str) else []
    names_ok = len(parts) == 2 and all(is_digits(p, 12) for p in parts)
    return names_ok and isinstance(count, int) and not isinstance(count, bool) and count > 0


def _load(raw: bytes, where: str) -> dict[str, Any]:
    """A JSON object of the log, bounded as every document (see ``io.json_limits``)."""
    try:
        document = read_json(raw, where)
    except DocumentTooLargeError:
        raise
    except CorruptStoreError as exc:
        raise CorruptStoreError(f"{exc} (a torn write?); run `rbzarr verify --repair`") from exc
    if not isinstance(document, dict):
        raise CorruptStoreError(f"{where}: expected a JSON object")
    return document


# One compact encoder (``json.dumps`` with arguments builds one per call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _dump(document: Mapping[str, Any]) -> bytes:
    return _COMPACT.encode(document).encode()


def _dump_block(block: Iterable[LogEntry], metadata: Mapping[str, Any]) -> bytes:
    # The metadata rides along (a few hundred bytes): a repair that lost the head keeps it.
    items = list(block)
    return _dump(
        {"entries": [e for e, _ in items], "times": [t for _, t in items], "metadata": metadata}
    )
