"""Every storage call of every operation fails in turn: nothing flushed is lost or doubled.

For each operation below, :class:`~faults.Faults` counts its storage calls, then the
operation is replayed once per (call ``k``, fault kind) on a fresh store, storage heals, the
operation's own recovery runs (``flush()`` again, ``close()`` again, the same call again),
and these invariants are checked:

- every trajectory whose ``flush()`` (or ``close()``, or load) returned is listed exactly
  once, with its data; a ``flush()`` that returned had recorded every queued trajectory;
- while the fault is being injected, no listed entry lacks its data and commit marker, and
  a reader's listing never shrinks (nor after recovery);
- ``verify`` is clean after recovery, or ``verify --repair`` makes it clean without losing a
  flushed trajectory and without changing the store's format, schema or seed.

The fast suite runs each operation with its first index write faulted; the full enumeration
(``slow``) runs every call with every kind, locally and on moto through the test proxy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_same_trajectory, make_trajectory
from faults import KINDS, Faults
from zarr.codecs import BloscCodec

from rbzarr import (
    CheckpointNotFoundError,
    CorruptStoreError,
    StorageUnavailableError,
    Trajectory,
    TrajectoryReplayBuffer,
    WriterFailedError,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.buffer.manifest import read_manifest
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.pins import StorePins
from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.storage.zarr.layout import ZarrLayout

# A close whose compaction meets the fault warns and leaves it to the next writer: expected.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*folding the index log at close failed:UserWarning"
)

# What the operation may raise while storage fails (its recovery then runs).
FAILURES = (StorageUnavailableError, WriterFailedError, OSError)
KEPT = ("trajectory_format", "schema", "seed")
SEED = 5


@dataclass
class Case:
    """One store under test and what was promised about it."""

    url: str
    options: dict[str, Any]
    faults: Faults
    added: dict[int, Trajectory] = field(default_factory=dict)
    flushed: set[int] = field(default_factory=set)
    seen: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    damaged: bool = False  # the store is damaged on purpose (a repair's input)

    def buffer(self, url: str | None = None, **kwargs: Any) -> TrajectoryReplayBuffer:
        return TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=url or self.url,
            storage_options=self.options,
            seed=SEED,
            **kwargs,
        )

    def add(self, buffer: TrajectoryReplayBuffer, count: int) -> list[int]:
        first = buffer.trajectory_counter
        trajectories = [small_trajectory(4 * (first + k)) for k in range(count)]
        buffer.add_trajectories(trajectories)
        ids = list(range(first, first + count))
        self.added.update(zip(ids, trajectories, strict=True))
        return ids

    def flushed_now(self, buffer: TrajectoryReplayBuffer, ids: list[int]) -> None:
        """``flush()`` returned: every queued trajectory must be listed already."""
        self.flushed.update(ids)
        with self.faults.outside():
            assert self.flushed <= set(self.listing())

    def listing(self) -> list[int]:
        documents = read_store_documents(Location.from_url(self.url, self.options))
        return list(documents.trajectory_index["trajectory_id_list"])

    def observe(self) -> None:
        """What a reader sees now: no duplicate, no entry without its marker, no shrink."""
        try:
            ids = self.listing()
        except CheckpointNotFoundError:
            ids = []  # nothing committed yet
        except CorruptStoreError:
            if self.damaged:
                return  # the store being repaired is damaged on purpose
            raise
        assert len(ids) == len(set(ids)), ids
        assert set(self.seen) <= set(ids), (self.seen, ids)
        location = Location.from_url(self.url, self.options)
        for trajectory_id in ids:
            assert location.exists("trajectories", str(trajectory_id), "zarr.json")
        self.seen = ids


def small_trajectory(base: int) -> Trajectory:
    """Two fields, so a write is a few storage calls (each is faulted in turn)."""
    full = make_trajectory(2, 2, base)
    return Trajectory(
        max_episode_length=2, model_weights_id="w", actions=full.actions, rewards=full.rewards
    )


def _with_store(case: Case, count: int) -> TrajectoryReplayBuffer:
    buffer = case.buffer()
    ids = case.add(buffer, count)
    buffer.flush()
    case.flushed_now(buffer, ids)
    case.metadata = {k: StoreIndex.open(_location(case)).recorded.get(k) for k in KEPT}
    case.observe()
    return buffer


def _location(case: Case) -> Location:
    return Location.from_url(case.url, case.options)


def _retry(action: Callable[[], object], tries: int = 4) -> None:
    """Run ``action`` once storage healed (it may still meet a fault the harness left)."""
    for attempt in range(tries):
        try:
            action()
            return
        except FAILURES:
            if attempt == tries - 1:
                raise


# -- the operations: prepare (no fault), act (faulted), recover (healed) ---------------------
def burst_prepare(case: Case) -> None:
    case.context["buffer"] = _with_store(case, 1)


def burst_act(case: Case) -> None:
    buffer = case.context["buffer"]
    ids = case.add(buffer, 2)
    case.context["queued"] = ids
    buffer.flush(timeout=10)
    case.flushed_now(buffer, ids)


def burst_recover(case: Case) -> None:
    buffer = case.context["buffer"]
    _retry(buffer.flush)
    case.flushed_now(buffer, case.context.get("queued", []))
    _retry(buffer.close)


def compaction_act(case: Case) -> None:
    buffer = case.context["buffer"]
    case.context["queued"] = []
    for _ in range(3):  # with COMPACT_RECORDS 2, SEGMENT_SIZE 3: compactions and a merge
        ids = case.add(buffer, 1)
        case.context["queued"] += ids
        buffer.flush(timeout=10)
        case.flushed_now(buffer, ids)


def metadata_prepare(case: Case) -> None:
    case.metadata = {"trajectory_format": "zarr", "seed": SEED}


def metadata_act(case: Case) -> None:
    # A new store: the claim, the first (empty) record, then the schema with the first add.
    case.context["buffer"] = buffer = case.buffer()
    ids = case.add(buffer, 1)
    case.context["queued"] = ids
    buffer.flush(timeout=10)
    case.flushed_now(buffer, ids)


def metadata_recover(case: Case) -> None:
    if "buffer" not in case.context:
        case.context["buffer"] = buffer = case.buffer()
        case.context["queued"] = case.add(buffer, 1)
    burst_recover(case)
    case.metadata["schema"] = StoreIndex.open(_location(case)).recorded.get("schema")


def save_prepare(case: Case) -> None:
    case.context["buffer"] = _with_store(case, 2)


def save_act(case: Case) -> None:
    case.context["buffer"].save_checkpoint(case.url + "-checkpoint", copy=True)


def save_recover(case: Case) -> None:
    buffer = case.context["buffer"]
    target = case.url + "-checkpoint"
    try:
        _check_checkpoint(case, target)  # a save that failed is no checkpoint, or a whole one
    except CheckpointNotFoundError:
        target = case.url + "-checkpoint-2"
        buffer.save_checkpoint(target, copy=True)
        _check_checkpoint(case, target)
    buffer.close()


def pin_act(case: Case) -> None:
    case.context["buffer"].save_checkpoint(case.url + "-checkpoint", copy=False)


def pin_recover(case: Case) -> None:
    """A failed pinning save left no manifest or a whole one, never one without its pin."""
    buffer = case.context["buffer"]
    target = case.url + "-checkpoint"
    if read_manifest(Location.from_url(target, case.options)) is None:
        target = case.url + "-checkpoint-2"
        _retry(lambda: buffer.save_checkpoint(target, copy=False))
    found = read_manifest(Location.from_url(target, case.options))
    assert found is not None
    pins = StorePins(_location(case)).all()
    assert found.pin_id in {pin.pin_id for pin in pins}
    for pin in pins:  # a pin of the failed save without its manifest keeps the same ids
        assert sorted(pin.ids) == sorted(case.flushed)
    _check_checkpoint(case, target)
    buffer.close()


def _check_checkpoint(case: Case, target: str) -> None:
    with case.buffer(case.url + "-reader-" + target[-1]) as reader:
        reader.load_checkpoint(target)
        assert sorted(reader._trajectory_id_list) == sorted(case.flushed)


def load_prepare(case: Case) -> None:
    source = case.url + "-source"
    with case.buffer(source) as writer:
        ids = case.add(writer, 2)
    case.context["source_ids"] = ids
    case.context["buffer"] = case.buffer()
    case.metadata = {"trajectory_format": "zarr", "seed": SEED}


def load_act(case: Case) -> None:
    case.context["buffer"].load_checkpoint(case.url + "-source")
    case.flushed.update(case.context["source_ids"])


def load_recover(case: Case) -> None:
    buffer = case.context["buffer"]
    if not case.flushed:
        _retry(lambda: buffer.load_checkpoint(case.url + "-source"))
        case.flushed.update(case.context["source_ids"])
    assert sorted(buffer._trajectory_id_list) == sorted(case.flushed)
    _retry(buffer.close)
    case.metadata["schema"] = StoreIndex.open(_location(case)).recorded.get("schema")


def close_prepare(case: Case) -> None:
    case.context["buffer"] = buffer = _with_store(case, 1)
    case.context["queued"] = case.add(buffer, 2)


def close_act(case: Case) -> None:
    case.context["buffer"].close(timeout=10)
    case.flushed.update(case.context["queued"])


def close_recover(case: Case) -> None:
    _retry(case.context["buffer"].close)
    case.flushed.update(case.context["queued"])


def repair_prepare(case: Case) -> None:
    _with_store(case, 3).close()
    case.damaged = True
    _location(case).delete(index_log.INDEX_DIR, index_log.HEAD_FILE)


def repair_act(case: Case) -> None:
    verify_store(case.url, case.options, repair=True)


def repair_recover(case: Case) -> None:
    _retry(lambda: verify_store(case.url, case.options, repair=True))
    case.damaged = False


OPERATIONS: dict[str, tuple[Callable[[Case], None], ...]] = {
    "burst": (burst_prepare, burst_act, burst_recover),
    "compaction": (burst_prepare, compaction_act, burst_recover),
    "metadata": (metadata_prepare, metadata_act, metadata_recover),
    "save_checkpoint": (save_prepare, save_act, save_recover),
    "pin": (save_prepare, pin_act, pin_recover),
    "load_checkpoint": (load_prepare, load_act, load_recover),
    "close": (close_prepare, close_act, close_recover),
    "verify_repair": (repair_prepare, repair_act, repair_recover),
}


def run_case(case: Case, operation: str, k: int | None, kind: str) -> list[str]:
    """Prepare, act with call ``k`` faulted (``None``: counted only), heal, recover, check;
    the calls the act made."""
    prepare, act, recover = OPERATIONS[operation]
    prepare(case)
    case.faults.on_fault = case.observe
    if k is None:
        case.faults.count()
    else:
        case.faults.arm(k, kind)
    try:
        act(case)
    except FAILURES:
        pass
    finally:
        case.faults.disarm()
        case.faults.on_fault = None
    calls = list(case.faults.calls)
    recover(case)
    check_after(case)
    return calls


def check_after(case: Case) -> None:
    case.observe()
    assert case.flushed <= set(case.seen)
    report = verify_store(case.url, case.options)
    if not report.ok:
        repaired = verify_store(case.url, case.options, repair=True)
        assert repaired.ok, repaired.problems
        assert verify_store(case.url, case.options).ok
    case.observe()
    assert case.flushed <= set(case.seen)
    metadata = StoreIndex.open(_location(case)).recorded
    for key, value in case.metadata.items():
        assert metadata.get(key) == value, key
    layout = layout_class("zarr")(_location(case))
    index = read_store_documents(_location(case)).trajectory_index["trajectory_index"]
    for trajectory_id in sorted(case.flushed):
        got = layout.read(index[str(trajectory_id)])
        assert_same_trajectory(got, case.added[trajectory_id])


@pytest.fixture
def small_log(monkeypatch):
    """Compactions and merges within a few commits."""
    monkeypatch.setattr(index_log, "COMPACT_RECORDS", 2)
    monkeypatch.setattr(index_log, "SEGMENT_SIZE", 3)


def enumerate_cases(
    make_case: Callable[[], Case], operation: str, kinds: tuple[str, ...], every_kind: bool = True
) -> int:
    """Run every (call, kind) of ``operation`` (``every_kind`` false: every call once, the
    kinds in turn); the number of cases run."""
    calls = len(run_case(make_case(), operation, None, "fail"))
    assert calls > 0
    if every_kind:
        cases = list(itertools.product(range(calls), kinds))
    else:
        cases = [(k, kinds[k % len(kinds)]) for k in range(calls)]
    for k, kind in cases:
        case = make_case()
        try:
            run_case(case, operation, k, kind)
        except AssertionError as exc:
            raise AssertionError(f"{operation}, call {k}, {kind}: {exc}") from exc
    return len(cases)


def local_cases(tmp_path, monkeypatch) -> Callable[[], Case]:
    faults = Faults(monkeypatch)
    counter = itertools.count()
    return lambda: Case(str(tmp_path / f"s{next(counter)}"), {}, faults)


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_the_first_failed_index_write_of_each_operation(
    operation, tmp_path, monkeypatch, small_log
):
    make_case = local_cases(tmp_path, monkeypatch)
    calls = run_case(make_case(), operation, None, "fail")
    writes = [k for k, name in enumerate(calls) if name == "write_bytes"]
    for kind in ("fail", "lost"):
        run_case(make_case(), operation, writes[0] if writes else 0, kind)


@pytest.mark.slow
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_every_call_of_each_operation_fails_in_turn(operation, tmp_path, monkeypatch, small_log):
    enumerate_cases(local_cases(tmp_path, monkeypatch), operation, KINDS)


# On S3 (each call ~10x a local one) the commit path (a burst, a compaction, a close) and a
# pinning checkpoint.
S3_OPERATIONS = ["burst", "compaction", "close", "pin"]


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("operation", S3_OPERATIONS)
def test_every_call_fails_in_turn_on_s3(operation, s3_bucket, s3_options, monkeypatch, small_log):
    faults = Faults(monkeypatch)
    counter = itertools.count()

    def make_case() -> Case:
        return Case(f"s3://{s3_bucket}/s{next(counter)}", s3_options, faults)

    # Every call once, failed before or after its work in turn (S3 calls cost ~10x local ones).
    enumerate_cases(make_case, operation, ("fail", "lost"), every_kind=False)


def _group_files(root: Path) -> dict[str, bytes]:
    """Every file below a store's ``trajectories`` folder, with its bytes."""
    folder = root / "trajectories"
    return {str(p.relative_to(root)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("path", ["shards", "zarr"])
def test_a_group_write_failing_at_any_file_leaves_none_of_its_files(tmp_path, monkeypatch, path):
    """A write that fails (any of its file writes, once) removes what it wrote of its
    group: no partial group stays for ``verify --repair``; trajectory 0's group is left
    as it was.  ``zarr``: the rewards go through zarr's own array writes."""
    codecs = {"rewards": BloscCodec(cname="lz4")} if path == "zarr" else None
    layout = ZarrLayout(Location.from_url(str(tmp_path / "s")), codecs=codecs)
    index = TrajectoryIndex()
    trajectories = [make_trajectory(4, 2, 8 * k) for k in range(2)]
    entries = [index.new_entry([4, 2], 4, "w") for _ in trajectories]
    layout.write(entries[0], trajectories[0])
    committed = _group_files(tmp_path / "s")
    faults = Faults(monkeypatch)
    faults.count()
    layout.write(entries[1], trajectories[1])
    calls = len(faults.calls)
    layout.delete(entries[1])
    assert calls > 5, faults.calls
    for k in range(calls):
        faults.arm(k, "fail")
        with pytest.raises(OSError, match="injected fault"):
            layout.write(entries[1], trajectories[1])
        faults.disarm()
        assert _group_files(tmp_path / "s") == committed, (k, faults.fired)
    layout.write(entries[1], trajectories[1])  # once storage heals, it writes whole
    assert_same_trajectory(layout.read(entries[1]), trajectories[1])
